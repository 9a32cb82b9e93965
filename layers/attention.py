"""Window multi-head self-attention with a learned relative position bias (paper eq. 4)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from timm.layers import trunc_normal_
from torch import nn

from .cache import TensorLRU
from .position_bias import relative_position_index

__all__ = ["WindowAttention", "WindowAttentionBase", "bias_for_windows", "cached_attention_bias", "windowed_sdpa"]


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


def bias_for_windows(bias: torch.Tensor, window_range: tuple[int, int] | None, heads: int) -> torch.Tensor:
    """The part of a merged (1, nW*heads, N, N) bias for windows ``first:stop`` of each image (a view); an
    unmasked (1, heads, N, N) bias or ``window_range=None`` is returned as is."""
    if window_range is None or bias.shape[1] == heads:
        return bias
    return bias[:, window_range[0] * heads : window_range[1] * heads]


def windowed_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor,
    masked: bool,
    dropout: float = 0.0,
    scale: float | None = None,
) -> torch.Tensor:
    """Scaled dot-product attention of (B, nW, heads, N, d) q, k, v with a merged bias (see
    :func:`cached_attention_bias`); the heads' outputs side by side, (B, nW, N, heads*d).

    SDPA's fused CPU kernel takes 4-D inputs. Without a mask the bias broadcasts over (B*nW); with one,
    windows and heads share a dimension so that the (nW*heads) bias broadcasts over the batch, which costs a
    copy of q/k/v unless there is one image (then the bias is viewed per window). Eager, reshapes stay views
    where they can, and SDPA called on views of the projection writes its output already in token-major order.
    Traced with symbolic sizes a reshape would have to decide whether it is a view, and the ONNX exporter
    fails on reshape of the transposed output, so there: explicit copies, then views.
    """
    batch, windows, heads, n, head_dim = q.shape
    tracing = torch.compiler.is_compiling()
    if tracing:
        q, k, v = (t.clone(memory_format=torch.contiguous_format) for t in (q, k, v))
    if not masked or (batch == 1 and not tracing):
        shape = (batch * windows, heads, n, head_dim)
        if masked:
            bias = bias.view(windows, heads, n, n)
    else:
        shape = (batch, windows * heads, n, head_dim)
    q, k, v = (t.reshape(shape) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout, scale=scale)
    out = out.view(batch, windows, heads, n, head_dim).transpose(2, 3)
    if tracing:
        return out.clone(memory_format=torch.contiguous_format).view(batch, windows, n, heads * head_dim)
    return out.reshape(batch, windows, n, heads * head_dim)


class WindowAttentionBase(nn.Module):
    """What V1 and V2 window attention share: ``forward`` is the output projection of :meth:`mix`, the
    official MAC count, and a bias cache cleared when the module moves or changes dtype. Subclasses define
    ``mix`` (attention before the projection), ``proj`` and ``proj_drop``."""

    def __init__(self, dim: int, num_heads: int, window: tuple[int, int], attn_drop: float):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim={dim} is not divisible by num_heads={num_heads}; choose a divisor of dim")
        self.dim = dim
        self.num_heads = num_heads
        self.window = tuple(window)
        self.attn_drop = attn_drop
        self._bias_cache = TensorLRU()  # merged bias+mask per input size, inference only

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        key: tuple = (),
        window_range: tuple[int, int] | None = None,
    ) -> torch.Tensor:
        """x: (B, nW, N, C) windows; mask: (nW, N, N) shift mask or None; key: what identifies the mask
        (for the bias cache); window_range: (first, stop) when x holds only those windows of each image
        (chunked inference). Returns (B, nW, N, C)."""
        return self.proj_drop(self.proj(self.mix(x, mask, key, window_range)))

    def macs(self, tokens: int) -> int:
        """Multiply-accumulates for one window of ``tokens`` tokens, as the official ``flops(N)`` (V2's too,
        which like V1 leaves out the position bias: it runs once per window size, not per window)."""
        c = self.dim
        return tokens * c * 3 * c + 2 * tokens * tokens * c + tokens * c * c

    def _apply(self, fn, recurse=True):
        # Moving or casting the module invalidates cached tensors on the old device/dtype.
        self._bias_cache.clear()
        return super()._apply(fn, recurse)


class WindowAttention(WindowAttentionBase):
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
        super().__init__(dim, num_heads, window, attn_drop)
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        wh, ww = self.window
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * wh - 1) * (2 * ww - 1), num_heads))
        # Derived from the window alone: rebuilt on construction, never saved (not in state_dict).
        self.register_buffer("relative_position_index", relative_position_index(self.window), persistent=False)
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

    def mix(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        key: tuple = (),
        window_range: tuple[int, int] | None = None,
    ) -> torch.Tensor:
        """Attention before the output projection: the heads' outputs side by side, (B, nW, N, C)."""
        batch, windows, n, channels = x.shape
        heads, head_dim = self.num_heads, channels // self.num_heads
        qkv = self.qkv(x).view(batch, windows, n, 3, heads, head_dim).permute(3, 0, 1, 4, 2, 5)
        bias = bias_for_windows(self.attention_bias(mask, key, qkv.dtype), window_range, heads)
        q, k, v = qkv.unbind(0)
        return windowed_sdpa(q, k, v, bias, mask is not None, self.attn_drop if self.training else 0.0)
