"""The figure of ``swin flops --measure-time --plot``: where the time goes against where the MACs are.

Left: each part's share of the forward's time beside its share of the MACs, attention and the rest of each
stage stacked, milliseconds and GMACs written on the bars: a part whose time bar is taller than its MAC bar
runs slower than the model's average. Right: the same as a rate, GMACs per second of attention and of the
rest of each stage.
"""

from __future__ import annotations

from typing import Any

from .figure import pyplot, save
from .stage_time import attention_findings

__all__ = ["plot_stage_times"]

_ATTENTION, _REST = "#d95f02", "#7570b3"
_ATTENTION_LIGHT, _REST_LIGHT = "#fdbf8f", "#c5c1e6"


def plot_stage_times(result: dict[str, Any], path: str, dpi: int = 120) -> None:
    """Draw the result of :func:`swin.tools.stage_time.measure_stage_times` into ``path`` (png, svg, pdf)."""
    plt = pyplot()
    parts = result["parts"]
    total_ms, total_macs = result["total_ms"], result["total_macs"]
    figure, (shares, rates) = plt.subplots(1, 2, figsize=(14, 5.8), gridspec_kw={"width_ratios": [3, 2]})
    width = 0.38
    for i, part in enumerate(parts):
        attention_ms = part.get("attention_ms", 0.0)
        attention_macs = part.get("attention_macs", 0)
        for offset, value, attention, unit, dark, light, label in (
            (
                -width / 2,
                part["ms"] / total_ms,
                attention_ms / total_ms,
                f"{part['ms']:.1f} ms",
                _ATTENTION,
                _REST,
                "time",
            ),
            (
                width / 2,
                part["macs"] / total_macs,
                attention_macs / total_macs,
                f"{part['macs'] / 1e9:.2f} G",
                _ATTENTION_LIGHT,
                _REST_LIGHT,
                "MACs",
            ),
        ):
            x = i + offset
            shares.bar(x, attention * 100, width, color=dark, edgecolor="white", hatch="" if label == "time" else "..")
            shares.bar(
                x,
                (value - attention) * 100,
                width,
                bottom=attention * 100,
                color=light,
                edgecolor="white",
                hatch="" if label == "time" else "..",
            )
            shares.annotate(
                unit, (x, value * 100), xytext=(0, 3), textcoords="offset points", ha="center", fontsize=7.5
            )
    from matplotlib import patheffects
    from matplotlib.patches import Patch

    shares.legend(
        handles=[
            Patch(color=_ATTENTION, label="time: attention"),
            Patch(color=_REST, label="time: the rest"),
            Patch(facecolor=_ATTENTION_LIGHT, hatch="..", edgecolor="white", label="MACs: attention"),
            Patch(facecolor=_REST_LIGHT, hatch="..", edgecolor="white", label="MACs: the rest"),
        ],
        fontsize=8,
        loc="upper right",
    )
    shares.set_xticks(range(len(parts)), [p["part"] for p in parts], fontsize=9)
    shares.set_ylabel("share of the whole forward (%)", fontsize=9)
    shares.set_ylim(0, max(max(p["ms"] / total_ms, p["macs"] / total_macs) for p in parts) * 118)
    shares.set_title(
        f"time (left bar, {total_ms:.1f} ms in all) beside MACs (right bar, {total_macs / 1e9:.2f} G in all)",
        fontsize=10,
    )
    shares.grid(True, axis="y", alpha=0.3)

    stages = [p for p in parts if "attention_ms" in p]
    for i, part in enumerate(stages):
        rest_macs, rest_ms = part["macs"] - part["attention_macs"], part["ms"] - part["attention_ms"]
        for offset, macs, ms, colour in (
            (-width / 2, part["attention_macs"], part["attention_ms"], _ATTENTION),
            (width / 2, rest_macs, rest_ms, _REST),
        ):
            rate = macs / 1e9 / (ms / 1e3) if ms > 0 else 0.0
            rates.bar(i + offset, rate, width, color=colour)
            rates.annotate(
                f"{rate:.0f}",
                (i + offset, rate),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                fontsize=8,
                path_effects=[patheffects.withStroke(linewidth=2.5, foreground="white")],
            )
    whole = total_macs / 1e9 / (total_ms / 1e3)
    line = rates.axhline(whole, color="black", lw=1, ls="--")
    rates.legend([line], [f"whole model: {whole:.0f} GMAC/s"], fontsize=8, loc="best")
    rates.set_xticks(range(len(stages)), [p["part"] for p in stages], fontsize=9)
    rates.set_ylabel("GMACs per second", fontsize=9)
    rates.set_ylim(0, max(rates.get_ylim()[1], whole) * 1.12)
    rates.set_title("speed: attention (orange) against the rest of the stage (purple)", fontsize=10)
    rates.grid(True, axis="y", alpha=0.3)

    h, w = result["img_size"]
    figure.suptitle(
        f"{result['model']} at {h}x{w}, batch 1 on the CPU ({result['threads']} threads), median of "
        f"{result['repeats']} forwards: where the time goes, against the MACs",
        fontsize=11.5,
    )
    findings = attention_findings(result)
    if findings:
        figure.text(
            0.5, 0.01, findings[0] + " - MACs do not count the bias, mask and softmax work", ha="center", fontsize=9
        )
    figure.tight_layout(rect=(0, 0.04, 1, 0.95))
    save(figure, path, dpi)
