"""``swin export``: write an ONNX file (or a torch.export program) of a classifier or backbone."""

from __future__ import annotations

import os
import sys
from typing import Any

from ..atomic import atomic_output, check_output
from ..export import SIZE_MULTIPLE, check_size_ranges, export_onnx, export_program, preprocessing_metadata, static_shape
from ..factory import create_model, entry_model
from ..registry import resolve_name
from ..weights.user_weights import load_weights, preprocessing_for
from .described import described_model, is_described

__all__ = ["register", "cmd_export"]

# One range, or a range of heights and one of widths: ``MIN,MAX`` or ``HMIN,HMAX:WMIN,WMAX``.
_SYNTAX = "--size-range takes MIN,MAX or HMIN,HMAX:WMIN,WMAX (heights, then widths) in pixels"
_Range = tuple[int, int]


def _one_range(text: str, whole: str) -> _Range:
    try:
        low, high = (int(part) for part in text.replace("x", ",").split(","))
    except ValueError:
        raise ValueError(f"{_SYNTAX} (e.g. 128,224 or 128,224:128,160), got {whole!r}") from None
    return low, high


def _size_range(text: str | None, static: bool) -> _Range | tuple[_Range, _Range] | None:
    """MIN,MAX of both sides, or HMIN,HMAX:WMIN,WMAX (a model built for a rectangle has a range per axis); with
    ``--static``, S,S or H,H:W,W: the one shape."""
    if text is None:
        return None
    parts = text.split(":")
    if len(parts) > 2:
        raise ValueError(f"{_SYNTAX} (e.g. 128,224 or 128,224:128,160), got {text!r}")
    ranges = [_one_range(part, text) for part in parts]
    per_axis = len(ranges) == 2
    if static and any(low != high for low, high in ranges):
        example = ":".join(f"{high},{high}" for _, high in ranges)
        twice = "give each side its size twice" if per_axis else "give the size twice"
        raise ValueError(
            f"--static exports one size, but --size-range {text} is a range: {twice} (e.g. --size-range "
            f"{example}), or drop --static to export the range"
        )
    if all(low == high for low, high in ranges) and not static:
        raise ValueError(
            f"--size-range {text} is a single size; export it with --static (ONNX, fixed shape), or give MIN < MAX"
        )
    return (ranges[0], ranges[1]) if per_axis else ranges[0]


def _check_size_ranges(model, size_range) -> tuple[_Range, _Range]:
    """The (heights, widths) ranges of the export, checked; a refusal that names the Python API's per-axis
    spelling names the command's instead, with the model's own ranges as the example."""
    try:
        return check_size_ranges(model, size_range)
    except ValueError as error:
        python = "((min, max), (min, max))"
        if python not in str(error):
            raise
        heights, widths = check_size_ranges(model, None)
        ours = f"--size-range HMIN,HMAX:WMIN,WMAX (its default: {heights[0]},{heights[1]}:{widths[0]},{widths[1]})"
        raise ValueError(str(error).replace(python, ours)) from None


def _is_program(path: str) -> bool:
    """Whether ``path`` names a torch.export program (``.pt2``, in any case) rather than an ONNX file."""
    return path.lower().endswith(".pt2")


def _weights_named(args) -> str | None:
    """What to load: --weights, or the tag of ``NAME.TAG`` (as ``create_model(NAME.TAG, pretrained=True)``);
    None with --random-weights or when nothing names weights. A tag and a --weights naming other weights are
    refused rather than one of them silently ignored."""
    arch, dot, tag = args.name.partition(".")
    if not dot or args.random_weights:
        return args.weights
    if args.weights is None or _same_tag(args.weights, arch, tag):
        return tag
    raise ValueError(
        f"{args.name} and --weights {args.weights} name two different weights; export {args.name} without "
        f"--weights, or {arch} --weights {args.weights}"
    )


def _same_tag(weights: str, arch: str, tag: str) -> bool:
    """Whether --weights ``weights`` is ``tag`` of ``arch``, written TAG or ARCH.TAG (a timm alias works)."""
    if weights == tag:
        return True
    other, dot, other_tag = weights.partition(".")
    try:
        return bool(dot) and other_tag == tag and resolve_name(other) == resolve_name(arch)
    except KeyError:  # not an architecture's name: a file or URL
        return False


def _check_options(args) -> None:
    """Refuse, before any weights are read, options that contradict each other."""
    if args.static and _is_program(args.output):
        raise ValueError(
            "--static is for ONNX (.onnx) output only: a .pt2 program always has a dynamic batch, height and "
            "width; narrow it with --size-range MIN,MAX and --max-batch N, or write a .onnx file for a fixed shape"
        )
    if args.max_batch is not None and args.max_batch < 1:
        raise ValueError(f"--max-batch must be at least 1 (the largest batch the graph accepts), got {args.max_batch}")


def _check_output(path: str, inputs: list[str]) -> None:
    """Refuse, before minutes of tracing, an output the command cannot or must not write."""
    if not path.lower().endswith((".onnx", ".pt2")):
        raise ValueError(f"output {path!r} must end in .onnx (ONNX) or .pt2 (torch.export program)")
    check_output(path, inputs)


def _metadata(args, model, weights) -> dict[str, Any]:
    """What a runtime needs besides the graph: the weights and, when they say it, their preprocessing."""
    metadata: dict[str, Any] = {"model": resolve_name(args.name.partition(".")[0]), "weights": "random"}
    if not args.features_only:
        metadata["num_classes"] = model.num_classes
    if weights is None:
        return metadata  # random weights: no preprocessing is theirs
    from ..weights.data_config import data_config

    metadata.update(weights=os.path.basename(weights.name), layout=weights.layout)
    config = preprocessing_for(metadata["model"], weights.entry, weights.layout) or data_config(model)
    metadata.update(preprocessing_metadata(config))
    return metadata


def _shape_plan(args, name: str):
    """(max batch, size range, heights, widths) of the export, checked on the architecture alone (meta)."""
    import torch

    batch = args.max_batch or (2 if args.static else 64)
    with torch.device("meta"):  # the size range needs the architecture only, not its weights
        skeleton = create_model(name, features_only=args.features_only)
    size_range = _size_range(args.size_range, args.static)
    if args.static:  # one traced shape: any size, no range to keep inside
        static_shape(skeleton, size_range)
        return batch, size_range, None, None
    return (batch, size_range, *_check_size_ranges(skeleton, size_range))


def _write(args, model, plan, local: list[str], metadata: dict[str, Any] | None) -> None:
    import torch

    batch, size_range, _, _ = plan
    with atomic_output(args.output, local) as temporary:
        if _is_program(args.output):
            torch.export.save(export_program(model, batch, size_range), temporary)
        else:
            export_onnx(model, temporary, batch, size_range, dynamic=not args.static, metadata=metadata)


def _summary(args, model, plan, described: str) -> None:
    batch, size_range, heights, widths = plan
    kind = "backbone" if args.features_only else "classifier"
    if args.static:
        height, width = static_shape(model, size_range)  # the shape export_onnx fixes
        shape = f"static input {batch}x{model.in_chans}x{height}x{width}"
    else:
        batches = "batch 1" if batch == 1 else f"batch 1..{batch}"
        shape = f"{batches}, height and width multiples of {SIZE_MULTIPLE}"
        if heights == widths:
            shape += f" in {heights[0]}..{heights[1]}"
        else:
            shape += f", height in {heights[0]}..{heights[1]} and width in {widths[0]}..{widths[1]}"
    print(f"wrote {args.output}: {args.name} {kind}, {described}, {shape} (other heights and widths are refused)")


def _export_described(args) -> int:
    """NAME is ``hf-hub:REPO`` or ``local-dir:FOLDER``: the model its ``config.json`` describes (timm's or
    transformers'), with its own weights and their preprocessing (or --random-weights)."""
    from ..weights.data_config import data_config

    if args.weights:  # before any output check or work
        described_model(args.name, args.weights, classifier=False)
    _check_output(args.output, [])
    _check_options(args)
    plan = _shape_plan(args, args.name)
    # a headless one is no classifier: its pooled features would be written as logits
    model = described_model(args.name, None, classifier=not args.features_only, random=args.random_weights)
    metadata: dict[str, Any] = {"model": args.name, "weights": "random" if args.random_weights else args.name}
    if not args.features_only:
        metadata["num_classes"] = model.num_classes
    if not args.random_weights:
        config = data_config(model)
        metadata.update(preprocessing_metadata(config))
    _write(args, model, plan, [], None if _is_program(args.output) else metadata)
    _summary(args, model, plan, "RANDOM weights (--random-weights)" if args.random_weights else "its own weights")
    return 0


def cmd_export(args) -> int:
    if is_described(args.name):
        return _export_described(args)
    named = _weights_named(args)
    if named is None and not args.random_weights:
        print(
            "swin export: no weights given: pass --weights TAG|FILE|URL (e.g. --weights ms_in1k) or a tag in the "
            "name (swin_t.ms_in1k), or --random-weights to export the architecture with random initial weights",
            file=sys.stderr,
        )
        return 2
    local = [named] if named and os.path.isfile(named) else []
    _check_output(args.output, local)
    _check_options(args)
    plan = _shape_plan(args, args.name)

    arch = resolve_name(args.name.partition(".")[0])
    weights = load_weights(arch, named, model_for=entry_model) if named else None
    if weights is not None:  # as predict and validate: weights of another window are not this model's
        from .predict_cmd import check_window

        check_window(arch, weights.state, weights.name)
    overrides: dict[str, Any] = {}
    if weights is not None and not args.features_only:
        if weights.num_classes is None:
            raise ValueError(
                f"{weights.name} has no classifier head (head.weight); export its backbone with --features-only"
            )
        overrides["num_classes"] = weights.num_classes
    model = create_model(
        args.name, pretrained=weights.state if weights else False, features_only=args.features_only, **overrides
    )
    _write(args, model, plan, local, None if _is_program(args.output) else _metadata(args, model, weights))
    described = f"weights {weights.name}" if weights else "RANDOM weights (--random-weights)"
    if weights is None and "." in args.name and not args.features_only:  # the tag gave the head its size
        described += f" with the head of {args.name} ({model.num_classes} classes)"
    _summary(args, model, plan, described)
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "export",
        help="export a classifier or backbone to ONNX (.onnx) or torch.export (.pt2)",
        description="Export with dynamic batch, height and width. One graph serves one range of sizes (where no "
        "stage changes between one window and several); the file refuses other sizes when run, and an ONNX file "
        "carries its range and the weights' preprocessing in its metadata.",
    )
    p.add_argument(
        "name",
        help="registered model name, e.g. swin_t, or NAME.TAG (swin_t.ms_in22k): that tag's weights, or with "
        "--random-weights random ones with the tag's head size (21841 classes for ms_in22k); or hf-hub:OWNER/NAME, "
        "local-dir:FOLDER (a timm or transformers repository: its own weights and preprocessing)",
    )
    p.add_argument("output", help="output file: .onnx, or .pt2 for a torch.export program (either case)")
    p.add_argument("--features-only", action="store_true", help="export the multi-scale backbone")
    weights = p.add_mutually_exclusive_group()
    weights.add_argument(
        "--weights",
        "--pretrained",
        dest="weights",
        metavar="TAG|FILE|URL",
        help="weights to export: a pretrained tag (ms_in1k), a checkpoint file or an http(s) URL (default: the tag "
        "of NAME.TAG; other weights than that tag are refused)",
    )
    weights.add_argument(
        "--random-weights",
        action="store_true",
        help="export with random initial weights (for testing a pipeline); with NAME.TAG, the head has the tag's "
        "classes",
    )
    p.add_argument(
        "--max-batch",
        type=int,
        help="largest batch of the dynamic batch dimension (default 64; a .pt2 program refuses larger batches, an "
        "ONNX graph does not check them); with --static, its one batch (default 2)",
    )
    p.add_argument(
        "--size-range",
        metavar="MIN,MAX|HMIN,HMAX:WMIN,WMAX",
        help="heights and widths in pixels, multiples of 32: MIN,MAX for both sides, or HMIN,HMAX:WMIN,WMAX for "
        "heights and widths each (a model built for a rectangle has a range per axis); default: the widest valid "
        "range around each side of the model's img_size; a range one graph cannot serve correctly is refused; "
        "with --static, S,S or H,H:W,W: the one shape",
    )
    p.add_argument(
        "--static",
        action="store_true",
        help="fixed input shape, ONNX only: one size (--size-range S,S or H,H:W,W) and one batch (--max-batch)",
    )
    p.set_defaults(func=cmd_export)
