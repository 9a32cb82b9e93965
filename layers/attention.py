"""Window multi-head self-attention with a learned relative position bias (paper eq. 4)."""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from timm.layers import trunc_normal_
from torch import nn

from .position_bias import relative_position_index

__all__ = ["WindowAttention"]

# Merged bias+mask tensors kept per attention module; a stream of distinct input sizes evicts the oldest.
_CACHE_SIZE = 8


class WindowAttention(nn.Module):
    """Self-attention inside (wh x ww) windows: softmax(QK^T / sqrt(d) + B + mask) V.

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
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim={dim} is not divisible by num_heads={num_heads}; choose a divisor of dim")
        self.dim = dim
        self.num_heads = num_heads
        self.window = tuple(window)
        self.attn_drop = attn_drop
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        wh, ww = self.window
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * wh - 1) * (2 * ww - 1), num_heads))
        # Derived from the window alone: rebuilt on construction, never saved (not in state_dict).
        self.register_buffer("relative_position_index", relative_position_index(self.window), persistent=False)
        self._bias_cache: OrderedDict = OrderedDict()
        trunc_normal_(self.relative_position_bias_table, std=0.02)

    def position_bias(self) -> torch.Tensor:
        """(heads, N, N) bias gathered from the table."""
        n = self.window[0] * self.window[1]
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)]
        return bias.view(n, n, self.num_heads).permute(2, 0, 1)

    def attention_bias(self, mask: torch.Tensor | None, key: tuple, dtype: torch.dtype) -> torch.Tensor:
        """Position bias plus shift mask, one additive tensor (nW or 1, heads, N, N) in ``dtype``.

        Without autograd (inference) the merged tensor is cached under ``key`` (the padded size and shift)
        with the device, dtype and the table's version, so loading new weights drops stale entries.
        """
        caching = not torch.is_grad_enabled() and not torch.compiler.is_compiling()
        if caching:
            table = self.relative_position_bias_table
            full_key = (key, table.device, dtype, table._version, table.data_ptr())
            cached = self._bias_cache.get(full_key)
            if cached is not None:
                self._bias_cache.move_to_end(full_key)
                return cached
        bias = self.position_bias().unsqueeze(0)
        if mask is not None:
            bias = bias + mask.unsqueeze(1)
        bias = bias.to(dtype)
        if caching:
            self._bias_cache[full_key] = bias
            while len(self._bias_cache) > _CACHE_SIZE:
                self._bias_cache.popitem(last=False)
        return bias

    def forward(self, x: torch.Tensor, attn_bias: torch.Tensor) -> torch.Tensor:
        """x: (B, nW, N, C) windows; attn_bias: (nW or 1, heads, N, N). Returns (B, nW, N, C)."""
        batch, windows, n, channels = x.shape
        head_dim = channels // self.num_heads
        qkv = self.qkv(x).view(batch, windows, n, 3, self.num_heads, head_dim)
        q, k, v = qkv.permute(3, 0, 1, 4, 2, 5).unbind(0)  # each B, nW, heads, N, d
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_bias, dropout_p=self.attn_drop if self.training else 0.0
        )
        out = out.transpose(2, 3).reshape(batch, windows, n, channels)
        return self.proj_drop(self.proj(out))

    def macs(self, tokens: int) -> int:
        """Multiply-accumulates for one window of ``tokens`` tokens, as the official ``flops(N)``."""
        c = self.dim
        return tokens * c * 3 * c + 2 * tokens * tokens * c + tokens * c * c

    def _apply(self, fn, recurse=True):
        # Moving or casting the module invalidates cached tensors on the old device/dtype.
        self._bias_cache.clear()
        return super()._apply(fn, recurse)
