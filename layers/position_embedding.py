"""The absolute position embedding (``ape``): one learnt vector per patch of the grid the model was built for."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["resized_position_embedding", "position_embedding_rows"]


def resized_position_embedding(table: torch.Tensor, grid: tuple[int, int], size: tuple[int, int]) -> torch.Tensor:
    """The embedding ``table`` (1, grid_h * grid_w, C) as a (1, H, W, C) map for a (H, W) = ``size`` grid:
    bicubic-interpolated where that differs from ``grid``, as the official detection backbone."""
    pos = table.view(1, grid[0], grid[1], -1)
    if (size[0], size[1]) != (grid[0], grid[1]):
        pos = F.interpolate(pos.permute(0, 3, 1, 2), (size[0], size[1]), mode="bicubic", align_corners=False)
        pos = pos.permute(0, 2, 3, 1)
    return pos


def position_embedding_rows(value: torch.Tensor, channels: int) -> tuple[torch.Tensor, tuple[int, int]] | None:
    """A checkpoint's embedding as (1, H * W, C) rows and its (H, W) grid, or None where it is none of the
    layouts: the official detection backbone's (1, C, H, W) map, a (1, H, W, C) map, or (1, N, C) rows of a
    square grid (the official classification code's)."""
    if value.ndim == 4 and value.shape[0] == 1 and value.shape[1] == channels:  # channels first (detection)
        return value.flatten(2).transpose(1, 2), (value.shape[2], value.shape[3])
    if value.ndim == 4 and value.shape[0] == 1 and value.shape[3] == channels:
        return value.flatten(1, 2), (value.shape[1], value.shape[2])
    if value.ndim == 3 and value.shape[0] == 1 and value.shape[2] == channels:
        side = int(value.shape[1] ** 0.5)
        if side * side == value.shape[1]:
            return value, (side, side)
    return None
