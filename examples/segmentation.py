"""Fine-tune UperNet on a Swin backbone for semantic segmentation, on a small dataset generated in memory.

The model is transformers' ``UperNetForSemanticSegmentation`` with this package's backbone
(``swin.segmentation.upernet``), trained with its own loss (cross-entropy plus the auxiliary head's, weight
0.4) and AdamW over ``swin.param_groups`` (no weight decay on norms, biases and position tables), as
mmsegmentation's Swin UperNet recipes. The images are noise with coloured rectangles (class 1) and discs
(class 2) on background (class 0): colours are random, so only the shapes tell the classes apart.

    python examples/segmentation.py                         # swin_t, random weights, 30 steps at 96x96: ~30 s
    python examples/segmentation.py --pretrained ms_in1k    # ImageNet weights (downloaded once)
    python examples/segmentation.py --freeze-backbone       # train the head only (frozen backbone)
    python examples/segmentation.py --model-kwargs '{"depths": [1, 1, 1, 1], "embed_dim": 24}' --size 64  # seconds

The whole backbone trains by default, as in mmsegmentation's recipes; ``--freeze-backbone`` trains the head
only (on this toy task its loss falls about as far, even over random backbone weights). The ~30 s were
measured on a 2-core AMD EPYC shared with other work, with ``--threads 1``.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import swin
from swin.segmentation import upernet

CLASSES = ("background", "rectangle", "disc")


def at_least(least: int):
    """An argparse type: a whole number >= ``least``."""

    def check(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            number = least - 1
        if number < least:
            raise argparse.ArgumentTypeError(f"expected a whole number of at least {least}, got {value!r}")
        return number

    return check


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="swin_t", help="a registered name (swin.list_models())")
    p.add_argument("--pretrained", default=None, help="backbone weights: a tag (ms_in1k), a checkpoint path or URL")
    p.add_argument("--model-kwargs", type=json.loads, default={}, help='backbone overrides, JSON: {"depths": [...]}')
    p.add_argument("--freeze-backbone", action="store_true", help="train the UperNet head only")
    p.add_argument(
        "--hidden-size", type=at_least(1), default=128, help="UperNet's width (512 in mmsegmentation's configs)"
    )
    p.add_argument("--size", type=at_least(8), default=96, help="image side in pixels (at least 8, for the shapes)")
    p.add_argument("--images", type=at_least(1), default=64, help="training images generated")
    p.add_argument("--steps", type=at_least(1), default=30, help="optimizer steps")
    # UperNet's pooling module batch-normalises 1x1 maps: in training that needs two images or more.
    p.add_argument("--batch-size", type=at_least(2), default=4)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=at_least(1), help="CPU threads (default: torch's); 1 is fastest on a busy machine")
    return p.parse_args(argv)


def make_dataset(count: int, size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` images (N, 3, size, size) in [0, 1] and label maps (N, size, size) of 1-3 shapes each."""
    images = 0.3 * torch.rand(count, 3, size, size, generator=generator)
    labels = torch.zeros(count, size, size, dtype=torch.long)
    rows = torch.arange(size).view(-1, 1)
    cols = torch.arange(size).view(1, -1)
    for i in range(count):
        for _ in range(int(torch.randint(1, 4, (), generator=generator))):
            kind = int(torch.randint(1, 3, (), generator=generator))
            half = int(torch.randint(size // 10, size // 4, (), generator=generator))
            cy, cx = (int(v) for v in torch.randint(half, size - half, (2,), generator=generator))
            if kind == 1:
                shape = ((rows - cy).abs() <= half) & ((cols - cx).abs() <= 0.6 * half)
            else:
                shape = (rows - cy) ** 2 + (cols - cx) ** 2 <= half**2
            colour = 0.3 + 0.7 * torch.rand(3, 1, 1, generator=generator)
            images[i] = torch.where(shape, colour, images[i])
            labels[i][shape] = kind
    return images, labels


def intersection_over_union(predicted: torch.Tensor, labels: torch.Tensor, classes: int) -> list[float]:
    return [
        ((predicted == c) & (labels == c)).sum().item() / max(((predicted == c) | (labels == c)).sum().item(), 1)
        for c in range(classes)
    ]


def build_model(args: argparse.Namespace) -> torch.nn.Module:
    """UperNet on the backbone ``--model``; with ``--freeze-backbone`` the backbone takes no gradient and stays
    in eval mode (no drop path) while the head trains."""
    model = upernet(
        args.model,
        id2label=dict(enumerate(CLASSES)),
        pretrained=args.pretrained or False,
        hidden_size=args.hidden_size,
        auxiliary_channels=args.hidden_size,
        **args.model_kwargs,
    )
    if args.freeze_backbone:
        model.backbone.requires_grad_(False)
    return model


def train_mode(model: torch.nn.Module, freeze_backbone: bool) -> None:
    model.train()
    if freeze_backbone:
        model.backbone.eval()


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    images, labels = make_dataset(args.images, args.size, generator)
    test_images, test_labels = make_dataset(8, args.size, generator)

    model = build_model(args)
    data = model.backbone.body.pretrained_cfg  # the backbone's preprocessing: ImageNet mean and std
    mean, std = torch.tensor(data["mean"]).view(1, 3, 1, 1), torch.tensor(data["std"]).view(1, 3, 1, 1)
    optimizer = torch.optim.AdamW(swin.param_groups(model, weight_decay=args.weight_decay, lr=args.lr))

    train_mode(model, args.freeze_backbone)
    losses = []
    start = time.perf_counter()
    for step in range(args.steps):
        batch = torch.randint(0, len(images), (args.batch_size,), generator=generator)
        output = model(pixel_values=(images[batch] - mean) / std, labels=labels[batch])
        optimizer.zero_grad(set_to_none=True)
        output.loss.backward()
        optimizer.step()
        losses.append(output.loss.item())
        print(f"step {step:4d}  loss {losses[-1]:.4f}", flush=True)
    seconds = time.perf_counter() - start

    model.eval()
    with torch.no_grad():
        predicted = model(pixel_values=(test_images - mean) / std).logits.argmax(1)
    iou = intersection_over_union(predicted, test_labels, len(CLASSES))
    accuracy = (predicted == test_labels).float().mean().item()
    print(f"{args.steps} steps in {seconds:.1f} s; held-out pixel accuracy {accuracy:.3f}, IoU per class", end=" ")
    print(", ".join(f"{name} {value:.3f}" for name, value in zip(CLASSES, iou, strict=True)))
    return {"losses": losses, "pixel_accuracy": accuracy, "iou": iou, "seconds": seconds}


if __name__ == "__main__":
    main()
