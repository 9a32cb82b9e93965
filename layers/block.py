"""The Swin Transformer block: (shifted) window attention and an MLP, pre-norm residuals (paper eq. 3)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import DropPath
from torch import nn

from .attention import WindowAttention
from .mlp import Mlp
from .window import build_window_plan, window_plan

__all__ = ["SwinBlock", "SEMANTICS"]

# How a block treats maps that are not window multiples or not larger than the window:
# - "classification": the official classifier and timm. A map axis not larger than the window gets no shift
#   (the window itself was shrunk to the map when the model was built); the map is rolled, then padded.
# - "detection": the official detection backbone, mmdetection, torchvision and transformers. The window never
#   shrinks, odd blocks always shift, and the map is padded to a window multiple before it is rolled, so the
#   shift mask covers the padded map.
SEMANTICS = ("classification", "detection")


class SwinBlock(nn.Module):
    """x + DropPath(W-MSA(LN(x))), then x + DropPath(MLP(LN(x))), on (B, H, W, C) maps of any size.

    Args:
        dim: channels.
        num_heads: attention heads.
        window: (wh, ww) window in tokens.
        shifted: shift the windows by half a window before attention (the odd blocks of a stage).
        mlp_ratio: hidden width of the MLP over ``dim``.
        qkv_bias: learn a bias in the q/k/v projection.
        drop: dropout after the projections.
        attn_drop: dropout on attention probabilities.
        drop_path: stochastic depth rate of this block.
        semantics: "classification" or "detection", see :data:`SEMANTICS`.
        attention: the window attention module to use (Swin V2 passes its own); default
            :class:`WindowAttention` from the arguments above.
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
        attention: nn.Module | None = None,
    ):
        super().__init__()
        self.dim = dim
        self.window = tuple(window)
        self.shifted = shifted
        self.semantics = semantics
        self.norm1 = nn.LayerNorm(dim)
        self.attn = attention or WindowAttention(dim, num_heads, self.window, qkv_bias, attn_drop, drop)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop)

    def shift_for(self, height: int, width: int) -> tuple[int, int]:
        """The cyclic shift used for a (height, width) map, per axis."""
        if not self.shifted:
            return 0, 0
        wh, ww = self.window
        if self.semantics == "detection":
            return wh // 2, ww // 2
        return (0 if height <= wh else wh // 2), (0 if width <= ww else ww // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.window_attention(self.norm1(x)))
        return x + self.drop_path(self.mlp(self.norm2(x)))

    def window_attention(self, x: torch.Tensor) -> torch.Tensor:
        """Shift, partition, attend, merge, unshift; x: (B, H, W, C). Pad + roll + partition is one gather
        and its inverse another (see :class:`swin.layers.WindowPlan`)."""
        batch, height, width, channels = x.shape
        shift = self.shift_for(height, width)
        pad_first = self.semantics == "detection"
        tokens = x.reshape(batch, height * width, channels)
        if torch.compiler.is_compiling():
            # Traced (compile, export): sizes may be symbolic, so no cache and no size-dependent branch; the
            # zero token is always there (gather indices never point past it when nothing is padded).
            plan = build_window_plan(height, width, self.window, shift, pad_first, x.device)
            tokens = F.pad(tokens, (0, 0, 0, 1))
        else:
            plan = window_plan(height, width, self.window, shift, pad_first, x.device)
            if plan.needs_zero:
                tokens = F.pad(tokens, (0, 0, 0, 1))  # the zero token that padded positions gather
        windows = tokens.index_select(1, plan.gather).view(batch, plan.num_windows, -1, channels)
        windows = self.attn(windows, plan.mask, plan.key)
        merged = windows.reshape(batch, -1, channels).index_select(1, plan.scatter)
        return merged.view(batch, height, width, channels)

    def macs(self, height: int, width: int, padded: bool = False) -> int:
        """Norms, window attention and MLP, as the official ``flops()``.

        ``padded=False`` is the paper's count on the unpadded map (it assumes window multiples);
        ``padded=True`` counts attention over the padded map the forward really computes.
        """
        wh, ww = self.window
        tokens = height * width
        attn_h, attn_w = (height + -height % wh, width + -width % ww) if padded else (height, width)
        num_windows = attn_h * attn_w / (wh * ww)
        attention = num_windows * self.attn.macs(wh * ww)
        return int(2 * self.dim * tokens + attention + self.mlp.macs(tokens))
