"""``swin flops NAME --measure-time``: milliseconds per stage beside MACs per stage.

MACs say how much arithmetic a part does, not how long it takes: the window attention of stage 1 is many
small matrix products (64 windows of 49 tokens at 224) plus the bias and mask additions and the softmax,
memory-bound work the MAC count does not see, while the MLPs are large matrix products that run near the
machine's peak. So the time of each part is measured here, next to its analytic MACs (padded, as the forward
computes them), attention and the rest of each stage apart.

Timing: forward pre-hooks and hooks around the patch embedding, each stage and each block's ``attn`` module
record ``time.perf_counter`` on a batch of one random image, in inference mode, on the CPU; one warm-up
forward (window plans built, memory allocated), then the median of ``repeats`` forwards. CPU execution is
synchronous, so a hook's clock is the module's own time. "norm + head" is the rest of the forward.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

import torch

from ..costs import flops
from ..factory import create_model

__all__ = ["DEFAULT_REPEATS", "attention_findings", "cmd_stage_time", "measure_stage_times", "render_stage_times"]

DEFAULT_REPEATS = 5


def _timed(module: torch.nn.Module, key: str, spent: dict[str, float]) -> list:
    """Hooks adding the wall time of each call of ``module`` to ``spent[key]``."""
    started: list[float] = []

    def before(*_):
        started.append(time.perf_counter())

    def after(*_):
        spent[key] = spent.get(key, 0.0) + time.perf_counter() - started.pop()

    return [module.register_forward_pre_hook(before), module.register_forward_hook(after)]


def measure_stage_times(
    name: str,
    img_size: Any = None,
    window_size: int | None = None,
    semantics: str = "classification",
    repeats: int = DEFAULT_REPEATS,
) -> dict[str, Any]:
    """Median milliseconds and analytic MACs of each part of ``name`` for one image, on the CPU.

    Returns ``model``, ``img_size``, ``semantics``, ``threads``, ``repeats``, ``total_ms``, ``total_macs`` and
    ``parts``: one entry per part (``patch embed``, ``stage 1``..., ``norm + head``) with ``ms`` and ``macs``,
    and for stages ``attention_ms`` / ``attention_macs`` (every block's ``attn`` module: q/k/v and output
    projections included, as in the paper's W-MSA count).
    """
    if repeats < 1:
        raise ValueError(f"--measure-time takes a number of timed forwards of at least 1, got {repeats}")
    report = flops(name, img_size, window_size, semantics=semantics, measure=False)
    size = tuple(report["img_size"])
    overrides: dict[str, Any] = {"img_size": size, "semantics": semantics}
    if window_size is not None:
        overrides["window_size"] = window_size
    torch.manual_seed(0)
    model = create_model(report["model"], **overrides).eval()
    spent: dict[str, float] = {}
    handles = _timed(model.patch_embed, "patch embed", spent)
    for i, stage in enumerate(model.layers):
        handles += _timed(stage, f"stage {i + 1}", spent)
        for block in stage.blocks:
            handles += _timed(block.attn, f"attention {i + 1}", spent)
    image = torch.randn(1, model.in_chans, *size)
    runs: list[dict[str, float]] = []
    try:
        with torch.inference_mode():
            model(image)  # warm-up
            for _ in range(repeats):
                spent.clear()
                start = time.perf_counter()
                model(image)
                runs.append({**spent, "total": time.perf_counter() - start})
    finally:
        for handle in handles:
            handle.remove()

    def ms(key: str) -> float:
        return statistics.median(run[key] for run in runs) * 1e3

    analytic = {p["part"]: p["analytic"] for p in report["parts"]}
    parts = [{"part": "patch embed", "ms": ms("patch embed"), "macs": analytic["patch_embed"]}]
    for i, stage in enumerate(report["stages"]):
        parts.append(
            {
                "part": f"stage {i + 1}",
                "ms": ms(f"stage {i + 1}"),
                "macs": analytic[f"stage {i + 1}"],
                "attention_ms": ms(f"attention {i + 1}"),
                "attention_macs": stage["wmsa_macs_padded"],
            }
        )
    parts_of = [k for k in runs[0] if k == "patch embed" or k.startswith("stage ")]
    rest = statistics.median(run["total"] - sum(run[k] for k in parts_of) for run in runs)
    parts.append({"part": "norm + head", "ms": rest * 1e3, "macs": analytic["norm"] + analytic["head"]})
    return {
        "model": report["model"],
        "img_size": list(size),
        "semantics": report["semantics"],
        "window_size": report["window_size"],
        "device": "cpu",
        "threads": torch.get_num_threads(),
        "repeats": repeats,
        "total_ms": ms("total"),
        "total_macs": report["macs"]["analytic"],
        "parts": parts,
    }


def _rate(macs: int | None, ms: float | None) -> str:
    return "-" if not macs or not ms else f"{macs / 1e9 / (ms / 1e3):.1f}"


def attention_findings(result: dict[str, Any]) -> list[str]:
    """One line per stage: the attention's share of the time against its share of the MACs."""
    lines = []
    for part in result["parts"]:
        if "attention_ms" not in part:
            continue
        time_share = part["attention_ms"] / result["total_ms"]
        mac_share = part["attention_macs"] / result["total_macs"]
        lines.append(
            f"{part['part']} attention: {time_share:.1%} of the time for {mac_share:.1%} of the MACs "
            f"({time_share / mac_share:.2f}x its share), {_rate(part['attention_macs'], part['attention_ms'])} GMAC/s"
        )
    return lines


def render_stage_times(result: dict[str, Any], fmt: str = "table") -> str:
    """The result of :func:`measure_stage_times` as a ``table`` or ``json``."""
    if fmt == "json":
        return json.dumps(result, indent=2)
    if fmt != "table":
        raise ValueError(f"--measure-time prints a table or --format json, not {fmt}")
    h, w = result["img_size"]
    out = [
        f"{result['model']} at {h}x{w} ({result['semantics']} semantics), batch 1 on the CPU with "
        f"{result['threads']} threads: median of {result['repeats']} timed forwards after one warm-up",
        "ms: wall time of the part; GMACs: analytic multiply-accumulates (padded, as the forward computes; G = 10^9); "
        "GMAC/s: GMACs per second; attn: every block's attention module (q/k/v and output projections included)",
        "",
        f"{'part':<13}{'ms':>9}{'time %':>8}{'GMACs':>9}{'MACs %':>8}{'GMAC/s':>8}"
        f"{'attn ms':>10}{'attn GMACs':>12}{'attn GMAC/s':>13}",
    ]
    for part in result["parts"]:
        attention = part.get("attention_ms")
        out.append(
            f"{part['part']:<13}{part['ms']:>9.2f}{part['ms'] / result['total_ms']:>8.1%}{part['macs'] / 1e9:>9.3f}"
            f"{part['macs'] / result['total_macs']:>8.1%}{_rate(part['macs'], part['ms']):>8}"
            + (
                f"{attention:>10.2f}{part['attention_macs'] / 1e9:>12.3f}{_rate(part['attention_macs'], attention):>13}"
                if attention is not None
                else ""
            )
        )
    total = result["total_macs"]
    out.append(
        f"{'total':<13}{result['total_ms']:>9.2f}{'':>8}{total / 1e9:>9.3f}{'':>8}{_rate(total, result['total_ms']):>8}"
    )
    out.append("")
    out += attention_findings(result)
    return "\n".join(out)


def cmd_stage_time(args, name: str) -> int:
    """The ``--measure-time`` branch of ``swin flops``: checks first, then the timing, then the table or plot."""
    if args.sweep:
        raise ValueError("--measure-time times one size; drop --sweep (or --measure-time) and give --img-size")
    if args.flops:
        raise ValueError("--measure-time reports MACs beside the time; drop --flops (FLOPs = 2 x MACs)")
    if args.format not in ("table", "json"):
        raise ValueError(f"--measure-time prints a table or --format json, not --format {args.format}")
    if args.plot:
        from .figure import check_figure_path

        check_figure_path(args.plot, "--plot")
    result = measure_stage_times(name, args.img_size, args.window, args.semantics, args.measure_time)
    if args.plot:
        from .stage_time_figure import plot_stage_times

        plot_stage_times(result, args.plot, args.dpi)
    print(render_stage_times(result, args.format))
    if args.plot:
        import sys

        print(f"wrote {args.plot}", file=sys.stderr)
    return 0
