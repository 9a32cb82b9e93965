"""``swin flops``: what a model costs, global MSA against window attention, analytic against measured."""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from collections.abc import Sequence
from typing import Any

from ..costs import TOLERANCE, flops, parse_size
from ..registry import describe_window, resolve_name
from .argtypes import whole_number

__all__ = ["DEFAULT_SWEEP", "cmd_flops", "plot_sweep", "register", "render", "render_sweep", "sweep"]

# Image sides drawn by --plot when no --sweep is given.
DEFAULT_SWEEP = (224, 384, 512, 768, 1024)

_PLOT_HINT = 'install with pip install matplotlib (or, in a checkout, pip install -e ".[plot]")'


class _Units:
    """MACs by default; 2 x MACs with --flops. Figures print in G (10^9)."""

    def __init__(self, as_flops: bool):
        self.factor = 2 if as_flops else 1
        self.name = "FLOPs" if as_flops else "MACs"
        self.key = "flops" if as_flops else "macs"
        if as_flops:
            self.header = "Units: FLOPs = 2 x MACs (one multiply-accumulate counts as 2 FLOPs); G = 10^9."
        else:
            self.header = (
                "Units: MACs (multiply-accumulates; the Swin paper's table calls these FLOPs); G = 10^9. "
                "--flops prints 2 x MACs."
            )

    def g(self, macs: int | None, digits: int = 3) -> str:
        return "-" if macs is None else f"{macs * self.factor / 1e9:.{digits}f}"

    def value(self, macs: int | None) -> int | None:
        return None if macs is None else macs * self.factor


def _size(value: str) -> tuple[int, int]:
    try:
        return parse_size(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _sizes(value: str) -> list[tuple[int, int]]:
    """``224,512,1024`` (squares) or ``224,800x1333``."""
    try:
        sizes = [parse_size(item) for item in value.split(",") if item.strip()] or [parse_size(value)]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--sweep takes image sides separated by commas, e.g. 224,512,1024 or 224,800x1333; got {value!r}"
        ) from None
    if len(set(sizes)) != len(sizes) or len(sizes) < 2:  # a one-point sweep's slopes and x columns say nothing
        raise argparse.ArgumentTypeError(
            f"--sweep compares two or more different sizes, e.g. 224,512,1024; got {value!r} (one size: --img-size)"
        )
    return sizes


# --window: the window of the model counted, at most MAX_WINDOW; --measure-time: how many forwards are timed
MAX_WINDOW = 1024  # stage 1's map side at a 4096 input; far larger windows overflow the counted forward's sizes
_window = whole_number(1, MAX_WINDOW, says=f"--window must be a positive integer up to {MAX_WINDOW} (e.g. 7 or 12)")
_repeats = whole_number(
    1,
    says="--measure-time takes an optional number of timed forwards (e.g. 5)",
    then="; put the model name first: swin flops swin_t --measure-time",
)


def _hw(size: Sequence[int]) -> str:
    return f"{size[0]}x{size[1]}"


def _gap(report: dict) -> str:
    gap = report["check"]["gap"]
    return "-" if gap is None else f"{gap * 100:+.2f}%"


# -- one size ---------------------------------------------------------------------------------------------


def _columns(columns: list[tuple[str, int, str]], rows: list[list[str]]) -> list[str]:
    """The heading line and ``rows``, each cell aligned (``<`` or ``>``) in its column's width, widened where
    a cell needs it so that one space at least always parts two columns (swin_l's MSA at 4096 has 12 digits)."""
    widths = [max(width, *(len(row[i]) + 1 for row in rows)) for i, (_, width, _) in enumerate(columns)]
    lines = [[heading for heading, _, _ in columns], *rows]
    aligns = [align for _, _, align in columns]
    return [
        "".join(f"{cell:{align}{width}}" for cell, align, width in zip(line, aligns, widths, strict=True)).rstrip()
        for line in lines
    ]


def _table(report: dict, units: _Units) -> str:
    out = []
    padded = " (padded to window multiples)" if report["padded"] else ""
    out.append(
        f"{report['model']}: {_hw(report['img_size'])} input{padded}, window {describe_window(report['window_size'])}, "
        f"{report['semantics']} semantics, {report['params']:,} parameters"
    )
    out.append(units.header)
    out.append("")
    twice = "2 x " if units.factor == 2 else ""  # the paper's formulas count MACs
    out.append(
        f"Attention per stage, G{units.name} summed over the stage's blocks: "
        f"MSA = {twice}(4hwC^2 + 2(hw)^2 C), W-MSA = {twice}(4hwC^2 + 2M^2 hwC)"
        if twice
        else f"Attention per stage, G{units.name} summed over the stage's blocks: "
        "MSA = 4hwC^2 + 2(hw)^2 C, W-MSA = 4hwC^2 + 2M^2 hwC"
    )
    pad = report["padded"]
    # (heading, width, align): the widths of the usual sizes; a wider figure widens its column (_columns)
    stage_columns = [
        ("stage", 6, "<"),
        ("tokens h x w", 14, "<"),
        *([("padded to", 11, "<")] if pad else []),
        ("window", 8, "<"),
        ("C", 5, ">"),
        ("depth", 7, ">"),
        ("MSA", 11, ">"),
        ("W-MSA", 10, ">"),
        ("MSA/W-MSA", 11, ">"),
        ("W-MSA padded", 14, ">"),
        ("measured", 10, ">"),
    ]
    rows = [
        [
            str(s["stage"]),
            _hw(s["resolution"]),
            *([_hw(s["padded_resolution"])] if pad else []),
            _hw(s["window"]),
            str(s["channels"]),
            str(s["depth"]),
            units.g(s["msa_macs"]),
            units.g(s["wmsa_macs"]),
            f"{s['ratio']:.2f}x",
            units.g(s["wmsa_macs_padded"]),
            units.g(s["wmsa_macs_measured"]),
        ]
        for s in report["stages"]
    ]
    msa = sum(s["msa_macs"] for s in report["stages"])
    wmsa = sum(s["wmsa_macs"] for s in report["stages"])
    wmsa_padded = sum(s["wmsa_macs_padded"] for s in report["stages"])
    measured = [s["wmsa_macs_measured"] for s in report["stages"]]
    totals = [units.g(msa), units.g(wmsa), f"{msa / wmsa:.2f}x", units.g(wmsa_padded)]
    totals.append(units.g(None if None in measured else sum(measured)))
    rows.append(["all", *[""] * (len(stage_columns) - 1 - len(totals)), *totals])
    out += _columns(stage_columns, rows)
    out.append("")
    out.append(f"Whole model, G{units.name}")
    macs = report["macs"]
    parts = [[part["part"], units.g(part["analytic"]), units.g(part["measured"])] for part in report["parts"]]
    parts.append(["total", units.g(macs["analytic"]), units.g(macs["measured"])])
    out += _columns([("part", 14, "<"), ("analytic", 10, ">"), ("measured", 10, ">")], parts)
    out.append("")
    out.append(f"with W-MSA (the paper's count): {units.g(macs['ideal'])} G{units.name}")
    if report["padded"]:
        out.append(f"with W-MSA as it runs, padded:  {units.g(macs['analytic'])} G{units.name}")
    out.append(
        f"with global MSA in every block: {units.g(macs['msa'])} G{units.name} ({macs['msa'] / macs['ideal']:.2f}x)"
    )
    mlp = report["check"]["position_bias_mlp_macs"]
    if mlp:
        out.append(
            f"Swin V2 position bias MLP: {units.g(mlp)} G{units.name} measured (once per window size, not per "
            "token), left out of the measured figures, as the official count leaves it out"
        )
    out.append(_verdict(report))
    return "\n".join(out)


def _verdict(report: dict) -> str:
    check = report["check"]
    if check["gap"] is None:
        return "measured: not run (--no-measure)"
    status = "OK" if check["ok"] else "FAIL"
    return (
        f"check: measured ({check['measured_on']} forward) vs analytic {_gap(report)}, "
        f"tolerance {TOLERANCE:.0%}: {status}"
    )


def _markdown(report: dict, units: _Units) -> str:
    g = units.name
    out = [
        f"**{report['model']}** at {_hw(report['img_size'])}, window {describe_window(report['window_size'])}: "
        f"{report['params']:,} parameters. {units.header}",
        "",
        f"| stage | tokens | window | C | depth | MSA G{g} | W-MSA G{g} | MSA / W-MSA | W-MSA padded G{g} |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in report["stages"]:
        out.append(
            f"| {s['stage']} | {_hw(s['resolution'])} | {_hw(s['window'])} | {s['channels']} | {s['depth']} "
            f"| {units.g(s['msa_macs'])} | {units.g(s['wmsa_macs'])} | {s['ratio']:.2f}x "
            f"| {units.g(s['wmsa_macs_padded'])} |"
        )
    macs = report["macs"]
    out += [
        "",
        f"| whole model | G{g} |",
        "|---|---|",
        f"| W-MSA, the paper's count | {units.g(macs['ideal'])} |",
        f"| W-MSA, padded as it runs | {units.g(macs['analytic'])} |",
        f"| measured forward | {units.g(macs['measured'])} ({_gap(report)}) |",
        f"| global MSA | {units.g(macs['msa'])} |",
    ]
    return "\n".join(out)


_CSV_FIELDS = (
    "model",
    "img_h",
    "img_w",
    "window_size",
    "scope",
    "stage",
    "h",
    "w",
    "channels",
    "depth",
    "msa",
    "wmsa",
    "wmsa_padded",
    "measured",
    "ratio",
)


def _csv_rows(report: dict, units: _Units) -> list[dict]:
    """One row per stage (attention), one for the whole model; cost columns in the chosen unit."""
    common = {
        "model": report["model"],
        "img_h": report["img_size"][0],
        "img_w": report["img_size"][1],
        "window_size": report["window_size"],
    }
    rows = []
    for s in report["stages"]:
        rows.append(
            {
                **common,
                "scope": "attention",
                "stage": s["stage"],
                "h": s["resolution"][0],
                "w": s["resolution"][1],
                "channels": s["channels"],
                "depth": s["depth"],
                "msa": units.value(s["msa_macs"]),
                "wmsa": units.value(s["wmsa_macs"]),
                "wmsa_padded": units.value(s["wmsa_macs_padded"]),
                "measured": units.value(s["wmsa_macs_measured"]),
                "ratio": f"{s['ratio']:.4f}",
            }
        )
    macs = report["macs"]
    rows.append(
        {
            **common,
            "scope": "model",
            "msa": units.value(macs["msa"]),
            "wmsa": units.value(macs["ideal"]),
            "wmsa_padded": units.value(macs["analytic"]),
            "measured": units.value(macs["measured"]),
            "ratio": f"{macs['msa'] / macs['ideal']:.4f}",
        }
    )
    return rows


def _write_csv(rows: list[dict], units: _Units) -> str:
    cost = {"msa", "wmsa", "wmsa_padded", "measured"}
    fields = [f"{f}_{units.key}" if f in cost else f for f in _CSV_FIELDS]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(fields)
    for row in rows:
        writer.writerow(["" if row.get(f) is None else row[f] for f in _CSV_FIELDS])
    return buffer.getvalue().rstrip("\n")


def render(report: dict, fmt: str = "table", as_flops: bool = False) -> str:
    """The report of :func:`swin.flops` as ``table``, ``markdown``, ``json`` or ``csv`` text."""
    units = _Units(as_flops)
    if fmt == "json":
        return json.dumps(report, indent=2)
    if fmt == "csv":
        return _write_csv(_csv_rows(report, units), units)
    if fmt == "markdown":
        return _markdown(report, units)
    return _table(report, units)


# -- sweep ------------------------------------------------------------------------------------------------


def sweep(
    model_or_name: Any,
    sizes: Sequence[int | Sequence[int]],
    window_size: int | None = None,
    semantics: str = "classification",
    measure: bool = True,
) -> list[dict]:
    """:func:`swin.flops` at each size: how MSA (quadratic in pixels) and W-MSA (linear) grow."""
    return [flops(model_or_name, size, window_size, semantics=semantics, measure=measure) for size in sizes]


def render_sweep(reports: list[dict], fmt: str = "table", as_flops: bool = False) -> str:
    units = _Units(as_flops)
    if fmt == "json":
        return json.dumps(reports, indent=2)
    if fmt == "csv":
        return _write_csv([row for r in reports for row in _csv_rows(r, units)], units)
    first = reports[0]
    pixels0 = first["img_size"][0] * first["img_size"][1]
    g = units.name
    columns = (
        "size",
        "pixels x",
        f"attn MSA G{g}",
        f"attn W-MSA G{g}",
        f"model MSA G{g}",
        f"model W-MSA G{g}",
        f"padded G{g}",
        f"measured G{g}",
        "gap",
        "MSA x",
        "W-MSA x",
    )
    rows = []
    for r in reports:
        pixels = r["img_size"][0] * r["img_size"][1]
        macs = r["macs"]
        rows.append(
            (
                _hw(r["img_size"]),
                f"{pixels / pixels0:.2f}",
                units.g(sum(s["msa_macs"] for s in r["stages"]), 2),
                units.g(sum(s["wmsa_macs"] for s in r["stages"]), 2),
                units.g(macs["msa"], 2),
                units.g(macs["ideal"], 2),
                units.g(macs["analytic"], 2),
                units.g(macs["measured"], 2),
                _gap(r),
                f"{macs['msa'] / first['macs']['msa']:.2f}",
                f"{macs['ideal'] / first['macs']['ideal']:.2f}",
            )
        )
    title = (
        f"{first['model']}, window {describe_window(first['window_size'])}: cost against image size. MSA grows with "
        "the square of the pixels, W-MSA linearly; 'x' columns are relative to the first size."
    )
    if fmt == "markdown":
        lines = [title, "", units.header, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(columns)]
    lines = [title, units.header, ""]
    lines.append("  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True)))
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) for row in rows]
    failed = [_hw(r["img_size"]) for r in reports if r["check"]["ok"] is False]
    status = f"FAIL at {', '.join(failed)}" if failed else "OK"
    if reports[0]["check"]["gap"] is not None:
        lines.append(f"check: measured vs analytic (padded) within {TOLERANCE:.0%}: {status}")
    return "\n".join(lines)


PLOT_FORMATS = ("png", "svg", "pdf")


def plot_format(path: str) -> str:
    """The image format ``path``'s extension names (png, svg, pdf); a clear error for any other, for a folder
    that does not exist, and for a name that is a link, FIFO, device or directory (checked before the sweep
    runs, as every figure's output: :func:`swin.tools.figure.check_figure_path`)."""
    from .figure import check_figure_path

    return check_figure_path(path, "--plot")


def plot_sweep(reports: list[dict], path: str, as_flops: bool = False, dpi: int = 120) -> None:
    """Draw cost against pixels into ``path`` (PNG, SVG or PDF by its extension), in two panels.

    Left, log-log: on such axes every power law is a straight line, so dotted guides of slope 1 (linear)
    and slope 2 (quadratic) from the smallest size's MSA point, labelled at the largest size, show which one
    each curve follows. Right: how many times global MSA costs W-MSA, which grows with the image (a constant
    for two linear costs). The sizes are drawn in order of pixels, whatever the order of ``reports``.
    """
    plot_format(path)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError(f"--plot needs matplotlib, which is not installed: {_PLOT_HINT}") from None
    units = _Units(as_flops)
    # joined in the order given, 224,800x1333,64x2048 would double back: each curve runs by pixel count
    reports = sorted(reports, key=lambda r: r["img_size"][0] * r["img_size"][1])
    pixels = [r["img_size"][0] * r["img_size"][1] / 1e6 for r in reports]

    def series(key: str) -> list[float]:
        return [r["macs"][key] * units.factor / 1e9 for r in reports]

    figure, (cost, ratio) = plt.subplots(1, 2, figsize=(11, 4.6), gridspec_kw={"width_ratios": [3, 2]})
    cost.plot(pixels, series("msa"), "o-", label="global MSA in every block")
    cost.plot(pixels, series("ideal"), "s-", label="W-MSA (the paper's count)")
    cost.plot(pixels, series("analytic"), "^--", label="W-MSA as it runs (padded)")
    if all(r["macs"]["measured"] is not None for r in reports):
        cost.plot(pixels, series("measured"), "x", color="black", markersize=9, label="measured forward")
    for slope, style in ((1, "slope 1 (linear)"), (2, "slope 2 (quadratic)")):
        base = series("msa")[0]  # both guides from the smallest size's MSA point: MSA bends from one toward the other
        guide = [base * (x / pixels[0]) ** slope for x in pixels]
        cost.plot(pixels, guide, ":", color="grey", linewidth=1)
        cost.annotate(
            style,
            (pixels[-1], guide[-1]),
            fontsize=8,
            color="grey",
            textcoords="offset points",
            xytext=(-4, 6),
            ha="right",
        )
    for r, x in zip(reports, pixels, strict=True):
        point = (x, r["macs"]["ideal"] * units.factor / 1e9)
        cost.annotate(_hw(r["img_size"]), point, fontsize=8, textcoords="offset points", xytext=(0, -14), ha="center")
    cost.set_xscale("log")
    cost.set_yscale("log")
    cost.margins(x=0.12, y=0.18)  # room for the size labels inside the axes
    cost.set_xlabel("input pixels (millions)")
    cost.set_ylabel(f"G{units.name} per image" + ("" if as_flops else " (multiply-adds)"))
    cost.set_title("cost against image size (log-log)")
    cost.grid(True, which="both", alpha=0.3)
    cost.legend(fontsize=8, loc="upper left")

    times = [m / w for m, w in zip(series("msa"), series("ideal"), strict=True)]
    ratio.plot(pixels, times, "o-", color="tab:red")
    for x, t in zip(pixels, times, strict=True):
        ratio.annotate(f"{t:.1f}x", (x, t), fontsize=8, textcoords="offset points", xytext=(0, 6), ha="center")
    ratio.set_ylim(bottom=0, top=max(times) * 1.15)
    ratio.margins(x=0.1)
    ratio.set_xlabel("input pixels (millions)")
    ratio.set_ylabel("MSA / W-MSA")
    ratio.set_title("MSA cost / W-MSA cost")
    ratio.grid(True, alpha=0.3)
    window = describe_window(reports[0]["window_size"])
    figure.suptitle(f"{reports[0]['model']}, window {window}: MSA quadratic, W-MSA linear")
    figure.tight_layout()
    from .figure import save

    save(figure, path, dpi, "--plot")  # atomically: a temporary file renamed over ``path`` once complete


# -- the command ------------------------------------------------------------------------------------------


def _refuse_img_size(args) -> None:
    """--img-size beside --sweep or --plot: the sweep's sizes are the sizes counted, so say where to put it."""
    size = _hw(args.img_size)
    if args.sweep:
        sizes = ",".join(str(h) if h == w else f"{h}x{w}" for h, w in [*args.sweep, args.img_size])
        raise ValueError(
            f"--img-size does not apply to --sweep, which gives the sizes itself; add {size} to the sweep "
            f"(--sweep {sizes}) or drop --sweep to count one size"
        )
    default = ",".join(map(str, DEFAULT_SWEEP))
    raise ValueError(
        f"--img-size does not apply to --plot, which draws a sweep (by default of {default}); "
        f"give its sizes with --sweep, each H or HxW (e.g. --sweep 224,{size}), or drop --plot to count one size"
    )


def _described(args):
    """The model an ``hf-hub:`` / ``local-dir:`` name describes (a timm or transformers repository), built on the
    meta device: its description only, no weights fetched."""
    import torch

    from ..factory import create_model

    if args.window is not None or args.semantics != "classification" or args.measure_time is not None:
        raise ValueError(
            f"{args.name} is counted as its repository describes it: --window, --semantics and --measure-time take a "
            "registered name (swin_t, ...)"
        )
    with torch.device("meta"):
        return create_model(args.name)


def cmd_flops(args) -> int:
    from .described import is_described

    described = is_described(args.name)
    try:
        name = _described(args) if described else resolve_name(args.name)
    except (ValueError, FileNotFoundError) as error:
        print(f"swin flops: {error}", file=sys.stderr)
        return 2
    measure = not args.no_measure
    try:
        if args.measure_time is not None:  # time per stage beside MACs per stage: tools/stage_time.py
            from .stage_time import cmd_stage_time

            return cmd_stage_time(args, name)
        if args.img_size is not None and (args.sweep or args.plot):
            _refuse_img_size(args)
        if args.flops and args.format == "json":
            raise ValueError(
                "--format json gives MACs and FLOPs both (its 'macs' and 'flops' entries): leave out --flops, which "
                "switches the table, markdown and csv figures to FLOPs"
            )
        if args.plot:
            plot_format(args.plot)  # before the sweep, which takes a while
        if args.sweep or args.plot:
            reports = sweep(name, args.sweep or list(DEFAULT_SWEEP), args.window, args.semantics, measure)
            for report in reports if described else []:
                report["model"] = args.name
            if args.plot:
                plot_sweep(reports, args.plot, args.flops, args.dpi)
            print(render_sweep(reports, args.format, args.flops))
            if args.plot:
                print(f"wrote {args.plot}", file=sys.stderr)
        else:
            reports = [flops(name, args.img_size, args.window, semantics=args.semantics, measure=measure)]
            if described:  # the repository's name, not the registered one its description starts from
                reports[0]["model"] = args.name
            print(render(reports[0], args.format, args.flops))
    except (ValueError, TypeError, ImportError) as error:
        print(f"swin flops: {error}", file=sys.stderr)
        return 2
    failed = [r for r in reports if r["check"]["ok"] is False]
    for r in failed:
        print(
            f"swin flops: FAIL: {r['model']} at {_hw(r['img_size'])}: the measured forward "
            f"({r['macs']['measured']:,} MACs) differs from the analytic count ({r['macs']['analytic']:,}) by "
            f"{_gap(r)}, more than {TOLERANCE:.0%}: a module's macs() no longer matches its forward",
            file=sys.stderr,
        )
    return 1 if failed else 0


def register(sub) -> None:
    p = sub.add_parser(
        "flops",
        help="cost per stage (MSA against W-MSA) and of the whole model, analytic and measured",
        description=(
            "Cost of one image, in MACs (multiply-accumulates, which the Swin paper calls FLOPs) unless --flops. "
            "The analytic count adds up each module's macs(); the measured count watches a forward "
            "(torch.utils.flop_counter; on the meta device, or on CPU where an op has no meta kernel); "
            f"a gap over {TOLERANCE:.0%} exits with status 1."
        ),
    )
    p.add_argument(
        "name",
        help="registered name or timm alias, e.g. swin_t; or hf-hub:OWNER/NAME, local-dir:FOLDER (a timm or "
        "transformers repository, as it describes the model: its description files are read, no weights)",
    )
    p.add_argument("--img-size", type=_size, default=None, metavar="H[,W]", help="input size (default: native)")
    p.add_argument(
        "--window", type=_window, default=None, metavar="M", help=f"build with window_size=M (1..{MAX_WINDOW})"
    )
    p.add_argument(
        "--semantics", choices=("classification", "detection"), default="classification", help="padding rules"
    )
    p.add_argument(
        "--sweep",
        type=_sizes,
        default=None,
        metavar="224,512,1024",
        help="cost against image size, each H or HxW (instead of --img-size)",
    )
    p.add_argument(
        "--format", choices=("table", "markdown", "json", "csv"), default="table", help="output format (default: table)"
    )
    p.add_argument(
        "--plot",
        metavar="FILE",
        help="draw the sweep (default sizes without --sweep) into FILE.png, .svg or .pdf, the sizes joined in order "
        "of pixels; needs matplotlib",
    )
    from .figure import MAX_DPI, parse_dpi

    p.add_argument(
        "--dpi",
        type=parse_dpi,
        default=120,
        metavar="N",
        help=f"resolution of a --plot PNG, 1..{MAX_DPI} (default 120)",
    )
    p.add_argument("--flops", action="store_true", help="print FLOPs = 2 x MACs instead of MACs")
    p.add_argument("--no-measure", action="store_true", help="analytic count only, no counted forward")
    p.add_argument(
        "--measure-time",
        nargs="?",
        const=5,
        default=None,
        type=_repeats,
        metavar="N",
        help="time each stage (attention apart) on the CPU, median of N forwards (default 5), beside its MACs: "
        "a table, or with --plot FILE a figure of time against MACs per stage (run it on a quiet machine)",
    )
    p.set_defaults(func=cmd_flops)
