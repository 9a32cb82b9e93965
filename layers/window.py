"""Window partition / reverse, the cyclic shift, and the shifted-window region mask (paper section 3.2)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from einops import rearrange

__all__ = [
    "MASK_VALUE",
    "WindowPlan",
    "build_window_plan",
    "shift_mask",
    "window_partition",
    "window_plan",
    "window_reverse",
]

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


def _mod(values: torch.Tensor, divisor: int) -> torch.Tensor:
    """values % divisor as floor division, which ONNX export can take with a symbolic divisor."""
    return values - (values // divisor) * divisor


def _window_coordinates(height: int, width: int, window: tuple[int, int], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and column, in a (height, width) map of window multiples, of each token in window order
    (windows row-major, tokens row-major inside a window): what :func:`window_partition` would gather.

    Plain arithmetic on an arange rather than reshapes, so that tracing with symbolic sizes (torch.export,
    ONNX) needs no guard on how many windows there are.
    """
    wh, ww = window
    per_row = width // ww
    token = torch.arange(height * width, device=device)
    window_id, inside = token // (wh * ww), token % (wh * ww)
    rows = (window_id // per_row) * wh + inside // ww
    cols = _mod(window_id, per_row) * ww + inside % ww
    return rows, cols


def shift_mask(
    height: int, width: int, window: tuple[int, int], shift: tuple[int, int], device: torch.device
) -> torch.Tensor:
    """Additive mask (nW, N, N) for a (height, width) map, window multiples, that was rolled by -shift.

    After the roll, the last ``shift`` rows (columns) hold tokens that wrapped around from the top (left).
    Tokens from the two sides of that seam share a window but were not neighbours, so attention between
    them is masked. The official code labels 3x3 slices; its slice boundary at ``-window`` never splits a
    window, so one boundary per axis, at ``-shift``, gives the same mask.
    """
    rows, cols = _window_coordinates(height, width, window, device)
    n = window[0] * window[1]
    # (a zero shift marks nothing: rows >= height never holds)
    region = (rows >= height - shift[0]).long() * 2 + (cols >= width - shift[1]).long()
    region = region.view(-1, n)  # nW, N
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
    """

    key: tuple[int, int, int, int]
    padded: tuple[int, int]
    num_windows: int
    gather: torch.Tensor
    scatter: torch.Tensor
    mask: torch.Tensor | None

    @property
    def needs_zero(self) -> bool:
        """Whether ``gather`` refers to the zero (padding) token."""
        return self.gather.numel() > self.scatter.numel()


def build_window_plan(
    height: int,
    width: int,
    window: tuple[int, int],
    shift: tuple[int, int],
    pad_first: bool,
    device: torch.device,
) -> WindowPlan:
    """The :class:`WindowPlan` for a (height, width) map (:func:`window_plan` is the cached version).

    ``pad_first`` (detection semantics) pads to a window multiple and rolls the padded map; otherwise
    (classification semantics, as timm) the map is rolled, then padded. Derived state, never saved.
    """
    wh, ww = window
    padded_h, padded_w = height + -height % wh, width + -width % ww
    zero = height * width  # index of the appended zero token
    # Window token -> position in the rolled, padded map -> position in the input map.
    rows, cols = _window_coordinates(padded_h, padded_w, window, torch.device("cpu"))
    if pad_first:  # roll over the padded map: content beyond the input is padding
        rows, cols = _mod(rows + shift[0], padded_h), _mod(cols + shift[1], padded_w)
        inside = (rows < height) & (cols < width)
    else:  # roll within the input, then pad
        inside = (rows < height) & (cols < width)
        rows, cols = _mod(rows + shift[0], height), _mod(cols + shift[1], width)
    gather = torch.where(inside, rows * width + cols, zero)
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
    )


@functools.lru_cache(maxsize=128)
def window_plan(
    height: int,
    width: int,
    window: tuple[int, int],
    shift: tuple[int, int],
    pad_first: bool,
    device: torch.device,
) -> WindowPlan:
    """:func:`build_window_plan`, cached: plans depend only on their arguments (derived state, never saved).

    Built outside inference mode, so a plan first made under ``torch.inference_mode()`` still serves a
    training step later (autograd refuses to save inference tensors, and index_select saves its index).
    """
    with torch.inference_mode(False):
        return build_window_plan(height, width, window, shift, pad_first, device)
