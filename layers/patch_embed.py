"""Conv patch embedding: non-overlapping p x p patches projected to C channels (paper section 3.1)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["PatchEmbed"]


class PatchEmbed(nn.Module):
    """Conv2d(in_chans, embed_dim, p, stride p), then LayerNorm over channels.

    Takes (B, in_chans, H, W) of any size of at least one patch: the right and bottom edges are zero-padded
    to a multiple of the patch size, as the official detection backbone does. Returns (B, H/p, W/p, C).
    """

    def __init__(self, in_chans: int = 3, embed_dim: int = 96, patch_size: int = 4, norm: bool = True):
        super().__init__()
        self.in_chans = in_chans
        self.embed_dim = embed_dim
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)
        self.norm = nn.LayerNorm(embed_dim) if norm else nn.Identity()

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        p = self.patch_size
        return -(-height // p), -(-width // p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(pad_to_patches(x, self.patch_size)).permute(0, 2, 3, 1)  # B, H/p, W/p, C
        return self.norm(x)

    def macs(self, height: int, width: int) -> int:
        """Multiply-accumulates of the projection (the norm counts as in the official ``flops()``)."""
        h, w = self.output_size(height, width)
        cost = h * w * self.embed_dim * self.in_chans * self.patch_size**2
        if isinstance(self.norm, nn.LayerNorm):
            cost += h * w * self.embed_dim
        return cost


@torch.fx.wrap  # it decides the padding on the size: one node under torch.fx.symbolic_trace
def pad_to_patches(x: torch.Tensor, patch: int) -> torch.Tensor:
    """(B, C, H, W) zero-padded at the bottom and right to multiples of ``patch``."""
    height, width = x.shape[-2:]
    pad_h, pad_w = -height % patch, -width % patch
    return F.pad(x, (0, pad_w, 0, pad_h)) if pad_h or pad_w else x
