"""Patch merging: space-to-depth of 2x2 neighbours, LayerNorm(4C), Linear 4C -> 2C (paper section 3.1)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

__all__ = ["PatchMerging", "PatchMergingV2", "space_to_depth"]


@torch.fx.wrap  # it decides the padding on the size: one node under torch.fx.symbolic_trace
def space_to_depth(x: torch.Tensor) -> torch.Tensor:
    """(B, H, W, C) -> (B, ceil(H/2), ceil(W/2), 4C): odd sizes zero-padded at the bottom/right, then each 2x2
    neighbourhood side by side in the official checkpoints' channel order, [0::2,0::2], [1::2,0::2], [0::2,1::2],
    [1::2,1::2]: the column offset (dw) varies slowest, then the row offset (dh), then the channel."""
    height, width = x.shape[1:3]
    if height % 2 or width % 2:
        x = F.pad(x, (0, 0, 0, width % 2, 0, height % 2))
    return rearrange(x, "b (h dh) (w dw) c -> b h w (dw dh c)", dh=2, dw=2)


class PatchMerging(nn.Module):
    """(B, H, W, C) -> (B, ceil(H/2), ceil(W/2), 2C). Odd sizes are zero-padded at the bottom/right."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim
        self.norm = nn.LayerNorm(4 * dim)
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.reduction(self.norm(space_to_depth(x)))

    def macs(self, height: int, width: int) -> int:
        """Reduction plus norm on the merged map, as the official ``flops()`` counts them."""
        h, w = -(-height // 2), -(-width // 2)
        return h * w * 4 * self.dim * 2 * self.dim + h * w * 4 * self.dim


class PatchMergingV2(PatchMerging):
    """Swin V2 patch merging: space-to-depth, Linear 4C -> 2C, then LayerNorm(2C) (official V2 key layout:
    ``reduction``, ``norm``). (B, H, W, C) -> (B, ceil(H/2), ceil(W/2), 2C)."""

    def __init__(self, dim: int):
        super().__init__(dim)
        self.norm = nn.LayerNorm(2 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.reduction(space_to_depth(x)))  # the V1 channel order

    def macs(self, height: int, width: int) -> int:
        """Reduction plus norm of the 2C outputs, as the official V2 ``flops()`` (``H * W * dim // 2``)."""
        h, w = -(-height // 2), -(-width // 2)
        return h * w * 4 * self.dim * 2 * self.dim + h * w * 2 * self.dim
