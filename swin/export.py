"""Deployment: ``torch.export`` programs and ONNX files with dynamic batch, height and width."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn
from torch.export import Dim

from .backbone import SwinBackbone
from .layers.semantics import get_semantics
from .trunk import SwinTrunk

__all__ = ["SIZE_MULTIPLE", "dynamic_size_range", "export_onnx", "export_program"]

# Exported sizes are multiples of 32 (patch 4 x three merges), so no patch or merge padding branch is traced.
SIZE_MULTIPLE = 32
_MAX_STEPS = 64  # 2048 pixels


def dynamic_size_range(model: SwinTrunk) -> tuple[int, int]:
    """Range (min, max) of sizes, in pixels and multiples of 32, that one exported graph serves.

    One traced graph cannot branch on whether a stage's map is larger than its window: that decides the
    shift under classification semantics (the official rule) and whether the stage has one window or
    several (tracing specialises a count of one). So a range keeps every stage on one side of that line.
    Classification: the widest such range around the model's own ``img_size`` (128-224 for swin_t, whose
    last stage is one window; build with ``img_size=256`` for 256-2048). Detection: from the first size
    where every stage has several windows (256 at window 7) up to 2048, the sizes detectors use.
    """
    if not get_semantics(model.semantics).shrink_window:  # detection: the window never shrinks
        window = max(max(stage.window) for stage in model.layers)
        return (window + 1) * SIZE_MULTIPLE, _MAX_STEPS * SIZE_MULTIPLE
    native = max(1, min(model.config.img_size) // SIZE_MULTIPLE)
    stages = len(model.layers)

    def pattern(k: int) -> tuple[bool, ...]:
        # the map side of stage i at size 32k is k * 2**(stages-1-i) (patch 4, then halved per merge)
        return tuple(k * 2 ** (stages - 1 - i) > stage.window[0] for i, stage in enumerate(model.layers))

    low = high = native
    while low > 1 and pattern(low - 1) == pattern(native):
        low -= 1
    while high < _MAX_STEPS and pattern(high + 1) == pattern(native):
        high += 1
    return low * SIZE_MULTIPLE, high * SIZE_MULTIPLE


def _dynamic_shapes(model: SwinTrunk, max_batch: int, size_range: tuple[int, int] | None) -> dict[str, Any]:
    low, high = size_range or dynamic_size_range(model)
    if low % SIZE_MULTIPLE or high % SIZE_MULTIPLE or low > high:
        raise ValueError(f"size_range must be multiples of {SIZE_MULTIPLE} with min <= max, got {(low, high)}")
    height = Dim("height_steps", min=low // SIZE_MULTIPLE, max=high // SIZE_MULTIPLE)
    width = Dim("width_steps", min=low // SIZE_MULTIPLE, max=high // SIZE_MULTIPLE)
    batch = Dim("batch", min=1, max=max_batch)
    return {"x": {0: batch, 2: SIZE_MULTIPLE * height, 3: SIZE_MULTIPLE * width}}


def _example(model: SwinTrunk, size_range: tuple[int, int] | None) -> torch.Tensor:
    low, high = size_range or dynamic_size_range(model)
    # Inside the range and not a window multiple at the first stage, so that no padding branch is specialised.
    side = min(max(min(model.config.img_size), low), high)
    side -= side % SIZE_MULTIPLE
    if (side // 4) % model.layers[0].window[0] == 0 and side + SIZE_MULTIPLE <= high:
        side += SIZE_MULTIPLE
    parameter = next(model.parameters())
    return torch.randn(2, model.in_chans, side, side, device=parameter.device, dtype=parameter.dtype)


def export_program(
    model: nn.Module, max_batch: int = 64, size_range: tuple[int, int] | None = None
) -> torch.export.ExportedProgram:
    """``torch.export`` of a classifier or backbone with dynamic batch (1..max_batch) and dynamic height and
    width: multiples of 32 within ``size_range`` (default :func:`dynamic_size_range`). Eval mode."""
    if not isinstance(model, SwinTrunk):
        raise TypeError(f"expected a swin model (SwinTransformer or SwinBackbone), got {type(model).__name__}")
    model.eval()
    example = _example(model, size_range)
    return torch.export.export(model, (example,), dynamic_shapes=_dynamic_shapes(model, max_batch, size_range))


def export_onnx(
    model: nn.Module,
    path: str | os.PathLike,
    max_batch: int = 64,
    size_range: tuple[int, int] | None = None,
    dynamic: bool = True,
) -> str:
    """Write an ONNX file of a classifier or backbone (opset of torch's dynamo exporter; standard ops only).

    Inputs are named ``x``; outputs ``logits`` for a classifier, ``features0..3`` for a backbone. With
    ``dynamic`` the batch, height and width are symbolic (multiples of 32 within ``size_range``).
    Requires ``onnx`` and ``onnxscript`` (``pip install 'swin[onnx]'``).
    """
    if not isinstance(model, SwinTrunk):
        raise TypeError(f"expected a swin model (SwinTransformer or SwinBackbone), got {type(model).__name__}")
    try:
        import onnxscript  # noqa: F401  (the exporter needs it; fail with our message, not deep inside torch)
    except ImportError:
        raise ImportError("ONNX export needs onnx and onnxscript: pip install 'swin[onnx]'") from None
    model.eval()
    example = _example(model, size_range)
    if isinstance(model, SwinBackbone):
        outputs = [f"features{i}" for i in model.out_indices]
    else:
        outputs = ["logits"]
    program = torch.onnx.export(
        model,
        (example,),
        dynamo=True,
        dynamic_shapes=_dynamic_shapes(model, max_batch, size_range) if dynamic else None,
        input_names=["x"],
        output_names=outputs,
    )
    program.save(os.fspath(path))
    return os.fspath(path)
