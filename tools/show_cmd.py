"""``swin show``: pictures of what the model does, drawn from its own tensors.

- ``swin show windows NAME``: one stage's regular and shifted windows, the cyclically shifted map with its
  region ids and the attention mask of one window (or, with ``--format json``, the same data).
- ``swin show attention IMAGE --model NAME[.TAG]``: where one query token's attention goes in an image,
  from the attention probabilities of a real forward pass, and the mean attention distance of every head.

Numbering: stages, blocks and heads count from 1 (``swin info`` prints "stage 1".."stage 4", as the paper);
windows and token rows/columns are indices from 0 (the positions in the json arrays). Every argument and the
output path are checked before a model is built or a checkpoint read.
"""

from __future__ import annotations

import argparse
import sys

from ..costs import parse_size
from .figure import MAX_DPI, check_figure_path, parse_dpi

__all__ = ["cmd_attention", "cmd_windows", "register"]


def _size(value: str) -> tuple[int, int]:
    try:
        return parse_size(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _query(value: str) -> tuple[int, int]:
    try:
        row, col = (int(part) for part in value.replace("x", ",").split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--query takes ROW,COL, a token of the stage's map counted from 0 (e.g. 28,28), got {value!r}"
        ) from None
    return row, col


def _nothing_to_do(command: str) -> ValueError:
    return ValueError(
        "nothing to draw: pass --out FILE.png (or .svg, .pdf) for the figure"
        + (", or --format json to print the data" if command == "windows" else "")
    )


def cmd_windows(args) -> int:
    from .show_windows import check_window_index, stage_layout, to_json

    if args.out:
        check_figure_path(args.out)
    elif args.format != "json":
        raise _nothing_to_do("windows")
    stage = stage_layout(args.name, args.img_size, args.stage, args.semantics)
    chosen = check_window_index(stage, args.window)
    if args.out:
        from .show_windows_figure import draw_windows

        draw_windows(stage, chosen, args.out, args.dpi)
    if args.format == "json":
        print(to_json(stage))
    if args.out:
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


def cmd_attention(args) -> int:
    from .show_attention import attention_view, check_request, prepare
    from .show_attention_figure import draw_attention

    if not args.out:
        raise _nothing_to_do("attention")
    check_figure_path(args.out, inputs=[p for p in (args.image, args.weights) if p])
    request = check_request(args)  # image, weights and ranges: before any checkpoint is read
    ready = prepare(request)
    view = attention_view(
        ready.model, ready.image, request.stage, request.block, request.head, request.query, ready.mean, ready.std
    )
    draw_attention(view, ready.caption, args.out, args.dpi)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def register(sub) -> None:
    show = sub.add_parser(
        "show",
        help="draw the windows, the cyclic shift, the region masks and where attention goes",
        description="Pictures drawn from the model's own tensors. Stages, blocks and heads count from 1; "
        "windows and token rows/columns from 0.",
    )
    what = show.add_subparsers(dest="what", required=True, metavar="WHAT", help="windows or attention")

    p = what.add_parser(
        "windows",
        help="regular and shifted windows, the rolled map's regions, one window's attention mask",
        description="For one stage: the token grid cut into regular windows (block 1); the shifted windows "
        "(block 2) drawn where their tokens come from; the map cyclically rolled, with the official region ids "
        "0-8 and the padding; the additive mask (0 / -100) of one window. The data is the model's own (its "
        "gather plan; the tests check the masks against the ones attention receives). Pass --out to draw, "
        "--format json to print the data, or both.",
    )
    p.add_argument("name", help="registered name or timm alias, e.g. swin_t")
    p.add_argument(
        "--img-size",
        type=_size,
        default=None,
        metavar="H[,W]",
        help="input size; the model is built for it, as `swin flops` does (default: the model's own)",
    )
    p.add_argument("--stage", type=int, default=1, metavar="S", help="stage, 1 to 4 as `swin info` (default 1)")
    p.add_argument(
        "--semantics",
        choices=("classification", "detection"),
        default="classification",
        help="padding and shift rules (default classification)",
    )
    p.add_argument(
        "--window",
        type=int,
        default=None,
        metavar="I",
        help="window whose mask is drawn, from 0, row by row (default: the last, bottom right, where all the "
        "regions meet)",
    )
    p.add_argument("--out", metavar="FILE", help="draw into FILE.png, .svg or .pdf (needs matplotlib)")
    p.add_argument("--format", choices=("json",), default=None, help="print the data as JSON on stdout")
    p.add_argument(
        "--dpi", type=parse_dpi, default=120, metavar="N", help=f"resolution of a PNG, 1..{MAX_DPI} (default 120)"
    )
    p.set_defaults(func=cmd_windows)

    p = what.add_parser(
        "attention",
        help="where one query token's attention goes in an image, and the attention distance of every head",
        description="Runs the image through the model once and reads the attention probabilities of one block "
        "(recomputed from the attention module's own inputs and weights by a forward hook, and checked to "
        "reproduce the module's output; the model's math is unchanged). Left: the image with the query's "
        "attention over the keys of its window; middle: the same row as the window's grid; right: the mean "
        "attention distance of every head of every block. Weights: NAME.TAG from the cache (`swin download "
        "NAME.TAG`), --weights FILE, or --random-weights (an untrained model, said so in the figure).",
    )
    p.add_argument("image", metavar="IMAGE", help="the image to draw the attention over (any file PIL reads)")
    p.add_argument("--model", required=True, metavar="NAME[.TAG]", help="e.g. swin_t or swin_t.ms_in1k")
    p.add_argument("--weights", metavar="FILE", default=None, help="a checkpoint file (any supported layout)")
    p.add_argument("--random-weights", action="store_true", help="use random weights (no download; the figure says so)")
    p.add_argument("--stage", type=int, default=1, metavar="S", help="stage, from 1 (default 1)")
    p.add_argument(
        "--block", type=int, default=None, metavar="B", help="block of the stage, from 1 (default: its last)"
    )
    p.add_argument(
        "--head", type=int, default=None, metavar="H", help="attention head, from 1 (default: mean of the heads)"
    )
    p.add_argument(
        "--query",
        type=_query,
        default=None,
        metavar="ROW,COL",
        help="query token in the stage's map, from 0 (default: the centre)",
    )
    p.add_argument("--out", metavar="FILE", help="draw into FILE.png, .svg or .pdf (needs matplotlib)")
    p.add_argument(
        "--dpi", type=parse_dpi, default=120, metavar="N", help=f"resolution of a PNG, 1..{MAX_DPI} (default 120)"
    )
    p.set_defaults(func=cmd_attention)
