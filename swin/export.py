"""Deployment: ``torch.export`` programs and ONNX files with dynamic batch, height and width."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.export import Dim

from .backbone import SwinBackbone
from .layers.semantics import get_semantics
from .trunk import SwinTrunk

__all__ = [
    "SIZE_MULTIPLE",
    "check_size_range",
    "dynamic_size_range",
    "example_size",
    "export_onnx",
    "export_program",
    "valid_size_ranges",
]

# Exported sizes are multiples of 32 (patch 4 x three merges), so no patch or merge padding branch is traced.
SIZE_MULTIPLE = 32
_MAX_STEPS = 64  # 2048 pixels


def valid_size_ranges(model: SwinTrunk) -> list[tuple[int, int]]:
    """Every range (min, max) of sizes, in pixels and multiples of 32, that one exported graph serves correctly,
    in increasing order; an exported range must lie inside one of them (see :func:`dynamic_size_range`)."""
    if not get_semantics(model.semantics).shrink_window:  # detection: the window never shrinks
        window = max(max(stage.window) for stage in model.layers)
        return [((window + 1) * SIZE_MULTIPLE, _MAX_STEPS * SIZE_MULTIPLE)]
    patch = model.patch_embed.patch_size

    def pattern(k: int) -> tuple[bool, ...]:
        # the map side of stage i at size 32k: 32k / patch, then halved (rounding up) by each merge
        sides = [-(-k * SIZE_MULTIPLE // patch)]
        for _ in model.layers[1:]:
            sides.append(-(-sides[-1] // 2))
        return tuple(side > stage.window[0] for side, stage in zip(sides, model.layers, strict=True))

    ranges: list[tuple[int, int]] = []
    start = 1
    for k in range(2, _MAX_STEPS + 2):
        if k > _MAX_STEPS or pattern(k) != pattern(start):
            ranges.append((start * SIZE_MULTIPLE, (k - 1) * SIZE_MULTIPLE))
            start = k
    return ranges


def dynamic_size_range(model: SwinTrunk) -> tuple[int, int]:
    """Range (min, max) of sizes, in pixels and multiples of 32, that one exported graph serves.

    One traced graph cannot branch on whether a stage's map is larger than its window: that decides the
    shift under classification semantics (the official rule) and whether the stage has one window or
    several (tracing specialises a count of one). So a range keeps every stage on one side of that line.
    Classification: the widest such range around the model's own ``img_size`` (128-224 for swin_t, whose
    last stage is one window; build with ``img_size=256`` for 256-2048). Detection: from the first size
    where every stage has several windows (256 at window 7) up to 2048, the sizes detectors use.
    """
    ranges = valid_size_ranges(model)
    if len(ranges) == 1:
        return ranges[0]
    native = max(1, min(model.config.img_size) // SIZE_MULTIPLE) * SIZE_MULTIPLE
    return next(r for r in ranges if r[0] <= min(native, _MAX_STEPS * SIZE_MULTIPLE) <= r[1])


def check_size_range(model: SwinTrunk, size_range: tuple[int, int] | None) -> tuple[int, int]:
    """``size_range`` (default :func:`dynamic_size_range`) if one graph can serve all of it, else a
    ``ValueError`` naming the ranges that can: outside them the traced graph computes wrong results
    (measured: 0.2 max logit error, top-1 changed), so such a range is refused before any tracing."""
    if size_range is None:
        return dynamic_size_range(model)
    low, high = (int(v) for v in size_range)
    if low % SIZE_MULTIPLE or high % SIZE_MULTIPLE or not 0 < low <= high:
        raise ValueError(
            f"size range {low}..{high}: min and max must be multiples of {SIZE_MULTIPLE} with 0 < min <= max"
        )
    ranges = valid_size_ranges(model)
    if not any(a <= low and high <= b for a, b in ranges):
        default = dynamic_size_range(model)
        shown = ", ".join(f"{a}..{b}" for a, b in ranges)
        raise ValueError(
            f"size range {low}..{high} is wider than one exported graph of {model.config.name} computes correctly: "
            f"the widest valid range is {default[0]}..{default[1]} (around its img_size); every valid range: "
            f"{shown} (multiples of {SIZE_MULTIPLE}). Export one file per range"
        )
    return low, high


def _check_batch(max_batch: int) -> int:
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise ValueError(f"max_batch must be a whole number of at least 1 (the largest batch), got {max_batch!r}")
    return max_batch


def _dynamic_shapes(max_batch: int, size_range: tuple[int, int]) -> dict[str, Any]:
    """Symbolic height and width; a symbolic batch 1..max_batch, or a static batch of 1 when ``max_batch`` is 1
    (``Dim`` needs min < max, and the example input then has batch 1, see :func:`_example_batch`)."""
    low, high = size_range
    height = Dim("height_steps", min=low // SIZE_MULTIPLE, max=high // SIZE_MULTIPLE)
    width = Dim("width_steps", min=low // SIZE_MULTIPLE, max=high // SIZE_MULTIPLE)
    shapes: dict[int, Any] = {2: SIZE_MULTIPLE * height, 3: SIZE_MULTIPLE * width}
    if max_batch > 1:
        shapes[0] = Dim("batch", min=1, max=max_batch)
    return {"x": shapes}


def _example_batch(max_batch: int) -> int:
    """2 for a symbolic batch (an example of 1 would specialise the graph to it), else the static batch 1."""
    return 2 if max_batch > 1 else 1


def example_size(model: SwinTrunk, size_range: tuple[int, int] | None = None) -> int:
    """The side of the square example input traced (the only size of a static ONNX export): inside the
    range and not a window multiple at the first stage, so that no padding branch is specialised."""
    low, high = check_size_range(model, size_range)
    side = min(max(min(model.config.img_size), low), high)
    side -= side % SIZE_MULTIPLE
    if (side // 4) % model.layers[0].window[0] == 0 and side + SIZE_MULTIPLE <= high:
        side += SIZE_MULTIPLE
    return side


def _example(model: SwinTrunk, side: int, batch: int) -> torch.Tensor:
    parameter = next(model.parameters())
    return torch.randn(batch, model.in_chans, side, side, device=parameter.device, dtype=parameter.dtype)


def _require_swin(model: nn.Module) -> None:
    if not isinstance(model, SwinTrunk):
        raise TypeError(f"expected a swin model (SwinTransformer or SwinBackbone), got {type(model).__name__}")


def export_program(
    model: nn.Module, max_batch: int = 64, size_range: tuple[int, int] | None = None
) -> torch.export.ExportedProgram:
    """``torch.export`` of a classifier or backbone with dynamic batch (1..max_batch; ``max_batch=1``: a static
    batch of 1) and dynamic height and width: multiples of 32 within ``size_range`` (default
    :func:`dynamic_size_range`; a range one graph cannot serve is refused, see :func:`check_size_range`).
    Eval mode. The program itself refuses other sizes and batches."""
    _require_swin(model)
    _check_batch(max_batch)
    size_range = check_size_range(model, size_range)
    model.eval()
    example = _example(model, example_size(model, size_range), _example_batch(max_batch))
    with _size_oblivious():
        return torch.export.export(model, (example,), dynamic_shapes=_dynamic_shapes(max_batch, size_range))


def _size_oblivious():
    """Trace as torch's ONNX exporter does, with ``backed_size_oblivious``: a symbolic size is assumed not to
    be 0 or 1 where a branch asks, instead of the shape solver proving it for every later expression. Five
    times faster on Swin (a two-stage backbone: 53 s -> 10 s on two cores) and the same graph: nothing in the
    model branches on a size being 0 or 1 (a batch of one is checked against eager in tests/test_deploy.py)."""
    return torch.fx.experimental._config.patch(backed_size_oblivious=True)


class _SizeGuard(nn.Module):
    """Make ONNX Runtime refuse an input whose height or width the graph does not serve.

    ONNX keeps no range on a symbolic dimension, and the traced graph runs at any size, silently wrong outside
    its range. So the graph adds to its input a zero gathered through two tables: ``table[h]`` fails (index out
    of bounds) above the largest size, and is 1 (not 0) at a size below the smallest or off the 32 grid, which
    makes the second gather, from a one-element table, fail. ONNX Runtime checks Gather indices and stops
    with an error naming the node; :func:`export_onnx` names those nodes after the rule.
    """

    def __init__(self, low: int, high: int, step: int) -> None:
        super().__init__()
        table = torch.ones(high + 1, dtype=torch.int64)
        table[low::step] = 0
        self.register_buffer("table", table)
        self.register_buffer("zero", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        failures = self.table[x.shape[-2]] + self.table[x.shape[-1]]  # 0 when both sides are valid
        return x + self.zero[failures].to(x.dtype)


class _Guarded(nn.Module):
    def __init__(self, model: nn.Module, low: int, high: int) -> None:
        super().__init__()
        self.size_guard = _SizeGuard(low, high, SIZE_MULTIPLE)
        self.model = model

    def forward(self, x: torch.Tensor):
        return self.model(self.size_guard(x))


def _finish(onnx_model, rule: str, metadata: dict[str, str]) -> None:
    """Give the weights their model's own names again, name the guard's nodes after the rule they enforce
    (ONNX Runtime's error names the node that failed), and attach the metadata."""
    graph = onnx_model.graph
    for name in list(graph.initializers):
        if name.startswith("model."):
            graph.initializers[name].name = name.removeprefix("model.")
    guard_values = {graph.initializers[n] for n in graph.initializers if n.startswith("size_guard.")}
    for index, node in enumerate(n for n in graph if any(v in guard_values for v in n.inputs)):
        node.name = f"size_guard_{index}: {rule}"
    onnx_model.metadata_props.update(metadata)


def export_onnx(
    model: nn.Module,
    path: str | os.PathLike,
    max_batch: int | None = None,
    size_range: tuple[int, int] | None = None,
    dynamic: bool = True,
    metadata: Mapping[str, Any] | None = None,
) -> str:
    """Write an ONNX file of a classifier or backbone (opset of torch's dynamo exporter; standard ops only).

    Inputs are named ``x``; outputs ``logits`` for a classifier, ``features0..3`` for a backbone. With
    ``dynamic`` the batch, height and width are symbolic: height and width multiples of 32 within
    ``size_range`` (default :func:`dynamic_size_range`; a range one graph cannot serve is refused), batch
    1..``max_batch`` (default 64; 1 makes the batch static). The graph refuses other sizes at run time (ONNX
    Runtime fails in a Gather named ``size_guard_N: <the rule>``). Static (``dynamic=False``): the one size
    :func:`example_size` (``size_range=(s, s)`` picks ``s``) and the one batch ``max_batch`` (default 2).
    The file's ``metadata_props`` carry ``size_min``, ``size_max``, ``size_multiple``, ``valid_sizes`` and
    ``max_batch``, plus ``metadata`` (e.g. the preprocessing of the weights: ``mean``, ``std``, ``crop_pct``,
    ...; non-strings JSON-encoded).
    Requires ``onnx`` and ``onnxscript`` (``pip install 'swin[onnx]'``).
    """
    _require_swin(model)
    max_batch = _check_batch((64 if dynamic else 2) if max_batch is None else max_batch)
    size_range = check_size_range(model, size_range)
    try:
        import onnxscript  # noqa: F401  (the exporter needs it; fail with our message, not deep inside torch)
    except ImportError:
        raise ImportError("ONNX export needs onnx and onnxscript: pip install 'swin[onnx]'") from None
    model.eval()
    side = example_size(model, size_range)
    low, high = size_range if dynamic else (side, side)
    if isinstance(model, SwinBackbone):
        outputs = [f"features{i}" for i in model.out_indices]
    else:
        outputs = ["logits"]
    program = torch.onnx.export(
        _Guarded(model, low, high).eval(),
        (_example(model, side, _example_batch(max_batch) if dynamic else max_batch),),
        dynamo=True,
        dynamic_shapes=_dynamic_shapes(max_batch, (low, high)) if dynamic else None,
        input_names=["x"],
        output_names=outputs,
    )
    rule = f"height and width must be multiples of {SIZE_MULTIPLE} in {low}..{high}"
    props = {
        "size_min": low,
        "size_max": high,
        "size_multiple": SIZE_MULTIPLE,
        "valid_sizes": rule,
        "max_batch": max_batch,
        **(metadata or {}),
    }
    _finish(program.model, rule, {k: v if isinstance(v, str) else json.dumps(v) for k, v in props.items()})
    program.save(os.fspath(path))
    return os.fspath(path)
