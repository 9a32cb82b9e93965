"""Swin V2 window attention: scaled cosine attention with a continuous position bias (Liu et al. 2022, eq. 2-4)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .attention import WindowAttentionBase
from .position_bias import relative_position_index

__all__ = ["WindowAttentionV2", "log_spaced_coords"]

# The learned temperature is clamped at 1 / 0.01 (official and timm: max=log(1 / 0.01)).
LOGIT_SCALE_MAX = math.log(100.0)


def log_spaced_coords(window: tuple[int, int], pretrained_window: tuple[int, int] = (0, 0)) -> torch.Tensor:
    """((2*wh-1)*(2*ww-1), 2) relative offsets (dy, dx), scaled to [-8, 8] and log-spaced (paper eq. 4).

    Offsets are divided by ``pretrained_window - 1`` when one is given (so a checkpoint trained at window 12
    sees the same coordinates for the same offsets at window 16), else by ``window - 1``; then
    sign(x) * log2(1 + |x|) / log2(8). Rows follow :func:`relative_position_index` (dy first).
    """
    wh, ww = window
    ys = torch.arange(-(wh - 1), wh, dtype=torch.float32)
    xs = torch.arange(-(ww - 1), ww, dtype=torch.float32)
    table = torch.stack(torch.meshgrid(ys, xs, indexing="ij"), dim=-1)  # 2wh-1, 2ww-1, 2
    norm_h, norm_w = pretrained_window if pretrained_window[0] > 0 else window
    # max(.., 1): a window of 1 has only the offset 0 (timm's guard against 0 / 0).
    table = table / torch.tensor([max(norm_h - 1, 1), max(norm_w - 1, 1)], dtype=torch.float32) * 8
    table = torch.sign(table) * torch.log2(table.abs() + 1.0) / math.log2(8)
    return table.reshape(-1, 2)


class WindowAttentionV2(WindowAttentionBase):
    """Self-attention inside (wh x ww) windows: softmax(tau * cos(q, k) + 16 * sigmoid(MLP(coords)) + mask) V.

    Official key names: ``qkv.weight`` (no bias), ``q_bias``, ``v_bias`` (the k bias is fixed at zero),
    ``logit_scale`` (per-head log temperature tau), ``cpb_mlp.0`` / ``cpb_mlp.2`` (the continuous position
    bias MLP), ``proj``. The coordinates table and the index are derived and never saved.

    Args:
        dim: channels of the tokens.
        num_heads: attention heads; ``dim`` must be divisible by it.
        window: (wh, ww) window in tokens.
        qkv_bias: learn the q and v biases.
        attn_drop: dropout on attention probabilities (training only).
        proj_drop: dropout after the output projection.
        pretrained_window: (wh, ww) window the weights were trained at; (0, 0) means ``window``.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        window: tuple[int, int],
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        pretrained_window: tuple[int, int] = (0, 0),
    ):
        super().__init__(dim, num_heads, window, attn_drop)
        self.pretrained_window = tuple(pretrained_window)
        self.logit_scale = nn.Parameter(torch.full((num_heads, 1, 1), math.log(10.0)))
        self.cpb_mlp = nn.Sequential(nn.Linear(2, 512), nn.ReLU(inplace=True), nn.Linear(512, num_heads, bias=False))
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.q_bias = nn.Parameter(torch.zeros(dim)) if qkv_bias else None
        self.v_bias = nn.Parameter(torch.zeros(dim)) if qkv_bias else None
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        # Derived from the window alone: rebuilt on construction, never saved (not in state_dict).
        coords = log_spaced_coords(self.window, self.pretrained_window)
        self.register_buffer("relative_coords_table", coords, persistent=False)
        self.register_buffer("relative_position_index", relative_position_index(self.window), persistent=False)

    def _apply(self, fn, recurse: bool = True):
        """As ``nn.Module._apply`` (``.to()``, ``.half()``, ...), keeping the coordinates table in float32: it is
        derived, and converted with the weights it would stay rounded after a round trip (``.bfloat16().float()``)
        while a fresh model computes it exactly; :meth:`position_bias` casts it to the weights' dtype per call."""
        super()._apply(fn, recurse)
        table = self.relative_coords_table
        if table.dtype != torch.float32:
            self.relative_coords_table = log_spaced_coords(self.window, self.pretrained_window).to(table.device)
        return self

    def derived_buffers(self) -> dict[str, torch.Tensor]:
        return super().derived_buffers() | {
            "relative_coords_table": log_spaced_coords(self.window, self.pretrained_window)
        }

    def position_bias(self) -> torch.Tensor:
        """(heads, N, N) continuous position bias, 16 * sigmoid(MLP(coords)) gathered per query/key pair."""
        n = self.window[0] * self.window[1]
        # in the parameters' dtype, read from one this module owns: cpb_mlp[0] may be a user's wrapper or a
        # quantized Linear, whose weight is not a tensor attribute
        table = self.cpb_mlp(self.relative_coords_table.to(self.logit_scale.dtype))  # entries, heads
        # (heads, N, N) contiguous, as V1's (see WindowAttention.position_bias)
        bias = table[self.relative_position_index.view(-1)].view(n, n, self.num_heads).permute(2, 0, 1).contiguous()
        return 16 * torch.sigmoid(bias)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        batch, windows, n, channels = x.shape
        heads, head_dim = self.num_heads, channels // self.num_heads
        qkv = self.qkv(x)  # through the module, so that a wrapper or a quantized linear is used
        if self.q_bias is not None:  # the k bias is fixed at zero (official)
            qkv = qkv + torch.cat((self.q_bias, torch.zeros_like(self.q_bias), self.v_bias))
        qkv = qkv.view(batch, windows, n, 3, heads, head_dim)
        q, k, v = qkv.permute(3, 0, 1, 4, 2, 5).unbind(0)  # each B, nW, heads, N, d
        # Scaled cosine attention (paper eq. 2): tau * cos(q, k); the temperature scales the unit queries, so
        # attention runs with scale 1.
        scale = torch.clamp(self.logit_scale, max=LOGIT_SCALE_MAX).exp()  # heads, 1, 1
        q = F.normalize(q, dim=-1) * scale
        k = F.normalize(k, dim=-1)
        return self.proj_drop(self.proj(self.attend(q, k, v, mask, scale=1.0)))
