"""``swin convert``: a Swin checkpoint of any supported layout rewritten in another, checked and atomic."""

from __future__ import annotations

import os
import re
import sys

import torch

from ..atomic import atomic_output, check_output
from ..weights import convert, detect_layout, export, safe_load, unwrap
from ..weights.checks import check_state
from ..weights.convert import saved_coordinates
from ..weights.layouts import LAYOUTS
from ..weights.user_weights import require_file

__all__ = ["OUTPUT_FORMATS", "cmd_convert", "register"]

# What ``swin convert`` writes, by output extension.
OUTPUT_FORMATS = {".safetensors": "safetensors", ".pt": "torch", ".pth": "torch", ".bin": "torch"}


def _output_format(path: str, requested: str | None) -> str:
    """The format of ``path`` from its extension; ``--format`` must agree with it."""
    extension = os.path.splitext(path)[1].lower()
    inferred = OUTPUT_FORMATS.get(extension)
    if inferred is None:
        known = ", ".join(OUTPUT_FORMATS)
        raise ValueError(
            f"output {path}: unknown extension {extension or '(none)'}; swin convert writes {known} "
            "(.safetensors: safetensors, the others: torch.save). For ONNX use `swin export ARCH OUT.onnx "
            "--weights CHECKPOINT`"
        )
    if requested is not None and requested != inferred:
        raise ValueError(
            f"--format {requested} contradicts the output name {path} ({extension} is written as {inferred}); "
            f"drop --format or name the output {'.safetensors' if requested == 'safetensors' else '.pth'}"
        )
    return inferred


def _carries(keys, layout: str) -> bool:
    return any(re.search(pattern, key) for pattern in LAYOUTS[layout].signature for key in keys)


def _source_layout(state: dict[str, torch.Tensor], requested: str, origin: str) -> str:
    """The layout to read ``state`` as: detected, or ``--from L`` once the keys confirm it is L."""
    detected = detect_layout(state)
    if requested == "auto" or (requested == detected and _carries(state, requested)):
        return detected
    if _carries(state, detected):
        raise ValueError(
            f"{origin}: the checkpoint looks like a {detected} checkpoint, not {requested}; pass --from {detected} "
            "or leave --from out to detect the layout"
        )
    shown = ", ".join(sorted(state)[:5])
    raise ValueError(
        f"{origin}: not a {requested} checkpoint - none of its keys matches the {requested} layout "
        f"({' or '.join(LAYOUTS[requested].signature)}); its first keys are {shown}"
    )


def _unwrap(checkpoint, use_ema: bool, origin: str) -> tuple[dict[str, torch.Tensor], str]:
    """The weights to convert and, when the checkpoint held both its EMA and its trained weights, which were
    read (``", its EMA weights model_ema; --no-ema for model"``); else ``""``."""
    try:
        state = unwrap(checkpoint, use_ema=use_ema)
    except ValueError as error:
        if use_ema or "use_ema=True" not in str(error):
            raise
        raise ValueError(f"{origin}: {str(error).replace('pass use_ema=True', 'drop --no-ema')}") from None
    if state.ema_and_trained is None:
        return state, ""
    ema, trained = state.ema_and_trained
    return state, (
        f", its EMA weights {ema}; --no-ema for {trained}" if use_ema else f", its weights {trained}, not the EMA {ema}"
    )


def _write(state: dict[str, torch.Tensor], path: str, fmt: str, target: str) -> None:
    if fmt == "safetensors":
        from safetensors.torch import save_file

        tensors = {k: v.detach().contiguous().clone() for k, v in state.items()}
        save_file(tensors, path, metadata={"format": "pt", "layout": target, "written_by": "swin convert"})
    else:
        torch.save({"model": state} if target == "official" else state, path)


def cmd_convert(args) -> int:
    """Every check that needs no tensors runs before the input is read: a bad output name costs nothing."""
    fmt = _output_format(args.output, args.format)
    require_file(args.input, "input")
    check_output(args.output, inputs=[args.input])
    state, which = _unwrap(safe_load.load_file(args.input), not args.no_ema, args.input)
    source = _source_layout(state, args.source, args.input)
    ours = convert(state, source=source)
    check_state(ours, args.input)
    if args.to == "torchvision":  # Swin V2's windows: from the coordinates tables the input saved, if it did
        ours = ours | saved_coordinates(state, source)
    out = ours if args.to == "swin" else export(ours, target=args.to)
    with atomic_output(args.output, inputs=[args.input]) as temporary:
        _write(out, temporary, fmt, args.to)
    print(f"{args.input} ({source} layout{which}) -> {args.output} ({args.to} layout, {fmt}, {len(out)} tensors)")
    _note_foreign_keys(out, state, args.to)
    return 0


_LIBRARIES = {"timm": "timm's Swin", "torchvision": "torchvision's Swin", "transformers": "transformers' Swin"}


def _note_foreign_keys(out: dict[str, torch.Tensor], state, target: str) -> None:
    """Say which kept keys the target library's model has no place for: a detector's parts beside its backbone
    (and for timm its per-stage norms, norm0..3) are written as they are, and a strict load there refuses them."""
    if target not in _LIBRARIES:
        return
    stage_norms = {k for k in out if re.match(r"norm\d+\.", k)} if target == "timm" else set()
    foreign = sorted(set(getattr(state, "passthrough", ())) | stage_norms)
    if foreign:
        groups = sorted({k.split(".", 1)[0] + ".*" for k in foreign})
        shown = ", ".join(groups[:6]) + (", ..." if len(groups) > 6 else "")
        print(
            f"note: {len(foreign)} key(s) are a detector's, kept as they are ({shown}): {_LIBRARIES[target]} has no "
            "place for them; "
            + (
                "from_pretrained leaves them out with a warning"
                if target == "transformers"
                else "load the file there with strict=False"
            ),
            file=sys.stderr,
        )


def register(sub) -> None:
    p = sub.add_parser(
        "convert",
        help="rewrite a checkpoint in another layout",
        description="Read a Swin checkpoint of any supported layout (official, timm, torchvision, transformers, "
        "mmdet; detected from its keys) and write it in the layout --to: OUT.safetensors as safetensors, "
        "OUT.pt/.pth/.bin with torch.save. The input must be a complete Swin checkpoint with finite weights; "
        "OUT is written atomically (a temporary file renamed over it), never over IN and never through a link.",
    )
    p.add_argument("input", metavar="IN", help="the checkpoint to read (.safetensors, .pth, .pt, .bin, any layout)")
    p.add_argument("output", metavar="OUT", help=f"output file: {', '.join(OUTPUT_FORMATS)}")
    p.add_argument(
        "--to",
        choices=("swin", "official", "timm", "torchvision", "transformers"),
        default="swin",
        help="target layout (default swin: ours, the official layout without derived buffers); torchvision: its "
        "module tree with its saved buffers, for load_state_dict; transformers: the names save_pretrained writes "
        "(for a folder from_pretrained reads, with its config.json: swin.save_for_transformers)",
    )
    p.add_argument(
        "--from",
        dest="source",
        choices=("auto", "official", "timm", "torchvision", "transformers", "mmdet"),
        default="auto",
        help="source layout (default: detected); refused if the keys say otherwise",
    )
    p.add_argument("--format", choices=("safetensors", "torch"), default=None, help="must agree with OUT's extension")
    p.add_argument(
        "--no-ema",
        action="store_true",
        help="of a training checkpoint that holds both, read the trained weights (state_dict, model) rather than "
        "their moving average (state_dict_ema, model_ema), which is read by default, as timm does",
    )
    p.set_defaults(func=cmd_convert)
