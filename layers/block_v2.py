"""The Swin V2 block: (shifted) window attention and an MLP with residual post-norm (Liu et al. 2022, fig. 1)."""

from __future__ import annotations

import torch

from .attention_v2 import WindowAttentionV2
from .block import SwinBlock
from .window import WindowPlans

__all__ = ["SwinBlockV2"]


class SwinBlockV2(SwinBlock):
    """x + DropPath(LN(W-MSA(x))), then x + DropPath(LN(MLP(x))), on (B, H, W, C) maps of any size.

    The windowing (shift, padding, the cached gather plan) is :class:`swin.layers.SwinBlock`'s; the norms
    move after attention and the MLP (res-post-norm), and attention is :class:`WindowAttentionV2`.

    Args:
        dim, num_heads, window, shifted, mlp_ratio, qkv_bias, drop, attn_drop, drop_path, semantics, plans:
            as :class:`swin.layers.SwinBlock`.
        pretrained_window: (wh, ww) window of pre-training for the position bias coordinates; (0, 0): none.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        window: tuple[int, int],
        shifted: bool = False,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        semantics: str = "classification",
        plans: WindowPlans | None = None,
        pretrained_window: tuple[int, int] = (0, 0),
    ):
        attention = WindowAttentionV2(dim, num_heads, tuple(window), qkv_bias, attn_drop, drop, pretrained_window)
        super().__init__(
            dim,
            num_heads,
            window,
            shifted,
            mlp_ratio,
            qkv_bias,
            drop,
            attn_drop,
            drop_path,
            semantics,
            attention,
            plans,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.norm1(self.shifted_window_attention(x)))
        return x + self.drop_path(self.norm2(self.mlp(x)))
