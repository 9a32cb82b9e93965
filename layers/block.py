"""The Swin Transformer block: (shifted) window attention and an MLP, pre-norm residuals (paper eq. 3)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .attention import WindowAttention, WindowAttentionBase
from .drop_path import DropPath
from .mlp import Mlp
from .semantics import get_semantics
from .window import WindowPlans

__all__ = ["SwinBlock", "partition_windows"]


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
        semantics: "classification" or "detection" (see :mod:`swin.layers.semantics`).
        attention: the window attention module to use (Swin V2 passes its own); default
            :class:`WindowAttention` from the arguments above.
        plans: the window plans cache to use (a stage shares one between its blocks); default: its own.
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
        plans: WindowPlans | None = None,
    ):
        super().__init__()
        self.dim = dim
        self.window = tuple(window)
        self.shifted = shifted
        self.rules = get_semantics(semantics)
        self.semantics = self.rules.name
        self.hidden_dim = int(dim * mlp_ratio)
        self.norm1 = nn.LayerNorm(dim)
        self.attn = attention or WindowAttention(dim, num_heads, self.window, qkv_bias, attn_drop, drop)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, self.hidden_dim, drop)
        self.plans = plans if plans is not None else WindowPlans()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.shifted_window_attention(self.norm1(x)))
        return x + self.drop_path(self.mlp(self.norm2(x)))

    def set_window(self, window: tuple[int, int]) -> None:
        """Partition into (wh, ww) windows from now on, the attention inside too (found through any wrapper
        around it); the shift follows the window on every call."""
        self.window = tuple(window)
        for module in self.attn.modules():
            if isinstance(module, WindowAttentionBase):
                module.set_window(self.window)

    def shift_for(self, height: int, width: int) -> tuple[int, int]:
        """The cyclic shift used for a (height, width) map, per axis."""
        return self.rules.shift(height, width, self.window, self.shifted)

    def shifted_window_attention(self, x: torch.Tensor) -> torch.Tensor:
        """Shift, partition, attend, merge, unshift; x: (B, H, W, C). Pad + roll + partition is one gather
        and its inverse another (see :class:`swin.layers.WindowPlan`)."""
        batch, height, width, channels = x.shape
        windows, mask, scatter = partition_windows(self, x)
        merged = self.attn(windows, mask).flatten(1, 2).index_select(1, scatter)
        return merged.view(batch, height, width, channels)

    def padded_size(self, height: int, width: int) -> tuple[int, int]:
        """The map size attention runs on: (height, width) padded to window multiples."""
        wh, ww = self.window
        return height + -height % wh, width + -width % ww

    def attention_macs(self, height: int, width: int) -> dict[str, int]:
        """Attention on a (height, width) map three ways: ``msa`` global self-attention (all tokens in one
        window: the paper's Omega(MSA) = 4hwC^2 + 2(hw)^2 C), ``wmsa`` over hw/M^2 windows (Omega(W-MSA) =
        4hwC^2 + 2M^2 hwC) and ``wmsa_padded``, over the padded map the forward computes."""
        n = self.window[0] * self.window[1]
        per_window = self.attn.macs(n)  # N * (4C^2 + 2NC): divisible by N, so the sums stay exact
        padded_h, padded_w = self.padded_size(height, width)
        return {
            "msa": self.attn.macs(height * width),
            "wmsa": height * width * per_window // n,
            "wmsa_padded": padded_h * padded_w * per_window // n,
        }

    def macs(self, height: int, width: int, padded: bool = False) -> int:
        """Norms, window attention and MLP, as the official ``flops()``.

        ``padded=False`` is the paper's count on the unpadded map (it assumes window multiples);
        ``padded=True`` counts attention over the padded map the forward really computes.
        """
        attention = self.attention_macs(height, width)["wmsa_padded" if padded else "wmsa"]
        tokens = height * width
        return int(2 * self.dim * tokens + attention + self.mlp.macs(tokens))

    def activation_elements(self, height: int, width: int) -> int:
        """Elements of the largest intermediate one image makes here: the q/k/v projection or the MLP's
        hidden layer (what :func:`swin.layers.execution.image_chunks` keeps small)."""
        padded_h, padded_w = self.padded_size(height, width)
        return max(padded_h * padded_w * 3 * self.dim, height * width * self.hidden_dim)


@torch.fx.wrap  # window plans are looked up by the map's size: one node under torch.fx.symbolic_trace
def partition_windows(block: SwinBlock, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(B, H, W, C) -> the windows (B, nW, N, C) of ``block`` (shifted and padded by its plan), the shift mask
    (nW, N, N) or None, and the index that scatters the windows' tokens back to the map."""
    batch, height, width, channels = x.shape
    plan = block.plans.get(height, width, block.window, block.shift_for(height, width), block.rules.pad_first, x.device)
    tokens = x.reshape(batch, height * width, channels)
    if plan.pad_token:
        tokens = F.pad(tokens, (0, 0, 0, 1))  # the zero token that padded positions gather
    n = block.window[0] * block.window[1]  # explicit sizes, not -1: a batch of 0 images has no elements
    windows = tokens.index_select(1, plan.gather).view(batch, plan.num_windows, n, channels)
    return windows, plan.mask, plan.scatter
