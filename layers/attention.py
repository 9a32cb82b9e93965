"""Window multi-head self-attention with a learned relative position bias (paper eq. 4)."""

from __future__ import annotations

import torch
from torch import nn

from .execution import merged_bias, module_attention, observed, window_sdpa
from .position_bias import relative_position_index, resize_bias_table

__all__ = ["WindowAttention", "WindowAttentionBase"]


class WindowAttentionBase(nn.Module):
    """What V1 and V2 window attention share: the constructor checks, the merged bias and the official MAC
    count. Subclasses define ``position_bias()`` (heads, N, N) and ``forward(x, mask)``.

    The contract of ``forward``: x (B, nW, N, C) windows of N = wh*ww tokens and the shift mask (nW, N, N)
    or None; returns (B, nW, N, C), output projection included. The position bias is computed from the
    parameters on every call (a gather of a small table, or V2's small MLP), so it can never be stale.
    """

    def __init__(self, dim: int, num_heads: int, window: tuple[int, int], attn_drop: float):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim={dim} is not divisible by num_heads={num_heads}; choose a divisor of dim")
        self.dim = dim
        self.num_heads = num_heads
        self.window = tuple(window)
        # The official modules around the probabilities: called where a user's code watches or replaces them (a
        # hook on attn.softmax gets the attention maps, as on the official code); else one kernel does their work.
        self.softmax = nn.Softmax(dim=-1)
        self.attn_drop = nn.Dropout(attn_drop)

    def position_bias(self) -> torch.Tensor:
        raise NotImplementedError

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float | None = None
    ) -> torch.Tensor:
        """softmax(q k^T * scale + position bias + mask) v for (B, nW, heads, N, d) q, k, v, as (B, nW, N, heads*d):
        through ``softmax`` and ``attn_drop`` when a user's code watches or replaces them, else in one kernel
        (:func:`swin.layers.execution.window_sdpa`, which applies the dropout itself)."""
        softmax, attn_drop = self.softmax, self.attn_drop
        # the kernels do the work of exactly these two: a softmax over keys and a dropout, neither watched
        own = type(softmax) is nn.Softmax and softmax.dim in (-1, 4) and type(attn_drop) is nn.Dropout
        if not own or observed(softmax) or observed(attn_drop):
            return module_attention(q, k, v, self.position_bias(), mask, softmax, attn_drop, scale)
        return window_sdpa(q, k, v, self.position_bias(), mask, attn_drop.p if attn_drop.training else 0.0, scale)

    def __setstate__(self, state: dict) -> None:
        # A module pickled whole before it had the official softmax and attn_drop modules (attn_drop was its rate).
        super().__setstate__(state)
        if "softmax" not in self._modules:
            rate = self.__dict__.pop("attn_drop", 0.0)
            self.softmax = nn.Softmax(dim=-1).train(self.training)
            self.attn_drop = nn.Dropout(rate).train(self.training)

    def derived_buffers(self) -> dict[str, torch.Tensor]:
        """The buffers derived from the window alone (never saved), as built (timm's name for rebuilding them:
        ``init_non_persistent_buffers``)."""
        return {"relative_position_index": relative_position_index(self.window)}

    @torch.no_grad()
    def init_non_persistent_buffers(self) -> None:
        """Compute the derived buffers again in place, on their device: after ``to_empty()`` of a model built on
        the ``meta`` device they hold whatever memory held (``load_state_dict`` does not carry them). A buffer
        still on ``meta`` (``load_state_dict(..., assign=True)`` gave the parameters storage, not the buffers) is
        made anew on the parameters' device."""
        for name, value in self.derived_buffers().items():
            buffer = getattr(self, name)
            if buffer.is_meta:
                device = next((p.device for p in self.parameters() if not p.is_meta), None)
                if device is not None:
                    setattr(self, name, value.to(device))
            else:
                buffer.copy_(value)

    @torch.no_grad()
    def set_window(self, window: tuple[int, int]) -> None:
        """Attend in (wh, ww) windows from now on: the derived buffers made anew for it, on their device
        (subclasses fit their parameters too)."""
        self.window = tuple(window)
        for name, value in self.derived_buffers().items():
            buffer = getattr(self, name)
            setattr(self, name, value.to(buffer.device, buffer.dtype if buffer.is_floating_point() else None))

    def attention_bias(self, mask: torch.Tensor | None, dtype: torch.dtype | None) -> torch.Tensor:
        """Position bias plus shift mask as one additive tensor in ``dtype`` (None: as computed, the
        parameters' dtype): (1, heads, N, N) without a mask, (1, nW*heads, N, N) with one."""
        bias = merged_bias(self.position_bias(), mask)
        return bias if dtype is None else bias.to(dtype)

    def macs(self, tokens: int) -> int:
        """Multiply-accumulates for one window of ``tokens`` tokens, as the official ``flops(N)`` (V2's too,
        which like V1 leaves out the position bias: it runs once per window size, not per window)."""
        c = self.dim
        return tokens * c * 3 * c + 2 * tokens * tokens * c + tokens * c * c


class WindowAttention(WindowAttentionBase):
    """Self-attention inside (wh x ww) windows: softmax(QK^T / sqrt(d) + B + mask) V, then the projection.

    Args:
        dim: channels of the tokens.
        num_heads: attention heads; ``dim`` must be divisible by it.
        window: (wh, ww) window in tokens; sets the size of ``relative_position_bias_table``.
        qkv_bias: learn a bias in the fused q/k/v projection (the official models do).
        attn_drop: dropout on attention probabilities (training only).
        proj_drop: dropout after the output projection.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        window: tuple[int, int],
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
    ):
        super().__init__(dim, num_heads, window, attn_drop)
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        wh, ww = self.window
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * wh - 1) * (2 * ww - 1), num_heads))
        # Derived from the window alone: rebuilt on construction, never saved (not in state_dict).
        self.register_buffer("relative_position_index", relative_position_index(self.window), persistent=False)
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)

    @torch.no_grad()
    def set_window(self, window: tuple[int, int]) -> None:
        """As :meth:`WindowAttentionBase.set_window`, with the bias table resized to the new window's offsets
        (bicubic, as the official fine-tuning at another window): a new parameter, as timm's
        ``set_window_size`` makes (an optimizer built before holds the old one)."""
        old, window = self.window, tuple(window)
        super().set_window(window)
        if window != old:
            table = self.relative_position_bias_table
            self.relative_position_bias_table = nn.Parameter(
                resize_bias_table(table.detach(), old, window), requires_grad=table.requires_grad
            )

    def position_bias(self) -> torch.Tensor:
        """(heads, N, N) bias gathered from the table."""
        n = self.window[0] * self.window[1]
        # Contiguous (heads, N, N): the layout a frozen graph keeps for it, and the one its fused softmax reads
        # vectorized (gathered along the table's columns instead, its gradient came out transposed).
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)]
        return bias.view(n, n, self.num_heads).permute(2, 0, 1).contiguous()

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        batch, windows, n, channels = x.shape
        heads = self.num_heads
        qkv = self.qkv(x).view(batch, windows, n, 3, heads, channels // heads).permute(3, 0, 1, 4, 2, 5)
        q, k, v = qkv.unbind(0)  # each B, nW, heads, N, d
        # position bias and mask apart: window_sdpa merges them or its kernel adds them, casting as it needs
        return self.proj_drop(self.proj(self.attend(q, k, v, mask)))
