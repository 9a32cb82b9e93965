"""A stage: a run of blocks alternating regular and shifted windows, then patch merging (paper fig. 3)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .block import SwinBlock
from .patch_merging import PatchMerging
from .window import WindowPlans

__all__ = ["SwinStage"]


class SwinStage(nn.Module):
    """``depth`` blocks at one resolution; ``downsample`` merges patches at the end (official key layout:
    ``layers.{i}.downsample`` belongs to the stage whose output it merges).

    ``forward`` returns ``(features, next_input)``: the stage's output before merging (what a detection
    neck takes) and the merged map for the next stage (the same tensor when there is no merging).

    Args:
        dim, depth, num_heads, window: channels, blocks, heads and (wh, ww) window of the stage.
        mlp_ratio, qkv_bias, drop, attn_drop: passed to every block.
        drop_path: one stochastic depth rate per block, or one for all.
        semantics: "classification" or "detection" (see :mod:`swin.layers.semantics`).
        block: the block class (or any callable with :class:`SwinBlock`'s arguments), as torchvision's
            ``block=``: :class:`SwinBlock` or :class:`SwinBlockV2`.
        downsample: the patch merging class (:class:`PatchMerging`, :class:`PatchMergingV2`), or None for
            the last stage.
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
        semantics: str = "classification",
        block: Callable[..., nn.Module] = SwinBlock,
        downsample: Callable[[int], nn.Module] | None = PatchMerging,
    ):
        super().__init__()
        rates = list(drop_path) if isinstance(drop_path, Sequence) else [drop_path] * depth
        self.dim = dim
        self.depth = depth
        self.window = tuple(window)
        plans = WindowPlans()  # the blocks of a stage share their map sizes, so they share plans
        self.blocks = nn.ModuleList(
            block(
                dim,
                num_heads,
                self.window,
                shifted=i % 2 == 1,
                mlp_ratio=mlp_ratio,
                qkv_bias=qkv_bias,
                drop=drop,
                attn_drop=attn_drop,
                drop_path=rates[i],
                semantics=semantics,
                plans=plans,
            )
            for i in range(depth)
        )
        self.downsample = downsample(dim) if downsample is not None else None
        self.grad_checkpointing = False

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        for block in self.blocks:
            if self.grad_checkpointing and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return x, (self.downsample(x) if self.downsample is not None else x)

    def set_window(self, window: tuple[int, int]) -> None:
        """Every block in (wh, ww) windows from now on; the plans made for the old window are let go."""
        self.window = tuple(window)
        for block in self.blocks:
            block.set_window(self.window)
            block.plans.unpin()
            block.plans.clear()

    def padded_size(self, height: int, width: int) -> tuple[int, int]:
        """The map size attention runs on: (height, width) padded to window multiples."""
        return self.blocks[0].padded_size(height, width)

    def attention_macs(self, height: int, width: int) -> dict[str, int]:
        """The blocks' attention on a (height, width) map: ``msa``, ``wmsa``, ``wmsa_padded`` summed (see
        :meth:`SwinBlock.attention_macs`)."""
        total = {"msa": 0, "wmsa": 0, "wmsa_padded": 0}
        for block in self.blocks:
            for key, value in block.attention_macs(height, width).items():
                total[key] += value
        return total

    def macs(self, height: int, width: int, padded: bool = False) -> int:
        cost = sum(block.macs(height, width, padded) for block in self.blocks)
        if self.downsample is not None:
            cost += self.downsample.macs(height, width)
        return cost

    def activation_elements(self, height: int, width: int) -> int:
        """Elements of the largest intermediate one image makes in this stage."""
        return max(block.activation_elements(height, width) for block in self.blocks)
