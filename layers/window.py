"""Window partition / reverse, the cyclic shift, and the shifted-window region mask (paper section 3.2)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from .lru import BoundedLRU

__all__ = [
    "MASK_VALUE",
    "WindowPlan",
    "WindowPlans",
    "build_window_plan",
    "pinning_window_plans",
    "shift_mask",
    "unpin_window_plans",
]

# The official code adds -100 (not -inf) between tokens of different regions; every reference keeps it,
# so outputs stay comparable and a fully masked row can never turn into NaN.
MASK_VALUE = -100.0


def _mod(values: torch.Tensor, divisor: int) -> torch.Tensor:
    """values % divisor as floor division, which ONNX export can take with a symbolic divisor."""
    return values - (values // divisor) * divisor


def _window_coordinates(height: int, width: int, window: tuple[int, int], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and column, in a (height, width) map of window multiples, of each token in window order
    (windows row-major, tokens row-major inside a window), as the official ``window_partition`` orders them.

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
            zero token that the caller appends when ``pad_token``.
        scatter: (H*W,) index into the flattened windows for each map position.
        mask: (nW, N, N) additive shift mask, or None when nothing is shifted.
        pad_token: whether the caller appends the zero token (always, in plans built for tracing, whose
            sizes may be symbolic).
    """

    key: tuple[int, int, int, int]
    padded: tuple[int, int]
    num_windows: int
    gather: torch.Tensor
    scatter: torch.Tensor
    mask: torch.Tensor | None
    pad_token: bool

    @property
    def nbytes(self) -> int:
        mask = 0 if self.mask is None else self.mask.nbytes
        return self.gather.nbytes + self.scatter.nbytes + mask


def build_window_plan(
    height: int,
    width: int,
    window: tuple[int, int],
    shift: tuple[int, int],
    pad_first: bool,
    device: torch.device,
    traced: bool = False,
) -> WindowPlan:
    """The :class:`WindowPlan` for a (height, width) map (:class:`WindowPlans` caches them).

    ``pad_first`` (detection semantics) pads to a window multiple and rolls the padded map; otherwise
    (classification semantics, as timm) the map is rolled, then padded. ``traced``: for a graph whose sizes
    may be symbolic, so the zero token is always appended (its index is never gathered when nothing is
    padded) rather than decided from the sizes. Derived state, never saved.
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
        pad_token=traced or gather.numel() > zero,
    )


_PINNING = threading.local()


@contextmanager
def pinning_window_plans() -> Iterator[None]:
    """Within this block (this thread), every window plan an eager forward uses is also pinned: kept until
    :func:`unpin_window_plans` and read by graphs compiled later for the same sizes (see :class:`WindowPlans`)."""
    before = getattr(_PINNING, "on", False)
    _PINNING.on = True
    try:
        yield
    finally:
        _PINNING.on = before


def unpin_window_plans(model: torch.nn.Module) -> None:
    """Drop the pinned window plans of every block of ``model`` (``swin.optimize`` does when it compiles again:
    after a weight update or a move to another device)."""
    for module in model.modules():
        plans = getattr(module, "plans", None)
        if isinstance(plans, WindowPlans):
            plans.unpin()


class WindowPlans:
    """The window plans one model uses, per map size, shift, padding order and device.

    A plan depends only on those (no weights), so a cached plan is never stale. Each model holds its own
    (freed with it), bounded in entries and bytes: a stream of new image sizes cannot grow memory.

    When traced (``torch.compile``, ``torch.export``): with symbolic sizes a plan is built in the graph; with
    static sizes a plan pinned by an earlier eager forward (under :func:`pinning_window_plans`, as
    ``swin.optimize`` does before compiling) is read instead, so that its tensors are constants of the graph
    and inductor's freezing folds the shift mask into the attention bias, where a plan built in the graph
    would be computed again on every call. Pinned plans are not evicted (dynamo guards on each one it read)
    but have a byte budget of their own, the cache's: past it, plans are not pinned and graphs build them.
    """

    def __init__(self, max_items: int = 16, max_bytes: int = 64 << 20):
        self._cache = BoundedLRU(max_items, max_bytes)

    def get(
        self,
        height: int,
        width: int,
        window: tuple[int, int],
        shift: tuple[int, int],
        pad_first: bool,
        device: torch.device,
    ) -> WindowPlan:
        key = (height, width, window, shift, pad_first, device)
        if torch.compiler.is_compiling():
            # Only where something is pinned (swin.optimize): dynamo shows a symbolic size as an int, and looking
            # it up fixes it, so a user's torch.compile(dynamic=True) recompiled for every size.
            static = type(height) is int and type(width) is int  # (not a SymInt, outside dynamo)
            plan = self._cache.pinned(key) if static and self._cache.has_pinned() else None
            if plan is None:
                plan = build_window_plan(height, width, window, shift, pad_first, device, traced=True)
            return plan
        plan = self._cache.get(key)
        if plan is None:
            # Built outside inference mode, so that a plan first made under torch.inference_mode() still
            # serves a training step later (autograd refuses to save inference tensors; index_select saves
            # its index).
            with torch.inference_mode(False):
                plan = build_window_plan(height, width, window, shift, pad_first, device)
            if not all(type(t) is torch.Tensor for t in (plan.gather, plan.scatter, plan.mask) if t is not None):
                return plan  # made under a FakeTensorMode (or another mode's subclass): this call's only
            # the model moved (.to(device)): the plans of the device it left would hold its memory until evicted
            self._cache.discard(lambda cached: cached[-1] != device)
            self._cache.put(key, plan)
        if getattr(_PINNING, "on", False):
            self._cache.pin(key, plan)
        return plan

    def clear(self) -> None:
        """Empty the cache (pinned plans stay; :meth:`unpin` drops them)."""
        self._cache.clear()

    def unpin(self) -> None:
        self._cache.unpin_all()

    def __len__(self) -> int:
        return len(self._cache)

    @property
    def nbytes(self) -> int:
        return self._cache.nbytes
