"""The figure of ``swin show windows``: regular windows, shifted windows, the rolled map with its region ids,
and the attention mask of one window, in four panels (the paper's figures 2 and 4, for any size and stage).

Every cell is one token. Window borders are the lines where neighbouring tokens fall in different windows,
so shifted windows that wrap around the border (the ones the mask exists for) are drawn as their pieces,
in one colour per window.
"""

from __future__ import annotations

import torch

from .figure import pyplot, save
from .show_windows import StageLayout, WindowLayout

__all__ = ["REGION_COLOURS", "draw_windows", "edges", "outline"]

# Region 0 (the bulk of the map) pale; the regions at and past the seam in distinct colours.
REGION_COLOURS = (
    "#e6e6e6",
    "#9ecae1",
    "#3182bd",
    "#fdae6b",
    "#a1d99b",
    "#31a354",
    "#e6550d",
    "#bcbddc",
    "#756bb1",
)
_CHECKER = ("#f4f4f4", "#d9d9d9")
# Wrapped windows, one colour each (tab20 without its greys and red, which outlines the chosen window).
_PIECES = (
    "#1f77b4",
    "#aec7e8",
    "#ff7f0e",
    "#ffbb78",
    "#2ca02c",
    "#98df8a",
    "#ff9896",
    "#9467bd",
    "#c5b0d5",
    "#8c564b",
    "#c49c94",
    "#e377c2",
    "#f7b6d2",
    "#bcbd22",
    "#dbdb8d",
    "#17becf",
    "#9edae5",
)
_CHOSEN = "#d62728"


def edges(
    ids: torch.Tensor, border: bool = True, between: torch.Tensor | None = None
) -> list[tuple[tuple[float, float], tuple[float, float]]]:
    """Segments between neighbouring cells of an (H, W) id grid whose ids differ, plus the outer border
    unless ``border`` is False; with ``between`` (boolean, H x W) only where both cells are set. Cell (r, c)
    spans x in [c, c+1], y in [r, r+1]."""
    height, width = ids.shape
    both = torch.ones_like(ids, dtype=torch.bool) if between is None else between
    segments = []
    rows, cols = torch.nonzero((ids[:, 1:] != ids[:, :-1]) & both[:, 1:] & both[:, :-1], as_tuple=True)
    segments += [((c + 1, r), (c + 1, r + 1)) for r, c in zip(rows.tolist(), cols.tolist(), strict=True)]
    rows, cols = torch.nonzero((ids[1:, :] != ids[:-1, :]) & both[1:, :] & both[:-1, :], as_tuple=True)
    segments += [((c, r + 1), (c + 1, r + 1)) for r, c in zip(rows.tolist(), cols.tolist(), strict=True)]
    if border:
        segments += [((0, 0), (width, 0)), ((0, height), (width, height)), ((0, 0), (0, height))]
        segments.append(((width, 0), (width, height)))
    return segments


def outline(inside: torch.Tensor) -> list[tuple[tuple[float, float], tuple[float, float]]]:
    """Segments around the cells where the boolean (H, W) grid ``inside`` is set (each piece outlined)."""
    padded = torch.nn.functional.pad(inside.long(), (1, 1, 1, 1))
    segments = []
    for (r, c), ((x0, y0), (x1, y1)) in (
        ((0, 1), ((0, 0), (0, 1))),  # the cell to the left is outside: its left side
        ((0, -1), ((1, 0), (1, 1))),
        ((1, 0), ((0, 0), (1, 0))),
        ((-1, 0), ((0, 1), (1, 1))),
    ):
        neighbour = padded[1 - r : padded.shape[0] - 1 - r, 1 - c : padded.shape[1] - 1 - c]
        # neighbour[r', c'] is the cell at (r' - r, c' - c) of ``inside``: outside where it is 0.
        rows, cols = torch.nonzero(inside & (neighbour == 0), as_tuple=True)
        segments += [
            ((cc + x0, rr + y0), (cc + x1, rr + y1)) for rr, cc in zip(rows.tolist(), cols.tolist(), strict=True)
        ]
    return segments


def _lines(ax, segments, colour="black", width=1.0, z=3, style="solid") -> None:
    from matplotlib.collections import LineCollection

    lines = LineCollection(segments, colors=colour, linewidths=width, zorder=z, capstyle="projecting", linestyles=style)
    ax.add_collection(lines)


def _runs(flags: list[bool]) -> list[tuple[int, int]]:
    """(start, length) of each run of True."""
    runs, start = [], None
    for i, flag in enumerate([*flags, False]):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            runs.append((start, i - start))
            start = None
    return runs


def _hatch_padding(ax, padding: torch.Tensor) -> None:
    """Hatch the padding of an (H, W) grid: always whole rows and whole columns (what lies past the map)."""
    from matplotlib.patches import Rectangle

    height, width = padding.shape
    for start, length in _runs(padding.all(dim=1).tolist()):
        ax.add_patch(
            Rectangle((0, start), width, length, facecolor="none", edgecolor="#444444", hatch="////", lw=0, zorder=2)
        )
    for start, length in _runs(padding.all(dim=0).tolist()):
        ax.add_patch(
            Rectangle((start, 0), length, height, facecolor="none", edgecolor="#444444", hatch="////", lw=0, zorder=2)
        )


def _grid_axes(ax, shape: tuple[int, int], window: tuple[int, int], title: str) -> None:
    """Limits, title and ticks on window borders (every few windows on a large map)."""
    height, width = shape
    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)
    ax.set_aspect("equal")
    ax.set_title(title, fontsize=9.5)
    small = max(shape) <= 16  # a map of a window or two: every token
    ax.set_yticks(range(0, height + 1, 1 if small else window[0] * -(-height // window[0] // 8)))
    ax.set_xticks(range(0, width + 1, 1 if small else window[1] * -(-width // window[1] // 8)))
    ax.tick_params(labelsize=7)
    ax.set_xlabel("token column", fontsize=8)
    ax.set_ylabel("token row", fontsize=8)


def _paint(ax, palette: list[str], index: torch.Tensor) -> None:
    """Fill cell (r, c) with ``palette[index[r, c]]``."""
    from matplotlib.colors import to_rgb

    image = torch.tensor([to_rgb(colour) for colour in palette])[index]
    height, width = index.shape
    ax.imshow(image.numpy(), extent=(0, width, height, 0), interpolation="nearest", zorder=1)


def _checker(windows: torch.Tensor, per_row: int) -> torch.Tensor:
    """0/1 per cell, alternating between neighbouring windows like a chessboard."""
    return (windows // per_row + windows % per_row) % 2


def _cell_points(ax, figure, columns: int) -> float:
    """How many points wide one cell is drawn (to size the labels written in cells)."""
    box = ax.get_window_extent(figure.canvas.get_renderer())
    return box.width * 72 / figure.dpi / columns


def _split_windows(layout: WindowLayout) -> list[int]:
    """Shifted windows whose tokens come from more than one place of the map (they wrap around its border):
    those whose bounding box in the map holds more cells than the window."""
    windows = layout.window_of().flatten()
    home = layout.home.reshape(-1, 2)
    count = layout.num_windows
    low = torch.full((count, 2), 1 << 30).scatter_reduce(0, windows[:, None].expand(-1, 2), home, "amin")
    high = torch.full((count, 2), -1).scatter_reduce(0, windows[:, None].expand(-1, 2), home, "amax")
    return torch.nonzero((high - low + 1).prod(dim=1) != layout.tokens).flatten().tolist()


def _regular_panel(ax, stage: StageLayout) -> None:
    layout = stage.layout
    (h, w), (hp, wp), (nh, nw) = layout.map_size, layout.padded, layout.grid
    ids = layout.window_of()
    _paint(ax, list(_CHECKER), _checker(ids, nw))
    rows, cols = torch.arange(hp)[:, None], torch.arange(wp)[None, :]
    _hatch_padding(ax, (rows >= h) | (cols >= w))
    _lines(ax, edges(ids), width=1.2)
    padded = f", padded to {hp}x{wp}" if (hp, wp) != (h, w) else ""
    _grid_axes(
        ax,
        (hp, wp),
        layout.window,
        f"block 1: regular windows\n{h}x{w} tokens{padded}, window {layout.window[0]}x{layout.window[1]}: "
        f"{nh}x{nw} = {layout.num_windows} window{'s' if layout.num_windows > 1 else ''}",
    )


def _shifted_panel(ax, stage: StageLayout, chosen: int) -> None:
    layout = stage.layout
    (hp, wp), (sh, sw) = layout.padded, layout.shift
    ids = layout.home_window_of()
    split = _split_windows(layout)
    # Cells of a wrapped window: its own colour (palette entries 2...); the others: the chessboard (0, 1).
    colour = _checker(ids, layout.grid[1])
    for i, index in enumerate(split):
        colour[ids == index] = 2 + i % len(_PIECES)
    _paint(ax, [*_CHECKER, *_PIECES], colour)
    home_padding = layout.source.new_zeros(layout.padded, dtype=torch.bool)
    home_padding[layout.home[..., 0], layout.home[..., 1]] = layout.source < 0
    _hatch_padding(ax, home_padding)
    _lines(ax, edges(ids), width=1.2)
    _lines(ax, outline(ids == chosen), colour=_CHOSEN, width=2.2, z=4)
    if any(layout.shift):
        note = f"{len(split)} windows wrap around the border (one colour each)" if split else "no window wraps around"
        title = f"block {stage.block}: shifted windows, drawn where their tokens are\nshift {sh}x{sw}; {note}"
    else:
        reason = stage.shift_reason.removeprefix("no shift: ")
        title = f"block {stage.block}: the same windows, not shifted\n{_wrap(reason, 70)}"
    _grid_axes(ax, (hp, wp), layout.window, title)


def _wrap(text: str, width: int) -> str:
    import textwrap

    return textwrap.fill(text, width)


def _rolled_panel(ax, stage: StageLayout, chosen: int) -> None:
    layout = stage.layout
    (hp, wp), (sh, sw) = layout.padded, layout.shift
    _paint(ax, list(REGION_COLOURS), layout.region)
    _hatch_padding(ax, layout.source < 0)
    windows = layout.window_of()
    _lines(ax, edges(windows), width=1.2)
    _lines(ax, outline(windows == chosen), colour=_CHOSEN, width=2.2, z=4)
    padding = "; hatched: padding" if bool((layout.source < 0).any()) else ""
    if any(layout.shift):
        # The seam of the roll, dashed: where tokens that wrapped around meet those that did not.
        # Only between cells the roll moved: padding appended after the roll (classification) has no side.
        rows, cols = torch.arange(hp)[:, None], torch.arange(wp)[None, :]
        moved = (layout.home[..., 0] != rows) | (layout.home[..., 1] != cols)
        seam = edges(layout.wrapped(), border=False, between=moved)
        _lines(ax, seam, colour="white", width=2.4, z=4)
        _lines(ax, seam, colour="black", width=1.6, z=4, style=(0, (3, 2)))
        leak = layout.pairs_across_seam()
        crossing = f"{leak} allowed query/key pairs cross it" if leak else "it runs along region borders"
        title = (
            f"block {stage.block}: map rolled by (-{sh}, -{sw}), cut into regular windows\n"
            f"colour and number: region id (official mask){padding}; dashed: seam of the roll\n"
            f"(tokens past it wrapped around): {crossing}"
        )
    else:
        title = f"block {stage.block}: nothing rolled, one region{padding}"
    _grid_axes(ax, (hp, wp), layout.window, title)


def _label_regions(ax, figure, layout: WindowLayout) -> None:
    """One id per piece (a region inside a window) in the windows where regions meet, region 0 once; sized to
    the piece, left out where it would not be legible. Call after the layout is final."""
    from matplotlib import patheffects

    (wh, ww), region = layout.window, layout.region
    cell = _cell_points(ax, figure, layout.padded[1])
    per_window = layout.in_window_order(region)
    labelled_zero = False
    for index in range(layout.num_windows):
        ids = per_window[index].unique().tolist()
        if len(ids) == 1 and (ids[0] != 0 or labelled_zero):
            continue
        top, left = (index // layout.grid[1]) * wh, (index % layout.grid[1]) * ww
        block = region[top : top + wh, left : left + ww]
        for value in ids:
            rows, cols = torch.nonzero(block == value, as_tuple=True)
            size = min(int(rows.max() - rows.min()) + 1, int(cols.max() - cols.min()) + 1)
            fontsize = min(10.0, size * cell * 0.75)
            if fontsize < 4.5:
                continue
            y, x = top + (rows.min() + rows.max() + 1) / 2, left + (cols.min() + cols.max() + 1) / 2
            ax.text(
                float(x),
                float(y),
                str(value),
                ha="center",
                va="center",
                fontsize=fontsize,
                weight="bold",
                zorder=5,
                path_effects=[patheffects.withStroke(linewidth=2.5, foreground="white")],
            )
            labelled_zero |= value == 0


def _mask_panel(ax, stage: StageLayout, chosen: int) -> None:
    layout = stage.layout
    n, (nh, nw) = layout.tokens, layout.grid
    where = f"window {chosen} (window row {chosen // nw}, column {chosen % nw} of {nh}x{nw})"
    regions = layout.in_window_order(layout.region)[chosen]
    if layout.masks is None:
        reason = stage.shift_reason.removeprefix("no shift: ")
        text = f"no mask: the block is not shifted ({reason}), so it passes None and every token sees its whole window"
        ax.text(0.5, 0.5, _wrap(text, 48), ha="center", va="center", fontsize=10)
        ax.set_axis_off()
        ax.set_title(f"attention mask of {where}", fontsize=9.5)
        return
    mask = layout.masks[chosen]
    # Allowed pairs in the colour of the query's region (they share it), masked pairs dark.
    colour = torch.where(mask != 0, len(REGION_COLOURS), regions[:, None].expand(n, n))
    _paint(ax, [*REGION_COLOURS, "#303030"], colour)
    ax.set_xlim(0, n)
    ax.set_ylim(n, 0)
    ax.set_aspect("equal")
    ticks = list(range(0, n + 1, layout.window[1]))
    ax.set_xticks(ticks)
    ax.set_yticks(ticks)
    ax.tick_params(labelsize=7)
    ax.set_xlabel(f"key token (row by row in the {layout.window[0]}x{layout.window[1]} window)", fontsize=8)
    ax.set_ylabel("query token", fontsize=8)
    count = len(regions.unique())
    blocked = int((mask != 0).sum())
    wrapped = layout.in_window_order(layout.wrapped())[chosen]
    real = layout.in_window_order(layout.source)[chosen] >= 0
    leak = int(((wrapped[:, None] != wrapped[None, :]) & (mask == 0) & real[:, None] & real[None, :]).sum())
    note = f"\n{leak} allowed pairs join tokens from opposite borders (across the seam)" if leak else ""
    ax.set_title(
        f"attention mask of {where}\n{n} tokens from {count} region{'s' if count > 1 else ''}: "
        f"{blocked} of {n * n} pairs masked (dark, -100){note}",
        fontsize=9.5,
    )


def draw_windows(stage: StageLayout, chosen: int, path: str, dpi: int = 120) -> None:
    """Draw the four panels of ``stage`` (window ``chosen`` outlined, its mask shown) into ``path``."""
    plt = pyplot()
    layout = stage.layout
    figure, axes = plt.subplots(2, 2, figsize=(13, 13.8))
    h, w = layout.map_size
    order = "pad, then roll" if layout.pad_first else "roll, then pad"
    figure.suptitle(
        f"{stage.model} at {stage.img_size[0]}x{stage.img_size[1]}, stage {stage.stage} of {stage.stages} "
        f"({h}x{w} tokens), {stage.semantics} semantics ({order})\n"
        f"{stage.window_reason}; block {stage.block}: {stage.shift_reason}",
        fontsize=11,
    )
    _regular_panel(axes[0, 0], stage)
    _shifted_panel(axes[0, 1], stage, chosen)
    _rolled_panel(axes[1, 0], stage, chosen)
    _mask_panel(axes[1, 1], stage, chosen)
    if any(layout.shift):
        figure.text(
            0.5,
            0.008,
            "Region id = 3 x row slice + column slice, as the official code builds the mask over the rolled map: "
            "slice 0 before the last window,\n1 in the last window before the seam, 2 past it (wrapped around from "
            "the other side). Tokens attend only to tokens of their own region inside a window.",
            ha="center",
            va="bottom",
            fontsize=8.5,
        )
    figure.tight_layout(rect=(0, 0.03, 1, 0.96), h_pad=2.5)
    _label_regions(axes[1, 0], figure, layout)
    save(figure, path, dpi)
