"""The windows of a model's attentions, for a library that saves derived buffers made from them (torchvision):
the model's own where it is given, else read from the weights (Swin V1's bias tables, a saved Swin V2
coordinates table)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import torch
from torch import nn

from ..layers.attention_v2 import log_spaced_coords

__all__ = ["Windows", "block_windows", "model_windows"]

Windows = dict[str, tuple[tuple[int, int], tuple[int, int]]]  # attention prefix -> (window, pretrained window)


def model_windows(model: nn.Module) -> Windows:
    """Each window attention of ``model`` (ours) by its prefix in the state dict: its window and the window its
    position coordinates are scaled by (Swin V2's pretrained window; V1: (0, 0))."""
    found = {
        # by the name the state dict has once unwrapped (a wrapper's module. or model. prefix goes)
        m.group(1): (tuple(module.window), tuple(getattr(module, "pretrained_window", (0, 0))))
        for name, module in model.named_modules()
        if hasattr(module, "derived_buffers")
        and hasattr(module, "window")
        and (m := re.search(r"(layers\.\d+\.blocks\.\d+\.attn)$", name))
    }
    if not found:
        raise ValueError(
            f"export: {type(model).__name__} holds none of swin's window attentions; pass one of swin's models "
            "(for a wrapper, the model inside it: ddp.module, ema.module) or its state_dict()"
        )
    return found


def _table_window(key: str, table: torch.Tensor) -> tuple[int, int]:
    """The square window whose (2w-1)^2-row bias table ``table`` is; a ValueError where it is none."""
    side = math.isqrt(table.shape[0])
    if side * side != table.shape[0] or side % 2 == 0:
        raise ValueError(
            f"export: {key} has {table.shape[0]} rows, the table of a window that is not square: its windows are "
            "not in the state dict alone; pass the model itself, export(model, ...)"
        )
    return (side + 1) // 2, (side + 1) // 2


def _coords_windows(key: str, coords: torch.Tensor) -> tuple[tuple[int, int], tuple[int, int]]:
    """The window and pretrained window of a saved Swin V2 coordinates table (official and torchvision: (1,
    2wh-1, 2ww-1, 2)): the window from its shape, the pretrained window as the one whose scaling gives its values
    (each axis on its own); a ValueError where none does."""
    if coords.ndim != 4 or coords.shape[-1] != 2 or coords.shape[1] % 2 == 0 or coords.shape[2] % 2 == 0:
        raise ValueError(f"export: {key} of shape {tuple(coords.shape)} is no coordinates table (1, 2h-1, 2w-1, 2)")
    window = ((coords.shape[1] + 1) // 2, (coords.shape[2] + 1) // 2)
    found = []
    for axis in range(2):
        saved = coords[0, :, 0, 0] if axis == 0 else coords[0, 0, :, 1]
        for pretrained in (0, *range(2, 4 * max(window) + 1)):
            made = log_spaced_coords(window, (pretrained, pretrained)).reshape(*coords.shape[1:])
            ours = made[:, 0, 0] if axis == 0 else made[0, :, 1]
            if torch.allclose(saved.float(), ours, atol=1e-5):
                found.append(pretrained)
                break
        else:
            raise ValueError(f"export: {key} holds coordinates no window scaling gives; pass the model itself")
    pretrained = (0, 0) if tuple(found) in ((0, 0), window) else tuple(found)
    return window, pretrained


def block_windows(sd: Mapping[str, torch.Tensor], windows: Windows | None) -> Windows:
    """Each attention's (window, pretrained window): the model's where given, else read from V1's bias tables."""
    attentions = sorted({m.group(1) for k in sd if (m := re.match(r"^(layers\.\d+\.blocks\.\d+\.attn)\.", k))})
    if windows is not None:
        missing = [name for name in attentions if name not in windows]
        if missing:
            raise ValueError(f"export: the model given has no window attention at {missing[0]}, which its weights have")
        return {name: windows[name] for name in attentions}
    out = {}
    for name in attentions:
        table = sd.get(f"{name}.relative_position_bias_table")
        coords = sd.get(f"{name}.relative_coords_table")
        if table is None and coords is not None:  # Swin V2 weights read with their saved coordinates table
            out[name] = _coords_windows(f"{name}.relative_coords_table", coords)
            continue
        if table is None:  # Swin V2: a continuous position bias, from coordinates the window alone decides
            raise ValueError(
                "export: a Swin V2 state dict does not record its windows, which torchvision's saved coordinates "
                "table needs; pass the model itself: swin.weights.export(swin.create_model(ARCH, pretrained=FILE), "
                "'torchvision')"
            )
        out[name] = (_table_window(f"{name}.relative_position_bias_table", table), (0, 0))
    return out
