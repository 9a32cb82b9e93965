"""Stochastic depth (Huang et al. 2016): drop a residual branch per sample while training."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["DropPath"]


class DropPath(nn.Module):
    """Zero the branch for a random ``rate`` of the samples and scale the others by 1 / (1 - rate); the
    identity in eval mode. The Swin recipes raise the rate linearly over the blocks."""

    def __init__(self, rate: float = 0.0):
        super().__init__()
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"drop path rate must be in [0, 1), got {rate}")
        self.rate = rate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.rate == 0.0:
            return x
        keep = 1.0 - self.rate
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
        return x * mask.div_(keep)

    def extra_repr(self) -> str:
        return f"rate={self.rate}"
