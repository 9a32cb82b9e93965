"""A stage: a run of blocks alternating regular and shifted windows, then patch merging (paper fig. 3)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .block import SwinBlock
from .block_v2 import SwinBlockV2
from .patch_merging import PatchMerging, PatchMergingV2

__all__ = ["SwinStage"]


class SwinStage(nn.Module):
    """``depth`` blocks at one resolution; ``downsample`` merges patches at the end (official key layout:
    ``layers.{i}.downsample`` belongs to the stage whose output it merges).

    ``forward`` returns ``(features, next_input)``: the stage's output before merging (what a detection
    neck takes) and the merged map for the next stage (the same tensor when there is no merging).

    ``version=2`` builds Swin V2 blocks (res-post-norm, cosine attention, continuous position bias whose
    coordinates are scaled by ``pretrained_window`` when it is not 0) and V2 patch merging.
    """

    def __init__(
        self,
        dim: int,
        depth: int,
        num_heads: int,
        window: tuple[int, int],
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: Sequence[float] | float = 0.0,
        downsample: bool = True,
        semantics: str = "classification",
        version: int = 1,
        pretrained_window: int = 0,
    ):
        super().__init__()
        rates = list(drop_path) if isinstance(drop_path, Sequence) else [drop_path] * depth
        self.dim = dim
        self.depth = depth
        if version not in (1, 2):
            raise ValueError(f"version must be 1 (Swin) or 2 (Swin V2), got {version!r}")
        if version == 1:
            self.blocks = nn.ModuleList(
                SwinBlock(dim, num_heads, window, i % 2 == 1, mlp_ratio, qkv_bias, drop, attn_drop, rates[i], semantics)
                for i in range(depth)
            )
        else:
            pretrained = (pretrained_window, pretrained_window)
            self.blocks = nn.ModuleList(
                SwinBlockV2(
                    dim,
                    num_heads,
                    window,
                    i % 2 == 1,
                    mlp_ratio,
                    qkv_bias,
                    drop,
                    attn_drop,
                    rates[i],
                    semantics,
                    pretrained,
                )
                for i in range(depth)
            )
        merging = PatchMerging if version == 1 else PatchMergingV2
        self.downsample = merging(dim) if downsample else None
        self.grad_checkpointing = False

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        for block in self.blocks:
            if self.grad_checkpointing and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return x, (self.downsample(x) if self.downsample is not None else x)

    def macs(self, height: int, width: int, padded: bool = False) -> int:
        cost = sum(block.macs(height, width, padded) for block in self.blocks)
        if self.downsample is not None:
            cost += self.downsample.macs(height, width)
        return cost
