"""Window multi-head self-attention with a learned relative position bias (paper eq. 4)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from timm.layers import trunc_normal_
from torch import nn

from .cache import TensorLRU
from .position_bias import relative_position_index

__all__ = ["WindowAttention", "cached_attention_bias"]


def cached_attention_bias(
    cache: TensorLRU,
    weights: Iterable[torch.Tensor],
    position_bias: Callable[[], torch.Tensor],
    mask: torch.Tensor | None,
    key: tuple,
    dtype: torch.dtype,
) -> torch.Tensor:
    """``position_bias()`` (heads, N, N) plus the shift mask (nW, N, N) as one additive tensor in ``dtype``:
    (1, heads, N, N) without a mask, (1, nW*heads, N, N) with one.

    Without autograd (inference) it is cached under ``key`` (padded size and shift), the device, dtype and
    the versions and storage of ``weights`` (the parameters it derives from), so new weights never meet a
    stale bias. Training and tracing recompute it (gradients must reach the weights).
    """
    caching = not torch.is_grad_enabled() and not torch.compiler.is_compiling()
    if caching:
        device = mask.device if mask is not None else None
        full_key = (key, device, dtype, tuple((w._version, w.data_ptr()) for w in weights))
        cached = cache.get(full_key)
        if cached is not None:
            return cached
    bias = position_bias().unsqueeze(0)  # 1, heads, N, N
    if mask is not None:
        n = mask.shape[-1]
        bias = (bias + mask.unsqueeze(1)).reshape(1, -1, n, n)  # 1, nW*heads, N, N
    bias = bias.to(dtype)
    if caching:
        cache.put(full_key, bias)
    return bias


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
        self._bias_cache = TensorLRU()  # merged bias+mask per input size, inference only
        trunc_normal_(self.relative_position_bias_table, std=0.02)

    def position_bias(self) -> torch.Tensor:
        """(heads, N, N) bias gathered from the table."""
        n = self.window[0] * self.window[1]
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)]
        return bias.view(n, n, self.num_heads).permute(2, 0, 1)

    def attention_bias(self, mask: torch.Tensor | None, key: tuple, dtype: torch.dtype) -> torch.Tensor:
        """Position bias plus shift mask as one additive tensor in ``dtype``, laid out for :meth:`forward`:
        (1, heads, N, N) without a mask, (1, nW*heads, N, N) with one.

        Without autograd (inference) the result is cached under ``key`` (the padded size and shift) with
        the device, dtype and the table's version, so new weights never meet a stale bias.
        """
        return cached_attention_bias(
            self._bias_cache, [self.relative_position_bias_table], self.position_bias, mask, key, dtype
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, key: tuple = ()) -> torch.Tensor:
        """x: (B, nW, N, C) windows; mask: (nW, N, N) shift mask or None; key: what identifies the mask
        (for the bias cache). Returns (B, nW, N, C)."""
        batch, windows, n, channels = x.shape
        heads, head_dim = self.num_heads, channels // self.num_heads
        qkv = self.qkv(x).view(batch, windows, n, 3, heads, head_dim).permute(3, 0, 1, 4, 2, 5)
        # SDPA's fused CPU kernel takes 4-D inputs. Without a mask the bias broadcasts over (B*nW); with one,
        # windows and heads share a dimension so that the (nW*heads) bias broadcasts over the batch. Eager
        # reshape copies only where it must (the masked layout). Traced with symbolic sizes, a reshape would
        # have to decide whether it is a view, i.e. whether there is one window, so there: one copy first.
        if torch.compiler.is_compiling():
            qkv = qkv.clone(memory_format=torch.contiguous_format)
        bias = self.attention_bias(mask, key, qkv.dtype)
        if mask is None:
            q, k, v = qkv.reshape(3, batch * windows, heads, n, head_dim).unbind(0)
        else:
            q, k, v = qkv.reshape(3, batch, windows * heads, n, head_dim).unbind(0)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=bias, dropout_p=self.attn_drop if self.training else 0.0
        )
        out = out.view(batch, windows, heads, n, head_dim).transpose(2, 3)
        # An explicit copy, then a view: with symbolic sizes the ONNX exporter takes reshape and contiguous()
        # for views of this transposed tensor and fails.
        out = out.clone(memory_format=torch.contiguous_format).view(batch, windows, n, channels)
        return self.proj_drop(self.proj(out))

    def macs(self, tokens: int) -> int:
        """Multiply-accumulates for one window of ``tokens`` tokens, as the official ``flops(N)``."""
        c = self.dim
        return tokens * c * 3 * c + 2 * tokens * tokens * c + tokens * c * c

    def _apply(self, fn, recurse=True):
        # Moving or casting the module invalidates cached tensors on the old device/dtype.
        self._bias_cache.clear()
        return super()._apply(fn, recurse)
