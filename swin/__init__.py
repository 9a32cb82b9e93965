"""swin: Swin Transformer backbones, exact against the official checkpoints.

>>> import swin
>>> model = swin.create_model("swin_t")

Names load on first use (PEP 562), so ``import swin`` is quick and the command line starts without
importing torch; ``swin.create_model`` imports torch and the model code when it is first reached.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# name -> the module (in this package) that defines it
_EXPORTS = {
    "SwinBackbone": ".backbone",
    "SwinConfig": ".registry",
    "SwinFPN": ".detection",
    "SwinTransformer": ".model",
    "create_model": ".factory",
    "data_config": ".weights.data_config",
    "detection_backbone": ".detection",
    "flops": ".costs",
    "get_config": ".registry",
    "list_models": ".catalog",
    "OptimizedModel": ".optimized",
    "fastest_dtype": ".optimized",
    "optimize": ".optimized",
    "param_groups": ".optim",
    "register_model": ".registry",
    "resolve_name": ".registry",
    "save_for_hf": ".hub_save",
    "save_for_transformers": ".hub_save_transformers",
}

# submodules reachable as attributes after ``import swin`` (``swin.export.export_onnx``, ``swin.weights``)
_SUBMODULES = {"detection", "export", "layers", "registry", "segmentation", "weights"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS) | _SUBMODULES)
