"""Convert state dicts between checkpoint layouts: detect, unwrap, rename, transform, drop derived buffers."""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from .layouts import DETECTION_ORDER, LAYOUTS, Layout

__all__ = ["convert", "export", "detect_layout", "unwrap"]

_WRAPPERS = ("model", "state_dict", "model_state", "module", "model_ema")
# Prefixes that wrap a whole state dict: DDP's module., torch.compile's _orig_mod., a model/backbone attribute.
_PREFIXES = ("module.", "_orig_mod.", "model.", "backbone.")
# How deep a checkpoint may nest its state dict ({"model": {"state_dict": ...}}) before it is refused.
_MAX_NESTING = 8
# Keys of a Swin trunk in any supported layout; a detector's other parts (neck., rpn_head., ...) never match.
_TRUNK = re.compile(r"^(patch_embed|layers|stages|features|absolute_pos_embed|embeddings|encoder|swin)\.")


def unwrap(checkpoint: Mapping) -> dict[str, torch.Tensor]:
    """The tensor mapping inside a checkpoint: ``{"model": sd}``, ``{"state_dict": sd}``, ``module.`` ...

    A detector checkpoint (mmdetection, the official detection code) keeps the trunk under ``backbone.``
    beside its neck and heads: the prefix is removed from the backbone's keys and the others are kept as
    they are (loading reports them as keys the model does not have).
    """
    sd = checkpoint
    seen: set[int] = set()
    while isinstance(sd, Mapping) and not any(isinstance(v, torch.Tensor) for v in sd.values()):
        inner = next((sd[k] for k in _WRAPPERS if isinstance(sd.get(k), Mapping)), None)
        if inner is None:
            break
        seen.add(id(sd))
        if id(inner) in seen or len(seen) > _MAX_NESTING:
            raise ValueError(
                f"the checkpoint nests its state dict in a cycle or more than {_MAX_NESTING} levels deep "
                f"(under {', '.join(_WRAPPERS)}); it is not a checkpoint this package can read"
            )
        sd = inner
    if not isinstance(sd, Mapping):
        raise TypeError(f"expected a state dict (a mapping of names to tensors), got {type(sd).__name__}")
    tensors = {k: v for k, v in sd.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        raise ValueError(f"no tensors found in the checkpoint; its top-level keys are {sorted(map(str, sd))[:10]}")
    for prefix in _PREFIXES:
        if all(isinstance(k, str) and k.startswith(prefix) for k in tensors):
            tensors = {k[len(prefix) :]: v for k, v in tensors.items()}
    backbone = [k for k in tensors if k.startswith("backbone.")]
    if backbone and not any(_TRUNK.match(k) for k in tensors if not k.startswith("backbone.")):
        tensors = {k.removeprefix("backbone."): v for k, v in tensors.items()}
    return tensors


def detect_layout(keys) -> str:
    """Name of the layout whose signature the keys carry; "official" (ours) when none does."""
    keys = list(keys)
    for name in DETECTION_ORDER:
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
        if drop and re.search(drop, key):
            continue
        out[key] = value
    return out


def _layout(name: str) -> Layout:
    if name not in LAYOUTS:
        raise ValueError(f"unknown checkpoint layout {name!r}; known layouts: {', '.join(LAYOUTS)} or 'auto'")
    return LAYOUTS[name]


def convert(state_dict: Mapping, source: str = "auto") -> dict[str, torch.Tensor]:
    """Our (official) layout from a checkpoint of layout ``source`` ("auto" detects it from the keys).

    ``source`` is one of "official", "timm", "torchvision", "transformers" (4.x and 5.x key names),
    "mmdet" (mmdetection / mmsegmentation) or "auto". Wrappers (``model``, ``state_dict``, ``module.``,
    ``backbone.``) are unwrapped and derived buffers (``relative_position_index``, ``attn_mask``) dropped.
    Keys that are not part of a Swin trunk (a detector's neck, per-level ``norm0..3``) pass through.
    """
    sd = unwrap(state_dict)
    layout = _layout(detect_layout(sd) if source == "auto" else source)
    out = _apply(sd, layout.to_ours, layout.drop)
    for transform in layout.to_ours_transforms:
        out = transform(out)
    return out


def export(state_dict: Mapping, target: str = "official") -> dict[str, torch.Tensor]:
    """A state dict in our layout rewritten for ``target`` ("official" or "timm")."""
    layout = _layout(target)
    if target != "official" and not layout.from_ours:
        exportable = [name for name, lay in LAYOUTS.items() if name == "official" or lay.from_ours]
        raise ValueError(f"export to {target!r} is not supported; export targets: {', '.join(exportable)}")
    return _apply(unwrap(state_dict), layout.from_ours, layout.drop)
