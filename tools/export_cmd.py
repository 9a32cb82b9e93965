"""``swin export``: write an ONNX file (or a torch.export program) of a classifier or backbone."""

from __future__ import annotations

import os
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


def _check_output(path: str) -> None:
    """Refuse, before minutes of tracing, an output the command cannot write."""
    if not path.endswith((".onnx", ".pt2")):
        raise ValueError(f"output {path!r} must end in .onnx (ONNX) or .pt2 (torch.export program)")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"output folder {folder!r} does not exist; create it first")
    if not os.access(folder, os.W_OK):
        raise PermissionError(f"output folder {folder!r} is not writable")


def cmd_export(args) -> int:
    if args.weights is None and not args.random_weights:
        print(
            "swin export: no weights given: pass --weights TAG|FILE|URL (e.g. --weights ms_in1k), or "
            "--random-weights to export the architecture with random initial weights",
            file=sys.stderr,
        )
        return 2
    size_range = _size_range(args.size_range)
    _check_output(args.output)
    model = create_model(args.name, pretrained=args.weights or False, features_only=args.features_only)
    low, high = size_range or dynamic_size_range(model)
    if args.output.endswith(".pt2"):
        import torch

        torch.export.save(export_program(model, args.max_batch, (low, high)), args.output)
    else:
        export_onnx(model, args.output, args.max_batch, (low, high), dynamic=not args.static)
    kind = "backbone" if args.features_only else "classifier"
    weights = f"weights {args.weights}" if args.weights else "RANDOM weights (--random-weights)"
    print(
        f"wrote {args.output}: {args.name} {kind}, {weights}, batch 1..{args.max_batch}, height and width "
        f"multiples of {SIZE_MULTIPLE} in {low}..{high}" + (" (static)" if args.static else "")
    )
    return 0


def register(sub) -> None:
    p = sub.add_parser("export", help="export a classifier or backbone to ONNX (.onnx) or torch.export (.pt2)")
    p.add_argument("name", help="registered model name, e.g. swin_t")
    p.add_argument("output", help="output file: .onnx, or .pt2 for a torch.export program")
    p.add_argument("--features-only", action="store_true", help="export the multi-scale backbone")
    weights = p.add_mutually_exclusive_group()
    weights.add_argument(
        "--weights",
        "--pretrained",
        dest="weights",
        metavar="TAG|FILE|URL",
        help="weights to export: a pretrained tag (ms_in1k), a checkpoint file or an http(s) URL",
    )
    weights.add_argument(
        "--random-weights", action="store_true", help="export with random initial weights (for testing a pipeline)"
    )
    p.add_argument("--max-batch", type=int, default=64, help="largest batch the exported graph accepts")
    p.add_argument("--size-range", help="MIN,MAX height/width in pixels, multiples of 32 (default: widest valid)")
    p.add_argument("--static", action="store_true", help="fixed input shape (ONNX only)")
    p.set_defaults(func=cmd_export)
