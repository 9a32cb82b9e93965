"""The relative position index of the learned bias table (paper section 3.2, "Relative position bias")."""

from __future__ import annotations

import torch

__all__ = ["relative_position_index"]


def relative_position_index(window: tuple[int, int]) -> torch.Tensor:
    """(N, N) long tensor: row of the ((2*wh-1)*(2*ww-1), heads) table for each query/key pair.

    Offsets dy in [-(wh-1), wh-1] and dx in [-(ww-1), ww-1] are shifted to start at 0 and flattened
    row-major, dy first, which is the order of the official checkpoints' tables.
    """
    wh, ww = window
    ys, xs = torch.meshgrid(torch.arange(wh), torch.arange(ww), indexing="ij")
    coords = torch.stack([ys.flatten(), xs.flatten()])  # 2, N
    offsets = coords[:, :, None] - coords[:, None, :]  # 2, N, N
    return (offsets[0] + wh - 1) * (2 * ww - 1) + (offsets[1] + ww - 1)
