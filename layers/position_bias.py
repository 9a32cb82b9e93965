"""The relative position index of the learned bias table (paper section 3.2, "Relative position bias")."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["relative_position_index", "resize_bias_table"]


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


def resize_bias_table(table: torch.Tensor, source: tuple[int, int], window: tuple[int, int]) -> torch.Tensor:
    """A ((2*sh-1)*(2*sw-1), heads) table learned for the window ``source``, as the table of ``window``:
    bicubic over the grid of offsets, as the official code fine-tunes at another window (microsoft/Swin-
    Transformer's ``load_pretrained``: ``F.interpolate(..., mode="bicubic")``, default ``align_corners``)."""
    rows, heads = table.shape
    grid = (2 * source[0] - 1, 2 * source[1] - 1)
    if rows != grid[0] * grid[1]:
        raise ValueError(f"a table of {rows} rows is not the bias table of a {source[0]}x{source[1]} window")
    target = (2 * window[0] - 1, 2 * window[1] - 1)
    if grid == target:
        return table
    planes = table.float().permute(1, 0).reshape(1, heads, *grid)
    resized = F.interpolate(planes, size=target, mode="bicubic", align_corners=False)
    return resized.reshape(heads, -1).permute(1, 0).contiguous().to(table.dtype)
