"""Window partition / reverse and the shifted-window region mask (paper section 3.2)."""

from __future__ import annotations

import functools

import torch
from einops import rearrange

__all__ = ["window_partition", "window_reverse", "shift_mask", "MASK_VALUE"]

# The official code adds -100 (not -inf) between tokens of different regions; every reference keeps it,
# so outputs stay bit-comparable and a fully masked row can never turn into NaN.
MASK_VALUE = -100.0


def window_partition(x: torch.Tensor, window: tuple[int, int]) -> torch.Tensor:
    """(B, H, W, C) -> (B, nW, wh*ww, C); H and W must be multiples of the window."""
    wh, ww = window
    return rearrange(x, "b (nh wh) (nw ww) c -> b (nh nw) (wh ww) c", wh=wh, ww=ww)


def window_reverse(windows: torch.Tensor, window: tuple[int, int], height: int, width: int) -> torch.Tensor:
    """(B, nW, wh*ww, C) -> (B, H, W, C), the inverse of :func:`window_partition`."""
    wh, ww = window
    return rearrange(windows, "b (nh nw) (wh ww) c -> b (nh wh) (nw ww) c", nh=height // wh, wh=wh, ww=ww)


@functools.lru_cache(maxsize=64)
def shift_mask(
    height: int, width: int, window: tuple[int, int], shift: tuple[int, int], device: torch.device
) -> torch.Tensor:
    """Additive mask (nW, N, N) for a map of (height, width) that was rolled by -shift.

    After the roll, the last ``shift`` rows (columns) hold tokens that wrapped around from the top (left).
    Tokens from different sides of that seam share a window but were not neighbours, so attention between
    them is masked. The official code labels 3x3 slices; the slice boundary at ``-window`` never splits a
    window, so one boundary per axis, at ``-shift``, gives the same mask. Cached: it depends only on its
    arguments, and is derived state that never goes into a state dict.
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
    region = window_partition(region, window).squeeze(-1)[0]  # nW, N
    different = region[:, :, None] != region[:, None, :]
    return different.float() * MASK_VALUE
