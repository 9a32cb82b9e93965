"""``swin export``: write an ONNX file (or a torch.export program) of a classifier or backbone."""

from __future__ import annotations

import sys

from ..export import SIZE_MULTIPLE, dynamic_size_range, export_onnx, export_program
from ..factory import create_model

__all__ = ["register", "cmd_export"]


def _size_range(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    try:
        low, high = (int(part) for part in text.replace("x", ",").split(","))
    except ValueError:
        raise ValueError(f"--size-range takes MIN,MAX in pixels (e.g. 128,224), got {text!r}") from None
    return low, high


def cmd_export(args) -> int:
    try:
        size_range = _size_range(args.size_range)
    except ValueError as error:
        print(f"swin export: {error}", file=sys.stderr)
        return 2
    model = create_model(args.name, pretrained=args.pretrained or False, features_only=args.features_only)
    low, high = size_range or dynamic_size_range(model)
    if args.output.endswith(".pt2"):
        import torch

        torch.export.save(export_program(model, args.max_batch, (low, high)), args.output)
    else:
        export_onnx(model, args.output, args.max_batch, (low, high), dynamic=not args.static)
    kind = "backbone" if args.features_only else "classifier"
    print(
        f"wrote {args.output}: {args.name} {kind}, batch 1..{args.max_batch}, height and width multiples of "
        f"{SIZE_MULTIPLE} in {low}..{high}" + (" (static)" if args.static else "")
    )
    return 0


def register(sub) -> None:
    p = sub.add_parser("export", help="export a classifier or backbone to ONNX (.onnx) or torch.export (.pt2)")
    p.add_argument("name", help="registered model name, e.g. swin_t")
    p.add_argument("output", help="output file: .onnx, or .pt2 for a torch.export program")
    p.add_argument("--features-only", action="store_true", help="export the multi-scale backbone")
    p.add_argument("--pretrained", help="weights to load first: a tag, a checkpoint path or a URL")
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--size-range", help="MIN,MAX height/width in pixels, multiples of 32 (default: widest valid)")
    p.add_argument("--static", action="store_true", help="fixed input shape (ONNX only)")
    p.set_defaults(func=cmd_export)
