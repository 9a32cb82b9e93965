"""Fine-tune a Swin classifier: AdamW over ``swin.param_groups`` (no weight decay on norms, biases and position
tables; layer-wise learning-rate decay), linear warmup then cosine decay, mixed precision, and DDP when launched
with ``torchrun``.

    python examples/finetune.py --model swin_t --pretrained ms_in1k --data train/ --num-classes 10 --steps 3000
    torchrun --nproc-per-node 4 examples/finetune.py --model swin_t --pretrained ms_in1k --data train/ ...
    python examples/finetune.py --steps 20      # no --data: random images, to check the loop runs

``--output DIR`` keeps ``model.pth`` (our layout), ``metrics.json`` (what rebuilds it) and ``hf/``, the model as
a timm folder (``swin.save_for_hf``: ``create_model("local-dir:DIR/hf", pretrained=True)`` in swin or timm).

``--data`` is an ImageFolder (one folder per class; ``--num-classes`` defaults to the number of folders);
``--batch-size`` is per process. Arguments and the data are checked before a model is built, and the
model's options (``--model-kwargs``) as it is built: each problem is one line. ``--amp auto`` (the
default) autocasts to the device's fastest dtype (``swin.fastest_dtype``): bf16 where it has bf16 arithmetic,
fp16 on older CUDA devices, none (float32) elsewhere.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import sys
import time
from itertools import count
from pathlib import Path
from typing import NoReturn

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import swin

# create_model keywords the script passes from its own options: in --model-kwargs too they were given twice.
OWN_OPTIONS = {"num_classes": "--num-classes", "drop_path_rate": "--drop-path", "pretrained": "--pretrained"}
AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "off": None}


def whole_number(value: str, least: int, what: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = least - 1
    if number < least:
        raise argparse.ArgumentTypeError(f"expected a {what} whole number, got {value!r}")
    return number


def positive_int(value: str) -> int:
    return whole_number(value, 1, "positive")


def non_negative_int(value: str) -> int:
    return whole_number(value, 0, "non-negative")


def positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not 0 < number < math.inf:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value!r}")
    return number


def layer_decay(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not 0 < number <= 1:
        raise argparse.ArgumentTypeError(
            f"expected a number in (0, 1], got {value!r}: each block's rate is this times the next one's "
            "(1 disables layer-wise decay)"
        )
    return number


def model_kwargs(value: str) -> dict:
    try:
        kwargs = json.loads(value)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not valid JSON ({error}): {value!r}") from None
    if not isinstance(kwargs, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"img_size\": 384}}', got {value!r}")
    clashes = [f"pass {OWN_OPTIONS[key]} instead of {key!r}" for key in kwargs if key in OWN_OPTIONS]
    if clashes:
        raise argparse.ArgumentTypeError("; ".join(clashes))
    return kwargs


def fail(message: str) -> NoReturn:
    """Stop with one line on stderr (exit status 1), as ``argparse`` does for a bad argument."""
    raise SystemExit(f"finetune.py: error: {message}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="swin_t")
    p.add_argument("--pretrained", default=None, help="a tag (ms_in1k), NAME.TAG, a checkpoint path or URL")
    p.add_argument("--model-kwargs", type=model_kwargs, default={}, help='config overrides, JSON: {"img_size": 384}')
    p.add_argument(
        "--num-classes",
        type=positive_int,
        default=None,
        help="classes of the head (default: the class folders of --data; 10 without --data)",
    )
    p.add_argument("--data", type=Path, help="ImageFolder of training images (default: synthetic data)")
    p.add_argument("--steps", type=positive_int, default=100, help="optimizer steps")
    p.add_argument("--warmup-steps", type=non_negative_int, default=None, help="default: 5%% of --steps")
    p.add_argument("--batch-size", type=positive_int, default=32, help="per process")
    p.add_argument("--lr", type=positive_float, default=5e-4, help="peak learning rate of the head")
    p.add_argument("--min-lr", type=float, default=1e-6)
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--layer-decay", type=layer_decay, default=0.9, help="in (0, 1]; 1 disables layer-wise decay")
    p.add_argument("--drop-path", type=float, default=0.1)
    p.add_argument("--smoothing", type=float, default=0.1, help="label smoothing")
    p.add_argument("--clip-grad", type=float, default=5.0, help="max gradient norm (0: off)")
    p.add_argument(
        "--amp",
        choices=("auto", *AMP_DTYPES),
        default="auto",
        help="autocast dtype (fp16: CUDA); auto: the device's fastest (swin.fastest_dtype), off where float32",
    )
    p.add_argument("--grad-checkpointing", action="store_true")
    p.add_argument("--workers", type=non_negative_int, default=4)
    p.add_argument("--seed", type=int, default=0, help="each process seeds with --seed + its rank")
    p.add_argument("--log-every", type=positive_int, default=10)
    p.add_argument(
        "--output", type=Path, help="directory for the final weights, metrics.json and hf/ (a timm folder; rank 0)"
    )
    return p.parse_args(argv)


def setup_distributed() -> tuple[int, int, torch.device]:
    """Rank, world size and device; joins the process group when started by torchrun (WORLD_SIZE > 1)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world_size > 1:
        dist.init_process_group("nccl" if cuda else "gloo")
        return dist.get_rank(), world_size, device
    return 0, 1, device


def image_folder(args: argparse.Namespace, world_size: int):
    """The ImageFolder of ``--data`` (files listed, none read yet), checked against ``--num-classes`` and
    ``--batch-size`` before a model is built; sets ``args.num_classes`` when it was not given."""
    from torchvision.datasets import ImageFolder

    if not args.data.is_dir():
        fail(f"--data {args.data} is not a directory; give an ImageFolder (one sub-folder of images per class)")
    try:
        dataset = ImageFolder(args.data)
    except (FileNotFoundError, RuntimeError) as error:  # no class folders, or class folders without images
        fail(f"--data {args.data}: {error}")
    classes = len(dataset.classes)
    if args.num_classes is None:
        args.num_classes = classes
    elif args.num_classes != classes:
        names = ", ".join(dataset.classes[:5]) + (", ..." if classes > 5 else "")
        fail(
            f"--num-classes {args.num_classes} does not match --data {args.data}, which has {classes} class "
            f"folders ({names}); drop --num-classes (it defaults to the number of folders) or pass --num-classes "
            f"{classes}"
        )
    check_one_batch(len(dataset), args.batch_size, world_size, f"--data {args.data}")
    return dataset


def check_one_batch(images: int, batch_size: int, world_size: int, source: str) -> None:
    """Every process must get one full batch per epoch (the loader drops the last, partial one); with fewer
    images it would yield nothing and the training loop would wait for a batch forever."""
    per_process = -(-images // world_size)  # DistributedSampler pads every process to ceil(images / world)
    if per_process < batch_size:
        needed = (batch_size - 1) * world_size + 1
        fail(
            f"{source} has {images} images, fewer than one full batch: --batch-size {batch_size} per process x "
            f"world size {world_size} needs at least {needed}; lower --batch-size or add images"
        )


def seed_everything(seed: int) -> None:
    """torch, and Python's and numpy's generators: timm's random resized crop and RandAugment draw from them in
    the main process (--workers 0; the DataLoader seeds its workers from torch's)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def autocast_dtype(amp: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of ``--amp`` (None: float32); ``auto`` is the device's fastest, as bf16 autocast
    raises on CUDA devices before Ampere and is several times slower than float32 on CPUs without bf16."""
    if amp != "auto":
        return AMP_DTYPES[amp]
    fastest = swin.fastest_dtype(device)
    return None if fastest == torch.float32 else fastest


def train_transform(model: torch.nn.Module):
    """timm's training transform (random resized crop, flip, RandAugment) with the model's own preprocessing:
    interpolation, mean and std of its ``pretrained_cfg``, at the model's image size."""
    import timm.data

    config = timm.data.resolve_model_data_config(model)
    config["input_size"] = (3, *model.config.img_size)
    return timm.data.create_transform(**config, is_training=True, auto_augment="rand-m9-mstd0.5-inc1")


def training_data(args: argparse.Namespace, dataset, model: torch.nn.Module, rank: int, world_size: int) -> DataLoader:
    img_size = model.config.img_size
    if dataset is not None:
        dataset.transform = train_transform(model)
    else:
        # A small fixed pool of random images and labels: enough to watch the loss fall.
        generator = torch.Generator().manual_seed(args.seed)
        images = torch.randn(4 * args.batch_size * world_size, 3, *img_size, generator=generator)
        dataset = TensorDataset(images, torch.randint(0, args.num_classes, (len(images),), generator=generator))
    sampler = DistributedSampler(dataset, world_size, rank, seed=args.seed) if world_size > 1 else None
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        sampler=sampler,
        shuffle=sampler is None,
        num_workers=args.workers if args.data is not None else 0,
        drop_last=True,
        pin_memory=torch.cuda.is_available(),
    )
    if len(loader) == 0:  # checked before for --data; a guard for any other dataset
        check_one_batch(len(dataset), args.batch_size, world_size, "the training data")
    return loader


def batches(loader: DataLoader):
    """Endless batches, reshuffled each epoch."""
    for epoch in count():
        if isinstance(loader.sampler, DistributedSampler):
            loader.sampler.set_epoch(epoch)
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:  # an epoch without a batch: looping on would spin forever
            raise RuntimeError(f"the training data gave no batch of {loader.batch_size} (drop_last=True)")


def warmup_cosine(warmup: int, total: int, floor: float):
    """Multiplier of each group's own peak rate: linear warmup, then cosine down to ``floor``."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(total - warmup, 1)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

    return factor


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    # The data checked before any model is built, and before joining the process group (torchrun's WORLD_SIZE).
    dataset = image_folder(args, int(os.environ.get("WORLD_SIZE", "1"))) if args.data is not None else None
    rank, world_size, device = setup_distributed()
    if args.num_classes is None:
        args.num_classes = 10
    seed_everything(args.seed + rank)

    try:  # a --model-kwargs field no model takes, or a value it refuses: one line, as a bad argument
        model = swin.create_model(
            args.model,
            pretrained=args.pretrained or False,
            num_classes=args.num_classes,
            drop_path_rate=args.drop_path,
            **args.model_kwargs,
        ).to(device)
    except (TypeError, ValueError, KeyError) as error:
        fail(f"--model {args.model} --model-kwargs {json.dumps(args.model_kwargs)}: {error}")
    model.set_grad_checkpointing(args.grad_checkpointing)
    # Groups from the bare model: no decay on norms/biases/position tables, rates decaying from head to stem.
    groups = swin.param_groups(model, weight_decay=args.weight_decay, layer_decay=args.layer_decay, lr=args.lr)
    optimizer = torch.optim.AdamW(groups, betas=(0.9, 0.999), eps=1e-8)
    warmup = args.warmup_steps if args.warmup_steps is not None else max(1, args.steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(warmup, args.steps, args.min_lr / args.lr))
    bare = model
    if world_size > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)

    amp_dtype = autocast_dtype(args.amp, device)
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
    loader = training_data(args, dataset, bare, rank, world_size)

    model.train()
    losses, rates = [], []
    start = time.perf_counter()
    for step, (images, targets) in zip(range(args.steps), batches(loader), strict=False):
        images, targets = images.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=amp_dtype) if amp_dtype else contextlib.nullcontext():
            loss = F.cross_entropy(model(images), targets, label_smoothing=args.smoothing)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        if args.clip_grad > 0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad)
        scaler.step(optimizer)
        scaler.update()
        rates.append([group["lr"] for group in optimizer.param_groups])
        schedule.step()
        losses.append(loss.item())
        if rank == 0 and (step % args.log_every == 0 or step == args.steps - 1):
            print(f"step {step:5d}  loss {losses[-1]:.4f}  lr(head) {rates[-1][-1]:.2e}", flush=True)

    metrics = {
        # swin.create_model(model, num_classes=num_classes, pretrained="model.pth", **model_kwargs) rebuilds it
        "model": bare.config.name,
        "model_kwargs": args.model_kwargs,
        "num_classes": args.num_classes,
        "img_size": list(bare.config.img_size),
        "pretrained": args.pretrained,
        "amp": str(amp_dtype or torch.float32).removeprefix("torch."),
        "world_size": world_size,
        "steps": len(losses),
        "losses": losses,
        "lr": rates,
        "seconds": time.perf_counter() - start,
    }
    if rank == 0 and args.output is not None:
        if dataset is not None:  # the head's classes by name, so that predict and validate read them from the folder
            bare.pretrained_cfg = {**bare.pretrained_cfg, "label_names": list(dataset.classes)}
        args.output.mkdir(parents=True, exist_ok=True)
        torch.save(bare.state_dict(), args.output / "model.pth")
        (args.output / "metrics.json").write_text(json.dumps(metrics, indent=2))
        try:  # and as a timm folder: swin.create_model or timm.create_model("local-dir:OUTPUT/hf", pretrained=True)
            swin.save_for_hf(bare, args.output / "hf")
        except (TypeError, ValueError) as error:  # a model timm's Swin cannot build: model.pth alone
            print(f"not written as a timm folder: {error}", file=sys.stderr)
    if world_size > 1:
        dist.destroy_process_group()
    return metrics


if __name__ == "__main__":
    main()
