"""The block's feed-forward network: Linear, GELU, Linear (keys ``mlp.fc1`` / ``mlp.fc2``)."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["Mlp"]


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden_dim: int, drop: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.act = nn.GELU()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))

    def macs(self, tokens: int) -> int:
        return 2 * tokens * self.fc1.in_features * self.fc1.out_features
