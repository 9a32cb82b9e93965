"""Building blocks of Swin Transformer, one concept per module.

Names load on first use (``swin.layers.SwinBlock`` imports torch and the block then), so that torch-free
parts (``swin.layers.semantics``) serve the command line without importing torch.
"""

from __future__ import annotations

import importlib

# name -> the module (in this package) that defines it
_EXPORTS = {
    "WindowAttention": "attention",
    "WindowAttentionBase": "attention",
    "WindowAttentionV2": "attention_v2",
    "SwinBlock": "block",
    "SwinBlockV2": "block_v2",
    "DropPath": "drop_path",
    "Mlp": "mlp",
    "PatchEmbed": "patch_embed",
    "PatchMerging": "patch_merging",
    "PatchMergingV2": "patch_merging",
    "relative_position_index": "position_bias",
    "SEMANTICS": "semantics",
    "Semantics": "semantics",
    "get_semantics": "semantics",
    "SwinStage": "stage",
    "VARIANTS": "variants",
    "Variant": "variants",
    "MASK_VALUE": "window",
    "WindowPlan": "window",
    "WindowPlans": "window",
    "build_window_plan": "window",
    "pinning_window_plans": "window",
    "unpin_window_plans": "window",
    "shift_mask": "window",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
