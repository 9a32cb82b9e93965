"""``swin validate``: top-1 / top-5 of a pretrained tag (or a local checkpoint) on an ImageFolder, with the tag's
own evaluation preprocessing."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from ..factory import create_model
from ..registry import resolve_name
from ..weights import UnsafeCheckpointError, create_transform, data_config, get_entry, load_checkpoint
from ..weights.user_weights import preprocessing_for
from .argtypes import whole_number
from .described import described_model, is_described
from .predict_cmd import check_window

__all__ = [
    "IMAGE_EXTENSIONS",
    "DatasetError",
    "ImageFolder",
    "class_indices",
    "cmd_validate",
    "evaluate",
    "find_images",
    "register",
]

# What torchvision's ImageFolder reads.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
_WORDNET_ID = re.compile(r"n\d{8}")
# timm's ImageNetInfo subset whose sorted WordNet ids index a head of this many classes.
_LABEL_SETS = {1000: "imagenet-1k", 21841: "imagenet-22k"}


class DatasetError(ValueError):
    """The folder is not an ImageFolder this model can be scored on; the message says what was found."""


def _files_under(folder: Path) -> list[Path]:
    """The files anywhere under ``folder``, through linked folders too (as torchvision's ImageFolder walks:
    ``os.walk(followlinks=True)``), each real folder once (a link back up is not a loop)."""
    seen, files = set(), []
    for top, dirs, names in os.walk(folder, followlinks=True):
        real = os.path.realpath(top)
        if real in seen:
            dirs[:] = []
            continue
        seen.add(real)
        files += [Path(top, name) for name in names if os.path.isfile(os.path.join(top, name))]
    return files


def find_images(root: str | os.PathLike) -> dict[str, list[Path]]:
    """Class folder name -> its image files (sorted), for every class folder of ``root`` holding images.

    Raises:
        DatasetError: ``root`` is missing or holds no images in class folders.
    """
    root = Path(root)
    if not root.is_dir():
        raise DatasetError(f"--data {root}: no such directory")
    found = {}
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        files = sorted(p for p in _files_under(folder) if p.suffix.lower() in IMAGE_EXTENSIONS)
        if files:
            found[folder.name] = files
    if not found:
        loose = [p.name for p in root.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS]
        hint = (
            f"; the {len(loose)} images directly in it need to be in one folder per class"
            if loose
            else f" ({', '.join(IMAGE_EXTENSIONS)})"
        )
        raise DatasetError(
            f"--data {root}: no images in class folders{hint}. Expected the ImageNet val layout, "
            "DIR/<class>/<image>, with <class> a WordNet id (n01440764) or a class index (0, 1, ...)"
        )
    return found


def class_indices(
    folders: list[str], num_classes: int, labels: str | None = None, names: list[str] | None = None
) -> dict[str, int]:
    """The head's class index of each folder: one of the model's own class ``names`` (a hub repository's labels,
    first: their order is the head's), a WordNet id of the head's label set (timm's ImageNetInfo: a 1000-class
    head reads ImageNet-1k's sorted ids, a 21,841-class head ImageNet-22k's), or an integer index.

    Raises:
        DatasetError: naming every folder that maps to no class of the head.
    """
    subset, wordnet = _wordnet_ids(num_classes, labels)
    own = {name: i for i, name in enumerate(names or []) if i < num_classes}
    mapping, unmapped = {}, []
    for folder in folders:
        if folder in own:  # the model's own names first: a hub head's order is its own, not ImageNet's
            mapping[folder] = own[folder]
        elif folder in wordnet:
            mapping[folder] = wordnet[folder]
        elif folder.isdigit() and int(folder) < num_classes:
            mapping[folder] = int(folder)
        else:
            unmapped.append(folder)
    if unmapped:
        shown = ", ".join(unmapped[:10]) + (f", ... ({len(unmapped)} in all)" if len(unmapped) > 10 else "")
        accepted = f"integer class indices 0..{num_classes - 1}"
        if own:
            accepted = f"the model's class names ({', '.join(list(own)[:3])}, ...) or {accepted}"
        if wordnet:
            accepted = f"WordNet ids of {subset} (n01440764, ...) or {accepted}"
        elif any(_WORDNET_ID.fullmatch(f) for f in unmapped):
            accepted += f" (WordNet ids need a head of {' or '.join(map(str, _LABEL_SETS))} classes)"
        raise DatasetError(
            f"{len(unmapped)} class folder(s) map to no class of the {num_classes}-class head: {shown}. "
            f"Class folders must be {accepted}"
        )
    return mapping


def _wordnet_ids(num_classes: int, labels: str | None) -> tuple[str | None, dict[str, int]]:
    """The first of the tag's label set and the one for the head's size (timm's ImageNetInfo subsets) that has
    ``num_classes`` classes, and its WordNet id -> class index; (None, {}) when neither fits."""
    from timm.data import ImageNetInfo

    for subset in dict.fromkeys((labels, _LABEL_SETS.get(num_classes))):
        if not subset:
            continue
        try:
            info = ImageNetInfo(subset)
        except Exception:  # a label set this timm lacks: try the next
            continue
        if info.num_classes() == num_classes:
            return subset, {name: i for i, name in enumerate(info.label_names())}
    return None, {}


class ImageFolder(Dataset):
    """(image tensor, class index) for each file, in folder then file order."""

    def __init__(self, images: dict[str, list[Path]], mapping: dict[str, int], transform, config=None):
        self.samples = [(path, mapping[folder]) for folder, paths in images.items() for path in paths]
        self.transform = transform
        self.config = config  # the preprocessing: images its resize would blow up are refused

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        from .images import ImageTooElongatedError, UnsupportedImageError, check_resized_size, open_rgb

        path, target = self.samples[index]
        try:
            image = open_rgb(path)  # loaded and decoded here; 16-bit and float images rescaled to 8 bits
        except UnsupportedImageError as error:  # a depth with no range to map to 8 bits
            raise DatasetError(f"{path}: {error}; or remove it, and run again") from None
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
            # truncated, not an image at all, or damaged data PIL's decoders refuse (SyntaxError "broken PNG
            # file", ValueError "tile cannot extend outside image")
            raise DatasetError(f"{path}: not a readable image ({error}); remove or replace it and run again") from None
        if self.config is not None:
            try:
                check_resized_size(image, self.config, path)
            except ImageTooElongatedError as error:  # the message names the path
                raise DatasetError(f"{error}; or remove it, and run again") from None
        return self.transform(image), target


@dataclass
class _Progress:
    total: int
    enabled: bool
    start: float = 0.0

    def update(self, done: int, correct: int) -> None:
        if not self.enabled:
            return
        rate = done / max(time.perf_counter() - self.start, 1e-9)
        line = f"\rswin validate: {done}/{self.total} images, top-1 {100 * correct / done:6.2f}%, {rate:7.1f} img/s"
        sys.stderr.write(line)
        if done == self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def evaluate(
    model: nn.Module,
    loader: DataLoader,
    device: torch.device,
    bf16: bool = False,
    progress: bool = False,
) -> dict[str, int]:
    """Count top-1 and top-5 hits of ``model`` over ``loader`` (top-k with k = min(5, classes))."""
    model.eval()
    counter = _Progress(len(loader.dataset), progress, time.perf_counter())
    done = top1 = top5 = 0
    k = 5
    with torch.inference_mode():
        for images, targets in loader:
            images, targets = images.to(device), targets.to(device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                logits = model(images)
            k = min(5, logits.shape[-1])
            best = logits.float().topk(k, dim=-1).indices
            hits = best == targets[:, None]
            top1 += int(hits[:, 0].sum())
            top5 += int(hits.any(dim=-1).sum())
            done += len(targets)
            counter.update(done, top1)
    return {"num_images": done, "correct_top1": top1, "correct_top5": top5, "topk": k}


def _load(name: str, checkpoint: str | None) -> tuple[nn.Module, dict[str, Any], Any]:
    """The model in eval mode, its evaluation preprocessing, and its manifest entry (if it has one)."""
    if is_described(name):  # a timm or transformers repository: its own weights
        model = described_model(name, checkpoint, classifier=True)
        return model, data_config(model), None
    arch, _, tag = name.partition(".")
    arch = resolve_name(arch)
    if checkpoint is None:
        entry = get_entry(arch, tag or None)
        model = create_model(arch, pretrained=entry.tag, num_classes=entry.num_classes)
        return model.eval(), data_config(model), entry
    if not os.path.isfile(checkpoint):
        raise FileNotFoundError(f"--weights {checkpoint}: no such file")
    state = load_checkpoint(checkpoint)
    head = state.get("head.weight")
    if head is None:
        raise ValueError(f"--weights {checkpoint} has no classifier head (head.weight): nothing to score")
    check_window(arch, state, checkpoint)
    model = create_model(arch, pretrained=checkpoint, num_classes=head.shape[0])
    entry = get_entry(arch, tag) if tag else None  # the tag's preprocessing for a local copy of its weights
    if entry is not None:
        return model.eval(), entry.data_config(), entry
    # else the publisher's: torchvision's files with torchvision's transforms, as swin predict and export do
    layout = getattr(model, "pretrained_cfg", {}).get("layout")
    own = data_config(model)  # the head's classes and their names are the model's, not the default tag's
    published = preprocessing_for(arch, None, layout) or own
    return model.eval(), {**published, "num_classes": own["num_classes"], "labels": own.get("labels")}, None


def _device(requested: str | None) -> torch.device:
    """``--device``, checked before the model moves: a CUDA device this machine does not have is one line."""
    try:
        device = torch.device(requested or ("cuda" if torch.cuda.is_available() else "cpu"))
    except RuntimeError as error:
        raise ValueError(f"--device {requested}: not a device torch knows ({error}); use cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):  # mps, xpu, meta...: torch's own error came only after the data loaded
        raise ValueError(f"--device {requested}: swin validate runs on cpu or cuda (cuda:N); use one of those")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device {requested}: torch sees no CUDA GPU on this machine; use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"--device {requested}: only {torch.cuda.device_count()} CUDA device(s) here")
    return device


def cmd_validate(args: argparse.Namespace) -> int:
    try:
        device = _device(args.device)
        images = find_images(args.data)
        model, config, entry = _load(args.name, args.weights)
        names = model.pretrained_cfg.get("label_names")
        mapping = class_indices(list(images), model.num_classes, config.get("labels"), names)
    except (DatasetError, FileNotFoundError, ValueError, KeyError, UnsafeCheckpointError) as error:
        from .cli import _one_line

        # one line, as every command's error, and whole (an offline error ends with where to put a copy)
        print(f"swin validate: {_one_line(error, limit=4000)}", file=sys.stderr)
        return 2

    model.to(device)
    runner = model
    if args.optimize:  # the fastest inference version for this machine; bf16 weights with --bf16
        from ..optimized import optimize

        runner = optimize(model, dtype="bfloat16" if args.bf16 else "auto")
    dataset = ImageFolder(images, mapping, create_transform(config), config)
    loader = DataLoader(dataset, batch_size=args.batch_size, num_workers=args.workers, pin_memory=device.type == "cuda")
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    start = time.perf_counter()
    counts = evaluate(runner, loader, device, bf16=args.bf16 and not args.optimize, progress=progress)
    seconds = time.perf_counter() - start

    n = counts["num_images"]
    result: dict[str, Any] = {
        "model": args.name if is_described(args.name) else resolve_name(args.name.partition(".")[0]),
        "tag": entry.tag if entry else None,
        "checkpoint": args.weights,
        "weights": getattr(model, "pretrained_cfg", {}).get("file"),
        "data": os.fspath(args.data),
        "num_images": n,
        "num_class_folders": len(images),
        # folders without an image: left out (classes are mapped by folder name, so no index shifts; torchvision's
        # ImageFolder refuses them), and said
        "empty_class_folders": sorted(p.name for p in Path(args.data).iterdir() if p.is_dir() and p.name not in images),
        "num_classes": model.num_classes,
        "top1": 100.0 * counts["correct_top1"] / n,
        "top5": 100.0 * counts["correct_top5"] / n,  # top-k with k = topk (fewer than 5 classes: all of them)
        "topk": counts["topk"],
        "correct_top1": counts["correct_top1"],
        "correct_top5": counts["correct_top5"],
        "dtype": str(runner.dtype).removeprefix("torch.") if args.optimize else "bfloat16" if args.bf16 else "float32",
        "optimized": bool(args.optimize),
        "compile_seconds": round(sum(runner.compile_seconds.values()), 3) if args.optimize else None,
        "device": str(device),
        "batch_size": args.batch_size,
        "preprocessing": {
            key: (list(value) if isinstance(value, tuple) else value)
            for key, value in config.items()
            if key in ("input_size", "resize_size", "crop_pct", "crop_mode", "interpolation", "mean", "std")
        },
        "published": (
            {k: entry.metrics.get(k) for k in ("top1", "top5")}
            if entry is not None and entry.metrics.get("top1") is not None
            else None
        ),
        "seconds": round(seconds, 3),  # compiling (--optimize) included; compile_seconds says how much
        "images_per_second": round(n / max(seconds, 1e-9), 1),
    }
    if args.format == "json":
        print(json.dumps(result, indent=2))
        return 0
    k = counts["topk"]
    print(f"{result['model']}" + (f".{result['tag']}" if result["tag"] else "") + f"  ({result['weights']})")
    print(f"  data          {result['data']}: {n} images, {len(images)} class folders")
    if result["empty_class_folders"]:
        empty = result["empty_class_folders"]
        shown = ", ".join(empty[:5]) + (", ..." if len(empty) > 5 else "")
        print(f"  left out      {len(empty)} folder(s) without an image: {shown}")
    print(f"  top-1         {result['top1']:.3f}%  ({counts['correct_top1']}/{n})")
    print(f"  top-{k}         {result['top5']:.3f}%  ({counts['correct_top5']}/{n})")
    if result["published"]:
        print(f"  published     top-1 {result['published']['top1']}%, top-5 {result['published']['top5']}%")
    prep = result["preprocessing"]
    box = prep["resize_size"]
    box = "x".join(map(str, box)) if isinstance(box, list) else f"{box}x{box}"
    resize = {  # timm's crop modes (create_transform)
        "squash": f"resize to {box}, aspect ratio not kept",
        "border": f"resize to fit {box}, padded with the mean",
    }.get(prep.get("crop_mode") or "center", f"resize {prep['resize_size']}")
    print(
        f"  preprocessing {resize} ({prep['interpolation']}), center crop "
        f"{prep['input_size'][1]}x{prep['input_size'][2]}, mean {prep['mean']}, std {prep['std']}"
    )
    how = ", optimized (swin.optimize)" if args.optimize else ""
    print(f"  {result['dtype']} on {result['device']}{how}, {result['images_per_second']} images/s")
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "validate",
        help="top-1/top-5 accuracy on an ImageFolder (ImageNet val layout)",
        description="Score a pretrained tag (or a local checkpoint, or a timm or transformers repository named "
        "hf-hub:OWNER/NAME or local-dir:FOLDER) on DIR/<class>/<image>, class folders named by WordNet id (n01440764), "
        "class index or the repository's class names, with the weights' own evaluation preprocessing.",
    )
    p.add_argument(
        "name",
        help="NAME or NAME.TAG, e.g. swin_t or swin_t.ms_in22k_ft_in1k (default tag without one); or "
        "hf-hub:OWNER/NAME, local-dir:FOLDER (a timm or transformers repository: its own weights, classes and "
        "preprocessing; class folders may also be named by its class names)",
    )
    p.add_argument("--data", required=True, type=Path, help="ImageFolder root, e.g. imagenet/val")
    p.add_argument(
        "--weights",
        "--checkpoint",
        dest="weights",
        metavar="FILE",
        help="a local checkpoint (official, timm or torchvision layout) instead of the tag's download; "
        "preprocessing from TAG if given, else that of the architecture's weights published in the file's layout "
        "(torchvision's transforms for a torchvision file, the default tag's otherwise; --checkpoint: the old name)",
    )
    p.add_argument(
        "--batch-size", type=whole_number(1), default=64, metavar="N", help="images per forward pass (default 64)"
    )
    p.add_argument(
        "--workers",
        type=whole_number(0),
        default=min(8, os.cpu_count() or 1),
        metavar="N",
        help="data loading processes (0: load in the main process)",
    )
    p.add_argument("--bf16", action="store_true", help="run the model under bfloat16 autocast")
    p.add_argument(
        "--optimize",
        action="store_true",
        help="run swin.optimize's version: the dtype this machine computes fastest (bf16 weights with --bf16), "
        "compiled with frozen weights (the first batch compiles)",
    )
    p.add_argument("--device", help="cpu, cuda, cuda:1, ... (default: cuda if available)")
    p.add_argument("--format", choices=("table", "json"), default="table", help="output: table (default) or json")
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress line on stderr (default: when stderr is a terminal)",
    )
    p.set_defaults(func=cmd_validate)
