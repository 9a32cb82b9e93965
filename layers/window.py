"""Window partition / reverse, the cyclic shift, and the shifted-window region mask (paper section 3.2)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from einops import rearrange

__all__ = ["MASK_VALUE", "WindowPlan", "shift_mask", "window_partition", "window_plan", "window_reverse"]

# The official code adds -100 (not -inf) between tokens of different regions; every reference keeps it,
# so outputs stay comparable and a fully masked row can never turn into NaN.
MASK_VALUE = -100.0


def window_partition(x: torch.Tensor, window: tuple[int, int]) -> torch.Tensor:
    """(B, H, W, C) -> (B, nW, wh*ww, C); H and W must be multiples of the window."""
    wh, ww = window
    return rearrange(x, "b (nh wh) (nw ww) c -> b (nh nw) (wh ww) c", wh=wh, ww=ww)


def window_reverse(windows: torch.Tensor, window: tuple[int, int], height: int, width: int) -> torch.Tensor:
    """(B, nW, wh*ww, C) -> (B, H, W, C), the inverse of :func:`window_partition`."""
    wh, ww = window
    return rearrange(windows, "b (nh nw) (wh ww) c -> b (nh wh) (nw ww) c", nh=height // wh, wh=wh, ww=ww)


def shift_mask(
    height: int, width: int, window: tuple[int, int], shift: tuple[int, int], device: torch.device
) -> torch.Tensor:
    """Additive mask (nW, N, N) for a (height, width) map, window multiples, that was rolled by -shift.

    After the roll, the last ``shift`` rows (columns) hold tokens that wrapped around from the top (left).
    Tokens from the two sides of that seam share a window but were not neighbours, so attention between
    them is masked. The official code labels 3x3 slices; its slice boundary at ``-window`` never splits a
    window, so one boundary per axis, at ``-shift``, gives the same mask.
    """
    rows = (
        torch.arange(height, device=device) >= height - shift[0]
        if shift[0]
        else torch.zeros(height, dtype=torch.bool, device=device)
    )
    cols = (
        torch.arange(width, device=device) >= width - shift[1]
        if shift[1]
        else torch.zeros(width, dtype=torch.bool, device=device)
    )
    region = (rows[:, None].long() * 2 + cols[None, :].long())[None, :, :, None]  # 1, H, W, 1
    region = window_partition(region, window)[0, :, :, 0]  # nW, N
    return (region[:, :, None] != region[:, None, :]).float() * MASK_VALUE


@dataclass(frozen=True)
class WindowPlan:
    """How one map size is cut into (shifted) windows, as index tensors, so that pad + roll + partition is
    a single gather and its inverse (reverse + roll back + crop) another.

    Attributes:
        key: (padded_h, padded_w, shift_h, shift_w), what the attention bias depends on.
        padded: (padded_h, padded_w), the map size that is cut into windows.
        num_windows: windows per image.
        gather: (nW*N,) index into the flattened map for each window token; ``height*width`` points at a
            zero token that the caller appends when ``needs_zero``.
        scatter: (H*W,) index into the flattened windows for each map position.
        mask: (nW, N, N) additive shift mask, or None when nothing is shifted.
        needs_zero: whether ``gather`` refers to the zero (padding) token.
    """

    key: tuple[int, int, int, int]
    padded: tuple[int, int]
    num_windows: int
    gather: torch.Tensor
    scatter: torch.Tensor
    mask: torch.Tensor | None
    needs_zero: bool


@functools.lru_cache(maxsize=128)
def window_plan(
    height: int,
    width: int,
    window: tuple[int, int],
    shift: tuple[int, int],
    pad_first: bool,
    device: torch.device,
) -> WindowPlan:
    """The cached :class:`WindowPlan` for a (height, width) map.

    ``pad_first`` (detection semantics) pads to a window multiple and rolls the padded map; otherwise
    (classification semantics, as timm) the map is rolled, then padded. Derived state, never saved.
    """
    wh, ww = window
    padded_h, padded_w = height + -height % wh, width + -width % ww
    zero = height * width  # index of the appended zero token
    index = torch.full((padded_h, padded_w), zero, dtype=torch.long)
    index[:height, :width] = torch.arange(zero).view(height, width)
    # After a roll by -shift, position (i, j) holds what was at (i + shift) modulo the rolled extent.
    roll_h, roll_w = (padded_h, padded_w) if pad_first else (height, width)
    if shift[0]:
        index[:roll_h] = torch.roll(index[:roll_h], -shift[0], 0)
    if shift[1]:
        index[:, :roll_w] = torch.roll(index[:, :roll_w], -shift[1], 1)
    gather = window_partition(index[None, :, :, None], window).flatten()
    scatter = torch.empty(zero + 1, dtype=torch.long)
    scatter[gather] = torch.arange(gather.numel())
    mask = shift_mask(padded_h, padded_w, window, shift, device) if any(shift) else None
    return WindowPlan(
        key=(padded_h, padded_w, *shift),
        padded=(padded_h, padded_w),
        num_windows=(padded_h // wh) * (padded_w // ww),
        gather=gather.to(device),
        scatter=scatter[:zero].to(device),
        mask=mask,
        needs_zero=bool((gather == zero).any()),
    )
