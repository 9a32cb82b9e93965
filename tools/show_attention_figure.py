"""The figure of ``swin show attention``: the query's attention over the image, the same row as its window's
grid, and the mean attention distance of every head of every block.

The attention of one query only reaches the keys of its window (and, in a shifted block, only those of its
own region): the overlay shows exactly that support, with the window outlined where its tokens are in the
image (a wrapped window in pieces), so the locality the paper builds in is visible before any weights are.
"""

from __future__ import annotations

import torch

from .figure import pyplot, save
from .show_attention import AttentionView
from .show_windows_figure import outline

__all__ = ["draw_attention"]

_QUERY = "#00e5ff"
_CMAP = "magma"


def _scaled(segments, factor: int):
    return [((x0 * factor, y0 * factor), (x1 * factor, y1 * factor)) for (x0, y0), (x1, y1) in segments]


def _lines(ax, segments, colour: str, width: float) -> None:
    from matplotlib.collections import LineCollection

    ax.add_collection(LineCollection(segments, colors=colour, linewidths=width, zorder=4))


def _what(view: AttentionView) -> str:
    return f"head {view.head} of {view.heads}" if view.head else f"mean of the {view.heads} heads"


def _image_panel(ax, figure, view: AttentionView) -> None:
    import numpy as np

    block = view.chosen
    stride, (h, w) = block.stride, block.layout.map_size
    height, width = view.image.shape[:2]
    ax.imshow(view.image.numpy(), extent=(0, width, height, 0))
    keys = block.layout.in_window_order(block.layout.source)[view.window]
    inside = torch.zeros(h * w, dtype=torch.bool)
    inside[keys[keys >= 0]] = True
    inside = inside.view(h, w)
    shade = np.ma.masked_array(np.zeros((h, w)), mask=inside.numpy())
    ax.imshow(shade, extent=(0, w * stride, h * stride, 0), cmap="gray", vmin=0, vmax=1, alpha=0.45, zorder=2)
    heat = np.ma.masked_array(view.heat.numpy(), mask=~inside.numpy())
    shown = ax.imshow(
        heat,
        extent=(0, w * stride, h * stride, 0),
        cmap=_CMAP,
        vmin=0,
        vmax=float(view.row.max()),
        alpha=0.7,
        interpolation="nearest",
        zorder=3,
    )
    _lines(ax, _scaled(outline(inside), stride), "white", 1.6)
    row, col = view.query
    query = torch.zeros(h, w, dtype=torch.bool)
    query[row, col] = True
    _lines(ax, _scaled(outline(query), stride), _QUERY, 2.2)
    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)
    ax.set_xlabel("pixel column", fontsize=8)
    ax.set_ylabel("pixel row", fontsize=8)
    ax.tick_params(labelsize=7)
    padding = f"; {view.padding_mass:.0%} on padding" if view.padding_mass >= 0.005 else ""
    ax.set_title(
        f"attention of token ({row}, {col}) (cyan, {stride}x{stride} px), {_what(view)}\n"
        f"white: its window (in pieces if it wraps); black: masked; dimmed: outside{padding}",
        fontsize=9.5,
    )
    bar = figure.colorbar(shown, ax=ax, fraction=0.046, pad=0.02)
    bar.set_label("attention probability", fontsize=8)
    bar.ax.tick_params(labelsize=7)


def _grid_panel(ax, view: AttentionView) -> None:
    block = view.chosen
    layout = block.layout
    (wh, ww), n = layout.window, layout.tokens
    grid = view.row.view(wh, ww)
    ax.imshow(grid.numpy(), cmap=_CMAP, vmin=0, vmax=float(view.row.max()), extent=(0, ww, wh, 0))
    token = int(
        torch.nonzero(
            layout.in_window_order(layout.source)[view.window] == view.query[0] * layout.map_size[1] + view.query[1]
        )[0]
    )
    masked = torch.zeros(n, dtype=torch.bool) if layout.masks is None else layout.masks[view.window, token] != 0
    padding = layout.in_window_order(layout.source)[view.window] < 0
    size = 7.5 if n <= 64 else 5.5
    for k in range(n if n <= 144 else 0):
        r, c = divmod(k, ww)
        if masked[k]:
            text, colour = "x", "#888888"
        else:
            value = float(view.row[k])
            text, colour = (
                f"{value:.0%}" if value >= 0.01 else f"{value:.1%}",
                "white" if value < 0.6 * float(view.row.max()) else "black",
            )
            if padding[k]:
                text += "\npad"
        ax.text(c + 0.5, r + 0.5, text, ha="center", va="center", fontsize=size, color=colour)
    query = torch.zeros(wh, ww, dtype=torch.bool)
    query.view(-1)[token] = True
    _lines(ax, outline(query), _QUERY, 2.2)
    home = layout.in_window_order(layout.home)[view.window].view(wh, ww, 2)
    ax.set_xticks([c + 0.5 for c in range(ww)], [str(int(v)) for v in home[0, :, 1]], fontsize=7)
    ax.set_yticks([r + 0.5 for r in range(wh)], [str(int(v)) for v in home[:, 0, 0]], fontsize=7)
    ax.set_xlabel("map column of the key (padded map, before the roll)", fontsize=8)
    ax.set_ylabel("map row of the key", fontsize=8)
    count = int(masked.sum())
    note = f"; x: masked, other region ({count} keys)" if count else ""
    ax.set_title(
        f"the same row as window {view.window}'s {wh}x{ww} grid\n(window order after the shift{note})",
        fontsize=9.5,
    )


def _distance_panel(ax, view: AttentionView) -> None:
    colours = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")
    labels, starts = [], {}
    for x, block in enumerate(view.blocks):
        colour = colours[(block.stage - 1) % len(colours)]
        ax.scatter([x] * len(block.distance), block.distance, s=14, color=colour, alpha=0.75, zorder=3)
        ax.plot([x - 0.35, x + 0.35], [block.uniform_distance] * 2, color="black", lw=1.2, zorder=2)
        labels.append(f"{block.stage}.{block.block}")
        starts.setdefault(block.stage, x)
        if block is view.chosen:
            ax.axvspan(x - 0.5, x + 0.5, color="#ffe9a8", zorder=1)
    for x in starts.values():
        if x:
            ax.axvline(x - 0.5, color="#999999", lw=0.8, zorder=1)
    ax.set_xticks(range(len(labels)), labels, fontsize=7, rotation=90 if len(labels) > 14 else 0)
    ax.set_xlim(-0.6, len(labels) - 0.4)
    ax.set_ylim(bottom=0)
    ax.tick_params(axis="y", labelsize=7)
    ax.set_xlabel("stage.block (highlighted: the one drawn)", fontsize=8)
    ax.set_ylabel("mean attention distance (input pixels)", fontsize=8)
    ax.set_title(
        "mean attention distance, one dot per head\nbar: the same for attention spread evenly in the window",
        fontsize=9.5,
    )
    ax.grid(True, axis="y", alpha=0.3)


def draw_attention(view: AttentionView, caption: str, path: str, dpi: int = 120) -> None:
    """Draw the three panels of ``view`` into ``path``; ``caption`` names the weights (random ones in red)."""
    plt = pyplot()
    block = view.chosen
    figure, axes = plt.subplots(1, 3, figsize=(17, 5.8), gridspec_kw={"width_ratios": [1.25, 1, 1.1]})
    shift = block.layout.shift
    shifted = f"shifted by {shift[0]}x{shift[1]}" if any(shift) else "not shifted"
    h, w = block.layout.map_size
    figure.suptitle(
        f"{view.model}: stage {block.stage} ({h}x{w} tokens), block {block.block} ({shifted}), {_what(view)}",
        fontsize=12,
        y=0.99,
    )
    figure.text(
        0.5,
        0.925,
        caption,
        ha="center",
        fontsize=10,
        color="#c00000" if caption.startswith("RANDOM") else "black",
        weight="bold" if caption.startswith("RANDOM") else "normal",
    )
    _image_panel(axes[0], figure, view)
    _grid_panel(axes[1], view)
    _distance_panel(axes[2], view)
    figure.tight_layout(rect=(0, 0, 1, 0.9), w_pad=3)
    save(figure, path, dpi)
