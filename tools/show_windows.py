"""The data of ``swin show windows``: how one stage cuts its map into windows, shifts them, and masks attention.

Everything here comes from the model's own code path: the stage's window from the config's
``stage_windows`` (the classification rule shrinks it to a small map), the shift from the semantics' rule,
and the gather of :func:`swin.layers.window.build_window_plan`, the function the blocks' plan cache calls. The
region ids are the official construction (3 x 3 slices of the rolled map, ``(0, -M), (-M, -s), (-s, None)``
per axis), so the figure shows the paper's nine regions; the masks are rebuilt from those ids, and the tests
check them against the mask the model really passes to attention.

Conventions: ``stage`` is 1-based, as ``swin info`` prints it and the paper numbers stages; windows are
numbered from 0, row by row, in the order the model stacks them (tokens row by row inside a window).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch

from ..layers.semantics import get_semantics
from ..layers.window import MASK_VALUE, build_window_plan
from ..registry import get_config, resolve_name

__all__ = ["StageLayout", "WindowLayout", "check_window_index", "layout_for", "stage_layout", "to_json"]


@dataclass(frozen=True)
class WindowLayout:
    """One (shifted) block's windows on an (h, w) map, as maps over the rolled, padded (hp, wp) grid.

    Attributes:
        map_size: (h, w) tokens of the stage.
        padded: (hp, wp), the map padded to window multiples: what is cut into windows.
        window: (wh, ww) tokens.
        shift: (sh, sw) cyclic shift of the block (the map is rolled by minus this).
        pad_first: padded, then rolled (detection semantics); otherwise rolled, then padded.
        source: (hp, wp) the input token (row * w + col) each position of the rolled, padded map holds,
            -1 for padding: read from the model's gather.
        home: (hp, wp, 2) row and column of that position in the padded map before the roll (padding has a
            place there too), for drawing the shifted windows where the tokens come from.
        region: (hp, wp) official region id, 0..8: 3 x (row slice) + (column slice).
        masks: (nW, N, N) additive mask, 0 or -100, rebuilt from the region ids; None when nothing is
            shifted (the block then passes no mask).
    """

    map_size: tuple[int, int]
    padded: tuple[int, int]
    window: tuple[int, int]
    shift: tuple[int, int]
    pad_first: bool
    source: torch.Tensor
    home: torch.Tensor
    region: torch.Tensor
    masks: torch.Tensor | None

    @property
    def grid(self) -> tuple[int, int]:
        """(windows down, windows across)."""
        return self.padded[0] // self.window[0], self.padded[1] // self.window[1]

    @property
    def num_windows(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def tokens(self) -> int:
        """Tokens per window, N."""
        return self.window[0] * self.window[1]

    def window_of(self) -> torch.Tensor:
        """(hp, wp) index of the window each position of the rolled, padded map falls in."""
        rows = torch.arange(self.padded[0])[:, None] // self.window[0]
        cols = torch.arange(self.padded[1])[None, :] // self.window[1]
        return rows * self.grid[1] + cols

    def in_window_order(self, grid: torch.Tensor) -> torch.Tensor:
        """(nW, N, ...) the values of an (hp, wp, ...) grid over the rolled map, in the model's window order."""
        return _window_order(grid, self.window)

    def wrapped(self) -> torch.Tensor:
        """(hp, wp) 0..3 per position of the rolled map: 2 x (its row wrapped around the map's border in the
        roll) + (its column did); padding that is not rolled counts as not wrapped."""
        rows = torch.arange(self.padded[0])[:, None]
        cols = torch.arange(self.padded[1])[None, :]
        return (self.home[..., 0] < rows).long() * 2 + (self.home[..., 1] < cols).long()

    def pairs_across_seam(self) -> int:
        """Query/key pairs the mask allows although one token wrapped around the border and the other did not
        (they were not neighbours). 0 whenever the mask's regions follow the seam of the roll; more where a map
        is rolled, then padded (the seam then lies inside a region, as in timm at such sizes)."""
        if self.masks is None:
            return 0
        wrapped = self.in_window_order(self.wrapped())
        apart = wrapped[:, :, None] != wrapped[:, None, :]
        real = self.in_window_order(self.source) >= 0
        return int((apart & (self.masks == 0) & real[:, :, None] & real[:, None, :]).sum())

    def home_window_of(self) -> torch.Tensor:
        """(hp, wp) the shifted window each position of the padded map (before the roll) belongs to: the
        windows drawn where their tokens come from, as the paper's figure draws them."""
        out = torch.empty(self.padded, dtype=torch.long)
        out[self.home[..., 0], self.home[..., 1]] = self.window_of()
        return out


def _window_order(grid: torch.Tensor, window: tuple[int, int]) -> torch.Tensor:
    """(nW, N, ...) from an (hp, wp, ...) grid: windows row by row, tokens row by row inside each (the order of
    the official ``window_partition`` and of the model's gather)."""
    (wh, ww), (hp, wp) = window, grid.shape[:2]
    rest = grid.shape[2:]
    return grid.reshape(hp // wh, wh, wp // ww, ww, *rest).transpose(1, 2).reshape(-1, wh * ww, *rest)


def _region_ids(size: int, window: int, shift: int) -> torch.Tensor:
    """Official slice id along one axis of the rolled map: 0 before the last window, 1 in the last window
    before the seam, 2 after it (the rows that wrapped around); all 0 when this axis is not shifted."""
    index = torch.arange(size)
    if shift == 0:
        return torch.zeros(size, dtype=torch.long)
    return (index >= size - window).long() + (index >= size - shift).long()


def layout_for(
    height: int, width: int, window: tuple[int, int], shift: tuple[int, int], pad_first: bool
) -> WindowLayout:
    """The :class:`WindowLayout` of a block with this window and shift on a (height, width) map."""
    wh, ww = window
    plan = build_window_plan(height, width, window, shift, pad_first, torch.device("cpu"))
    hp, wp = plan.padded
    # The model's gather, window order -> back onto the rolled, padded grid.
    rows = torch.arange(hp)[:, None].expand(hp, wp)
    cols = torch.arange(wp)[None, :].expand(hp, wp)
    source = torch.full((hp, wp), -1, dtype=torch.long)
    gathered = torch.where(plan.gather < height * width, plan.gather, -1)
    source[_window_order(rows, window).flatten(), _window_order(cols, window).flatten()] = gathered
    # Where each rolled position sat before the roll (the padding of a rolled-then-padded map stays put).
    if pad_first:
        home = torch.stack(((rows + shift[0]) % hp, (cols + shift[1]) % wp), dim=-1)
    else:
        inside = (rows < height) & (cols < width)
        home = torch.stack(
            (
                torch.where(inside, (rows + shift[0]) % height, rows),
                torch.where(inside, (cols + shift[1]) % width, cols),
            ),
            dim=-1,
        )
    region = 3 * _region_ids(hp, wh, shift[0])[:, None] + _region_ids(wp, ww, shift[1])[None, :]
    masks = None
    if any(shift):
        ids = _window_order(region, window)  # nW, N
        masks = (ids[:, :, None] != ids[:, None, :]).float() * MASK_VALUE
    return WindowLayout((height, width), (hp, wp), (wh, ww), shift, pad_first, source, home, region, masks)


@dataclass(frozen=True)
class StageLayout:
    """The layout of a stage's shifted block, with what the figure and the json say about it."""

    model: str
    img_size: tuple[int, int]
    semantics: str
    stage: int  # 1-based
    stages: int
    block: int  # 1-based, within the stage: the block shown (the first shifted one)
    layout: WindowLayout
    window_reason: str
    shift_reason: str


def _shift_reason(rules, size: tuple[int, int], window: tuple[int, int], shift: tuple[int, int], depth: int) -> str:
    """Why the block shifts as it does, in one line."""
    (h, w), (wh, ww) = size, window
    if depth < 2:
        return "no shift: the stage has one block, and only the odd (second, fourth, ...) blocks shift"
    if not any(shift):
        return f"no shift: map {h}x{w} not larger than window {wh}x{ww} ({rules.name} semantics)"
    why = "odd blocks shift" if rules.shrink_window else "detection semantics: odd blocks always shift"
    if not rules.shrink_window and (h <= wh or w <= ww):
        why += f", even on a map {h}x{w} not larger than the window"
    if all(shift):
        return f"shift {shift[0]}x{shift[1]} = window {wh}x{ww} // 2 ({why})"
    parts = []
    for axis, side, s, m, n in (("rows", "height", shift[0], wh, h), ("columns", "width", shift[1], ww, w)):
        parts.append(f"{s} {axis} = {m} // 2" if s else f"no {axis}: map {side} {n} not larger than window {m}")
    return f"shift {shift[0]}x{shift[1]} ({'; '.join(parts)}; {why})"


def _window_reason(rules, size: tuple[int, int], window: tuple[int, int], configured: tuple[int, int]) -> str:
    if tuple(window) != tuple(configured):
        shown = configured[0] if configured[0] == configured[1] else f"{configured[0]}x{configured[1]}"
        return f"window {window[0]}x{window[1]}: shrunk from {shown} to the map ({rules.name} semantics)"
    return f"window {window[0]}x{window[1]}"


# The most attention-mask values a stage may hold (windows x tokens^2): swin_t's stage 1 at 2048x2048 holds 13M;
# beyond this the masks alone take gigabytes (8192x8192 ran out of memory, 100000 was killed without a word),
# and a picture of a million windows shows nothing.
MAX_MASK_VALUES = 2**25


def _check_mask_size(name: str, size: tuple[int, int], stage: int, map_size, window) -> None:
    wh, ww = (window, window) if isinstance(window, int) else window
    windows = -(-map_size[0] // wh) * -(-map_size[1] // ww)
    values = windows * (wh * ww) ** 2
    if values > MAX_MASK_VALUES:
        raise ValueError(
            f"--img-size {size[0]},{size[1]}: stage {stage} of {name} would have {windows} windows and "
            f"{values / 1e6:.0f}M attention-mask values (over {MAX_MASK_VALUES / 1e6:.0f}M); give a smaller "
            "--img-size or a later --stage"
        )


def stage_layout(
    name: str, img_size: tuple[int, int] | None = None, stage: int = 1, semantics: str = "classification"
) -> StageLayout:
    """The windows of stage ``stage`` (1-based) of the registered model ``name`` for a ``img_size`` input.

    The model is taken as built for that size (as ``swin flops`` builds it), so a classification stage whose
    map is not larger than the window gets the map as its window, as the official classifier.

    Raises:
        KeyError: unknown model.
        ValueError: bad semantics, stage out of range, image smaller than one patch.
    """
    rules = get_semantics(semantics)
    name = resolve_name(name)
    config = get_config(name)
    size = tuple(config.img_size if img_size is None else img_size)
    stages = len(config.depths)
    if not 1 <= stage <= stages:
        raise ValueError(
            f"--stage {stage} is out of range: {name} has stages 1..{stages} (as `swin info` numbers them)"
        )
    if min(size) < config.patch_size:
        raise ValueError(
            f"image {size[0]}x{size[1]} is smaller than one {config.patch_size}x{config.patch_size} patch; "
            f"give --img-size {config.patch_size} or more"
        )
    config = config.replace(img_size=size)
    map_size = config.stage_sizes()[stage - 1]
    window = config.stage_windows(rules.name)[stage - 1]
    _check_mask_size(name, size, stage, map_size, window)
    depth = config.depths[stage - 1]
    shifted = depth >= 2
    shift = rules.shift(*map_size, window, shifted)
    return StageLayout(
        model=name,
        img_size=size,
        semantics=rules.name,
        stage=stage,
        stages=stages,
        block=2 if shifted else 1,
        layout=layout_for(*map_size, window, shift, rules.pad_first),
        window_reason=_window_reason(rules, map_size, window, config.stage_window_sizes[stage - 1]),
        shift_reason=_shift_reason(rules, map_size, window, shift, depth),
    )


def check_window_index(stage: StageLayout, index: int | None) -> int:
    """``index``, or the last window (bottom right, where all regions meet) when None; a ``ValueError`` that
    says the valid range otherwise."""
    layout = stage.layout
    count = layout.num_windows
    if index is None:
        return count - 1
    if not 0 <= index < count:
        nh, nw = layout.grid
        raise ValueError(
            f"--window {index} is out of range: stage {stage.stage} of {stage.model} at {stage.img_size[0]}x"
            f"{stage.img_size[1]} has {count} windows ({nh}x{nw}), numbered 0..{count - 1} row by row"
        )
    return index


def to_json(stage: StageLayout) -> str:
    """The data of the figure as JSON, one key per line (the grids as compact nested lists).

    Grids are over the rolled, padded map (``padded_size``), rows first. ``source``: the input token
    (row * width + col) at each position, -1 for padding; ``region``: official region ids 0..8; ``window``:
    the window index of each position. ``window_tokens`` and ``window_regions``: per window (model order), the
    source token and the region id of each of its N tokens; ``masks``: per window, the N x N additive mask
    (0 or -100), or null when the block passes no mask (nothing shifted). ``pairs_across_seam``: query/key
    pairs of image tokens the mask allows across the seam of the roll (one wrapped around, the other not).
    """
    layout = stage.layout
    source_windows = layout.in_window_order(layout.source)
    data = {
        "model": stage.model,
        "img_size": list(stage.img_size),
        "semantics": stage.semantics,
        "stage": stage.stage,
        "block": stage.block,
        "map_size": list(layout.map_size),
        "padded_size": list(layout.padded),
        "window_size": list(layout.window),
        "shift": list(layout.shift),
        "order": "pad, then roll" if layout.pad_first else "roll, then pad",
        "window_reason": stage.window_reason,
        "shift_reason": stage.shift_reason,
        "windows": {"grid": list(layout.grid), "count": layout.num_windows, "tokens": layout.tokens},
        "source": layout.source.tolist(),
        "region": layout.region.tolist(),
        "window": layout.window_of().tolist(),
        "window_tokens": source_windows.tolist(),
        "window_regions": layout.in_window_order(layout.region).tolist(),
        "masks": None if layout.masks is None else layout.masks.long().tolist(),
        "pairs_across_seam": layout.pairs_across_seam(),
    }
    lines = [f"  {json.dumps(key)}: {json.dumps(value, separators=(',', ':'))}" for key, value in data.items()]
    return "{\n" + ",\n".join(lines) + "\n}"
