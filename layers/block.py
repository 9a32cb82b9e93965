"""The Swin Transformer block: (shifted) window attention and an MLP, pre-norm residuals (paper eq. 3)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import DropPath
from torch import nn

from .attention import WindowAttention
from .chunking import chunk_length, chunked_inference
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
        chunked = chunked_inference(self, x)
        if chunked:  # the new tensor takes the residual in place
            x = self.window_attention(self.norm1(x), chunked).add_(x)
        else:
            x = x + self.drop_path(self.window_attention(self.norm1(x), chunked))
        return self.mlp_residual(x, chunked)

    def mlp_branch(self, x: torch.Tensor) -> torch.Tensor:
        """The residual branch of the MLP half (per token): MLP(LN(x))."""
        return self.mlp(self.norm2(x))

    def mlp_residual(self, x: torch.Tensor, chunked: bool = False) -> torch.Tensor:
        """x + DropPath(branch(x)); ``chunked`` (see :func:`swin.layers.chunking.chunked_inference`, decided
        once per block call): over chunks of tokens, the same values without a large hidden tensor."""
        if not chunked:
            return x + self.drop_path(self.mlp_branch(x))
        rows = x.reshape(-1, x.shape[-1])
        step = chunk_length(rows.shape[0], self.mlp.fc1.out_features * x.element_size())
        if step == rows.shape[0]:
            return x + self.mlp_branch(x)
        out = torch.empty_like(rows)
        for start in range(0, rows.shape[0], step):
            part = rows[start : start + step]
            torch.add(part, self.mlp_branch(part), out=out[start : start + step])
        return out.view(x.shape)

    def window_attention(self, x: torch.Tensor, chunked: bool = False) -> torch.Tensor:
        """Shift, partition, attend, merge, unshift; x: (B, H, W, C). Pad + roll + partition is one gather
        and its inverse another (see :class:`swin.layers.WindowPlan`); ``chunked``: attention in pieces
        (:meth:`attend_in_chunks`)."""
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
        if chunked:
            windows = self.attend_in_chunks(tokens, plan)
        else:
            windows = tokens.index_select(1, plan.gather).view(batch, plan.num_windows, -1, channels)
            windows = self.attn(windows, plan.mask, plan.key)
        merged = windows.reshape(batch, -1, channels).index_select(1, plan.scatter)
        return merged.view(batch, height, width, channels)

    def attend_in_chunks(self, tokens: torch.Tensor, plan) -> torch.Tensor:
        """Window attention for inference on CPU, a few images or windows at a time so that the q/k/v
        projection stays small (:mod:`swin.layers.chunking`); (B, nW, N, C) windows out, as ``self.attn``.

        A chunk of one image keeps q/k/v as views of the projection even with a shift mask (see
        :func:`swin.layers.attention.windowed_sdpa`); the output projection writes straight into the result.
        """
        batch, _, channels = tokens.shape
        num_windows = plan.num_windows
        n = plan.gather.numel() // num_windows
        per_window = 3 * n * channels * tokens.element_size()  # the q/k/v projection of one window
        images = chunk_length(batch, num_windows * per_window)
        step = chunk_length(num_windows, per_window) if images == 1 else num_windows
        out = tokens.new_empty(batch, num_windows, n, channels)
        proj = self.attn.proj
        for first_image in range(0, batch, images):
            part = tokens[first_image : first_image + images]
            for first in range(0, num_windows, step):
                stop = min(first + step, num_windows)
                index = plan.gather if step == num_windows else plan.gather[first * n : stop * n]
                windows = part.index_select(1, index).view(-1, stop - first, n, channels)
                mixed = self.attn.mix(windows, plan.mask, plan.key, (first, stop))
                target = out[first_image : first_image + images, first:stop].view(-1, channels)
                torch.addmm(proj.bias, mixed.reshape(-1, channels), proj.weight.t(), out=target)
        return out

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
