"""``swin download``, ``swin convert``, ``swin predict`` and ``swin list --pretrained``: weights from the shell."""

from __future__ import annotations

import json
import os
import sys

import torch

from ..weights import convert, detect_layout, export, manifest, safe_load
from ..weights.download import DownloadError
from ..weights.pretrained import WeightsNotFoundError, fetch

__all__ = ["cmd_download", "cmd_convert", "cmd_predict", "cmd_list_pretrained", "pretrained_rows", "register"]

_TORCH_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt", ".pkl")


def _entries_for(names: list[str]) -> list[manifest.PretrainedEntry]:
    """``swin_t`` (default tag), ``swin_t.ms_in22k``, or a shell pattern over ARCH.TAG (``'swin_b*'``)."""
    found: list[manifest.PretrainedEntry] = []
    for name in names:
        if any(c in name for c in "*?["):
            matches = manifest.list_pretrained(name)
            if not matches:
                raise KeyError(f"no pretrained checkpoint matches {name!r}; see `swin list --pretrained`")
            found += [manifest.get_entry(m) for m in matches]
        else:
            found.append(manifest.get_entry(name))
    return list({e.name: e for e in found}.values())


def pretrained_rows(pattern: str | None = None) -> list[dict]:
    rows = []
    for name in manifest.list_pretrained(pattern):
        entry = manifest.get_entry(name)
        rows.append(
            {
                "name": name,
                "default": entry.default,
                "num_classes": entry.num_classes,
                "input_size": list(entry.input_size),
                "crop_pct": entry.crop_pct,
                "interpolation": entry.interpolation,
                "top1": entry.metrics.get("top1"),
                "top5": entry.metrics.get("top5"),
                "params_m": entry.metrics.get("params_m"),
                "gflops": entry.metrics.get("gflops"),
                "cached": entry.cached_file() is not None,
                "sources": [s.resolve_url() for s in entry.sources],
            }
        )
    return rows


def cmd_list_pretrained(args) -> int:
    rows = pretrained_rows(args.pattern)
    if args.format == "json":
        print(json.dumps(rows, indent=2))
        return 0

    def metric(value, spec=".1f"):
        return "-" if value is None else format(value, spec)

    if args.format == "markdown":
        print("| checkpoint | classes | input | crop | top-1 | top-5 | params (M) | GFLOPs | cached |")
        print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        name = r["name"] + (" (default)" if r["default"] else "")
        size = f"{r['input_size'][1]}x{r['input_size'][2]}"
        cells = [
            name,
            str(r["num_classes"]),
            size,
            f"{r['crop_pct']:.3f}",
            metric(r["top1"], ".2f"),
            metric(r["top5"], ".2f"),
            metric(r["params_m"]),
            metric(r["gflops"]),
            "yes" if r["cached"] else "no",
        ]
        if args.format == "markdown":
            print("| " + " | ".join(cells) + " |")
        else:
            print(
                f"{cells[0]:<38} {cells[1]:>6} classes  {cells[2]:<8} crop {cells[3]}  top-1 {cells[4]:>6}  "
                f"top-5 {cells[5]:>6}  {cells[6]:>6}M  {cells[7]:>6} GFLOPs  cached: {cells[8]}"
            )
    return 0


def cmd_download(args) -> int:
    try:
        entries = _entries_for(args.names)
    except KeyError as error:
        print(f"swin download: {error.args[0]}", file=sys.stderr)
        return 2
    failed = 0
    for entry in entries:
        try:
            path = fetch(entry)
        except (WeightsNotFoundError, DownloadError) as error:
            print(f"swin download: {error}", file=sys.stderr)
            failed += 1
            continue
        print(f"{entry.name}: {path}")
    return 1 if failed else 0


def _write(state: dict[str, torch.Tensor], path: str, fmt: str, target: str) -> None:
    if fmt == "safetensors":
        from safetensors.torch import save_file

        tensors = {k: v.detach().contiguous().clone() for k, v in state.items()}
        save_file(tensors, path, metadata={"format": "pt", "layout": target, "written_by": "swin convert"})
    else:
        torch.save({"model": state} if target == "official" else state, path)


def cmd_convert(args) -> int:
    fmt = args.format or ("torch" if args.output.lower().endswith(_TORCH_SUFFIXES) else "safetensors")
    try:
        checkpoint = safe_load.load_file(args.input)
    except (safe_load.UnsafeCheckpointError, safe_load.CorruptCheckpointError, OSError) as error:
        print(f"swin convert: {error}", file=sys.stderr)
        return 1
    from ..weights.convert import unwrap

    source = detect_layout(unwrap(checkpoint)) if args.source == "auto" else args.source
    ours = convert(checkpoint, source=source)
    state = ours if args.to == "swin" else export(ours, target=args.to)
    _write(state, args.output, fmt, args.to)
    print(f"{args.input} ({source} layout) -> {args.output} ({args.to} layout, {fmt}, {len(state)} tensors)")
    return 0


def cmd_predict(args) -> int:
    from PIL import Image

    from ..factory import create_model
    from ..weights.data_config import class_names, create_transform, data_config

    entry = manifest.get_entry(args.model)
    pretrained = args.weights or entry.tag
    try:
        model = create_model(entry.arch, num_classes=entry.num_classes, pretrained=pretrained).eval()
    except (WeightsNotFoundError, FileNotFoundError) as error:
        print(f"swin predict: {error}", file=sys.stderr)
        return 1
    config = data_config(entry.name)
    with Image.open(args.image) as image:
        x = create_transform(config)(image.convert("RGB")).unsqueeze(0)
    with torch.inference_mode():
        probabilities = model(x).softmax(dim=-1)[0]
    top = probabilities.topk(min(args.top, probabilities.numel()))
    names = class_names(config) or []
    rows = [
        {"index": int(i), "probability": float(p), "label": names[int(i)] if int(i) < len(names) else str(int(i))}
        for p, i in zip(top.values, top.indices, strict=True)
    ]
    if args.format == "json":
        print(json.dumps({"image": os.fspath(args.image), "model": entry.name, "top": rows}, indent=2))
    else:
        print(f"{args.image} ({entry.name}):")
        for rank, row in enumerate(rows, 1):
            print(f"  {rank}. {row['probability']:7.2%}  {row['index']:>5}  {row['label']}")
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "download",
        help="fetch pretrained weights into the cache ($SWIN_HOME)",
        description="Fetch pretrained checkpoints into the cache ($SWIN_HOME, default ~/.cache/swin), trying each "
        "source of the manifest in order; prints the cached path of each.",
    )
    p.add_argument("names", nargs="+", metavar="NAME[.TAG]", help="swin_t (default tag), swin_t.ms_in22k, 'swin_b*'")
    p.set_defaults(func=cmd_download)

    p = sub.add_parser(
        "convert",
        help="rewrite a checkpoint in another layout",
        description="Read a checkpoint of any supported layout (official, timm, torchvision, transformers, "
        "mmdet; detected from its keys) and write it in the layout --to, as safetensors unless OUT ends in "
        ".pth/.pt/.bin or --format torch.",
    )
    p.add_argument("input", metavar="IN")
    p.add_argument("output", metavar="OUT")
    p.add_argument("--to", choices=("official", "timm", "swin"), default="swin", help="target layout")
    p.add_argument(
        "--from",
        dest="source",
        choices=("auto", "official", "timm", "torchvision", "transformers", "mmdet"),
        default="auto",
        help="source layout (default: detected)",
    )
    p.add_argument("--format", choices=("safetensors", "torch"), default=None)
    p.set_defaults(func=cmd_convert)

    p = sub.add_parser(
        "predict",
        help="classify an image with pretrained weights",
        description="Classify an image with ImageNet class names, preprocessing as the tag prescribes.",
    )
    p.add_argument("image", metavar="IMAGE")
    p.add_argument("--model", required=True, metavar="NAME[.TAG]", help="e.g. swin_t or swin_b.ms_in22k_ft_in1k")
    p.add_argument("--weights", default=None, help="a checkpoint file or URL instead of the tag's download")
    p.add_argument("--top", type=int, default=5)
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.set_defaults(func=cmd_predict)
