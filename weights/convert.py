"""Convert state dicts between checkpoint layouts: detect, unwrap, rename, drop derived buffers."""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from .layouts import LAYOUTS, Layout

__all__ = ["convert", "export", "detect_layout", "unwrap"]

_WRAPPERS = ("model", "state_dict", "model_state", "module")
_PREFIXES = ("module.", "model.", "backbone.")


def unwrap(checkpoint: Mapping) -> dict[str, torch.Tensor]:
    """The tensor mapping inside a checkpoint: ``{"model": sd}``, ``{"state_dict": sd}``, ``module.`` ..."""
    sd = checkpoint
    while isinstance(sd, Mapping) and not any(isinstance(v, torch.Tensor) for v in sd.values()):
        inner = next((sd[k] for k in _WRAPPERS if isinstance(sd.get(k), Mapping)), None)
        if inner is None:
            break
        sd = inner
    if not isinstance(sd, Mapping):
        raise TypeError(f"expected a state dict (a mapping of names to tensors), got {type(sd).__name__}")
    tensors = {k: v for k, v in sd.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        raise ValueError(f"no tensors found in the checkpoint; its top-level keys are {sorted(map(str, sd))[:10]}")
    for prefix in _PREFIXES:
        if all(k.startswith(prefix) for k in tensors):
            tensors = {k[len(prefix) :]: v for k, v in tensors.items()}
    return tensors


def detect_layout(keys) -> str:
    """Name of the layout whose signature the keys carry; "official" (ours) when none does."""
    keys = list(keys)
    for name in ("torchvision", "official", "timm"):  # official before timm: both have layers.1.downsample
        if any(re.search(pattern, k) for pattern in LAYOUTS[name].signature for k in keys):
            return name
    return "official"


def _apply(sd: Mapping[str, torch.Tensor], rules, drop: str | None) -> dict[str, torch.Tensor]:
    out = {}
    for key, value in sd.items():
        if drop and re.search(drop, key):
            continue
        for pattern, replacement in rules:
            key = re.sub(pattern, replacement, key)
        out[key] = value
    return out


def _layout(name: str) -> Layout:
    if name not in LAYOUTS:
        raise ValueError(f"unknown checkpoint layout {name!r}; known layouts: {', '.join(LAYOUTS)} or 'auto'")
    return LAYOUTS[name]


def convert(state_dict: Mapping, source: str = "auto") -> dict[str, torch.Tensor]:
    """Our (official) layout from a checkpoint of layout ``source`` ("auto" detects it from the keys).

    Wrappers (``model``, ``state_dict``, ``module.``) are unwrapped and derived buffers
    (``relative_position_index``, ``attn_mask``) dropped.
    """
    sd = unwrap(state_dict)
    layout = _layout(detect_layout(sd) if source == "auto" else source)
    return _apply(sd, layout.to_ours, layout.drop)


def export(state_dict: Mapping, target: str = "official") -> dict[str, torch.Tensor]:
    """A state dict in our layout rewritten for ``target`` ("official" or "timm")."""
    layout = _layout(target)
    if target != "official" and not layout.from_ours:
        raise ValueError(f"export to {target!r} is not supported; export targets: official, timm")
    return _apply(unwrap(state_dict), layout.from_ours, layout.drop)
