"""Deployment: ``torch.export`` programs and ONNX files with dynamic batch, height and width."""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn
from torch.export import Dim

from .atomic import atomic_output, check_output
from .backbone import SwinBackbone
from .layers.semantics import get_semantics
from .trunk import SwinTrunk

__all__ = [
    "SIZE_MULTIPLE",
    "check_size_range",
    "check_size_ranges",
    "dynamic_size_range",
    "example_shape",
    "example_size",
    "export_onnx",
    "export_program",
    "static_shape",
    "valid_size_ranges",
]

# Exported sizes are multiples of 32 (patch 4 x three merges), so no patch or merge padding branch is traced.
SIZE_MULTIPLE = 32
_MAX_STEPS = 64  # 2048 pixels
_AXES = ("height", "width")  # axis 0 and 1 of a size range, dimensions 2 and 3 of the input


def _axes(axis: int | None) -> tuple[int, ...]:
    """The axes a range is for: ``axis`` (0 height, 1 width), or both for ``None`` (one range for both sides)."""
    if axis is None:
        return (0, 1)
    if axis not in (0, 1):
        raise ValueError(f"axis must be 0 (height), 1 (width) or None (both), got {axis!r}")
    return (axis,)


def valid_size_ranges(model: SwinTrunk, axis: int | None = None) -> list[tuple[int, int]]:
    """Every range (min, max) of sizes, in pixels and multiples of 32, that one exported graph serves correctly,
    in increasing order: of heights (``axis=0``), of widths (``axis=1``), or of sizes given to both sides
    (``None``; the same on a model whose windows are square). An exported range must lie inside one of them
    (see :func:`dynamic_size_range`)."""
    axes = _axes(axis)
    patch = model.patch_embed.patch_size

    def pattern(k: int) -> tuple[bool, ...]:
        # the map side of stage i at size 32k: 32k / patch, then halved (rounding up) by each merge; compared
        # with the stage's window along each axis asked for (a model built for a rectangle has windows that
        # are not square, e.g. 7x5 in the last stage at 224x160, so its width changes behaviour elsewhere)
        sides = [-(-k * SIZE_MULTIPLE // patch)]
        for _ in model.layers[1:]:
            sides.append(-(-sides[-1] // 2))
        return tuple(side > stage.window[a] for a in axes for side, stage in zip(sides, model.layers, strict=True))

    if not get_semantics(model.semantics).shrink_window:  # detection: the window never shrinks
        # sizes where every stage's map is larger than its window (more than one window per axis), from the
        # smallest up (the sides grow with the size)
        first = next((k for k in range(1, _MAX_STEPS + 1) if all(pattern(k))), _MAX_STEPS + 1)
        return [(first * SIZE_MULTIPLE, _MAX_STEPS * SIZE_MULTIPLE)]
    ranges: list[tuple[int, int]] = []
    start = 1
    for k in range(2, _MAX_STEPS + 2):
        if k > _MAX_STEPS or pattern(k) != pattern(start):
            ranges.append((start * SIZE_MULTIPLE, (k - 1) * SIZE_MULTIPLE))
            start = k
    return ranges


def dynamic_size_range(model: SwinTrunk, axis: int | None = None) -> tuple[int, int]:
    """Range (min, max) of sizes, in pixels and multiples of 32, that one exported graph serves: of heights
    (``axis=0``, around ``img_size[0]``), of widths (``axis=1``, around ``img_size[1]``) or of sizes given to
    both sides (``None``, around the smaller side; see :func:`valid_size_ranges`).

    One traced graph cannot branch on whether a stage's map is larger than its window: that decides the
    shift under classification semantics (the official rule) and whether the stage has one window or
    several (tracing specialises a count of one). So a range keeps every stage on one side of that line.
    Classification: the widest such range around the model's own ``img_size`` (128-224 for swin_t, whose
    last stage is one window; build with ``img_size=256`` for 256-2048). Detection: from the first size
    where every stage has several windows (256 at window 7) up to 2048, the sizes detectors use.
    """
    ranges = valid_size_ranges(model, axis)
    if len(ranges) == 1:
        return ranges[0]
    side = min(model.config.img_size) if axis is None else model.config.img_size[axis]
    native = max(1, side // SIZE_MULTIPLE) * SIZE_MULTIPLE
    return next(r for r in ranges if r[0] <= min(native, _MAX_STEPS * SIZE_MULTIPLE) <= r[1])


def check_size_range(model: SwinTrunk, size_range: tuple[int, int] | None, axis: int | None = None) -> tuple[int, int]:
    """``size_range`` (default :func:`dynamic_size_range`) if one graph can serve all of it, else a
    ``ValueError`` naming the ranges that can: outside them the traced graph computes wrong results
    (measured: 0.2 max logit error, top-1 changed), so such a range is refused before any tracing. ``axis``:
    the range is of heights (0), of widths (1) or of sizes given to both sides (``None``)."""
    if size_range is None:
        return dynamic_size_range(model, axis)
    subject = "size" if axis is None else _AXES[axis]
    try:
        low, high = (int(v) for v in size_range)
    except (TypeError, ValueError):
        raise ValueError(f"{subject} range must be (min, max) in pixels, e.g. (128, 224), got {size_range!r}") from None
    if low % SIZE_MULTIPLE or high % SIZE_MULTIPLE or not 0 < low <= high:
        raise ValueError(
            f"{subject} range {low}..{high}: min and max must be multiples of {SIZE_MULTIPLE} with 0 < min <= max"
        )
    ranges = valid_size_ranges(model, axis)
    if not any(a <= low and high <= b for a, b in ranges):
        default = dynamic_size_range(model, axis)
        shown = ", ".join(f"{a}..{b}" for a, b in ranges)
        qualifier = "" if axis is None else f"{_AXES[axis]} "
        around = "its img_size" if axis is None else f"its img_size {_AXES[axis]}"
        # a model built for a rectangle: its heights and widths may each have a wider range of their own
        per_axis = axis is None and valid_size_ranges(model, 0) != valid_size_ranges(model, 1)
        raise ValueError(
            f"{subject} range {low}..{high} is wider than one exported graph of {model.config.name} computes "
            f"correctly: the widest valid {qualifier}range is {default[0]}..{default[1]} (around {around}); every "
            f"valid {qualifier}range: {shown} (multiples of {SIZE_MULTIPLE}). Export one file per range"
            + (", or give heights and widths ranges of their own: ((min, max), (min, max))" if per_axis else "")
        )
    return low, high


def _per_axis(size_range: Any) -> bool:
    """Whether ``size_range`` is ((min, max), (min, max)), one range per axis, rather than one (min, max)."""
    return isinstance(size_range, (tuple, list)) and all(isinstance(r, (tuple, list)) for r in size_range)


def check_size_ranges(
    model: SwinTrunk, size_range: tuple[int, int] | tuple[tuple[int, int], tuple[int, int]] | None = None
) -> tuple[tuple[int, int], tuple[int, int]]:
    """The (heights, widths) ranges an export serves, each (min, max) checked by :func:`check_size_range`.

    ``size_range``: ``None`` (each axis' :func:`dynamic_size_range`, around its own side of ``img_size``), one
    (min, max) for both sides, or ((min, max), (min, max)) for height and width. A model built for a rectangle
    has windows that are not square, and its heights and widths then change behaviour at different sizes.
    """
    if size_range is None:
        return dynamic_size_range(model, 0), dynamic_size_range(model, 1)
    if _per_axis(size_range):
        if len(size_range) != 2:
            raise ValueError(
                f"size range per axis must be ((min, max), (min, max)) for height and width, got {size_range!r}"
            )
        return check_size_range(model, size_range[0], 0), check_size_range(model, size_range[1], 1)
    both = check_size_range(model, size_range)
    return both, both


def _check_batch(max_batch: int) -> int:
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise ValueError(f"max_batch must be a whole number of at least 1 (the largest batch), got {max_batch!r}")
    return max_batch


def _dynamic_shapes(max_batch: int, heights: tuple[int, int], widths: tuple[int, int]) -> dict[str, Any]:
    """Symbolic height and width, each over its own range (a range of one size leaves that side static: ``Dim``
    needs min < max); a symbolic batch 1..max_batch, or a static batch of 1 when ``max_batch`` is 1 (the
    example input then has batch 1, see :func:`_example_batch`)."""
    shapes: dict[int, Any] = {}
    for dim, axis, (low, high) in ((2, 0, heights), (3, 1, widths)):
        if low < high:
            steps = Dim(f"{_AXES[axis]}_steps", min=low // SIZE_MULTIPLE, max=high // SIZE_MULTIPLE)
            shapes[dim] = SIZE_MULTIPLE * steps
    if max_batch > 1:
        shapes[0] = Dim("batch", min=1, max=max_batch)
    return {"x": shapes}


def _example_batch(max_batch: int) -> int:
    """2 for a symbolic batch (an example of 1 would specialise the graph to it), else the static batch 1."""
    return 2 if max_batch > 1 else 1


def _example_side(model: SwinTrunk, size_range: tuple[int, int], axis: int | None) -> int:
    """A side inside ``size_range``, near the model's own (``axis`` as in :func:`check_size_range`), whose
    first-stage map is not a multiple of the window along the axes it is for, so that no padding branch is
    specialised."""
    low, high = size_range
    native = min(model.config.img_size) if axis is None else model.config.img_size[axis]
    side = min(max(native, low), high)
    side -= side % SIZE_MULTIPLE
    patch, window = model.patch_embed.patch_size, model.layers[0].window
    if any((side // patch) % window[a] == 0 for a in _axes(axis)) and side + SIZE_MULTIPLE <= high:
        side += SIZE_MULTIPLE
    return side


def example_size(model: SwinTrunk, size_range: tuple[int, int] | None = None) -> int:
    """The side of the square example input traced for one (min, max) range of both sides (the only size of
    a static ONNX export given one): inside the range and not a window multiple at the first stage, so that
    no padding branch is specialised. Per-axis ranges: :func:`example_shape`."""
    return _example_side(model, check_size_range(model, size_range), None)


def example_shape(
    model: SwinTrunk, size_range: tuple[int, int] | tuple[tuple[int, int], tuple[int, int]] | None = None
) -> tuple[int, int]:
    """(height, width) of the example input traced, the only size of a static ONNX export: square,
    :func:`example_size`, for one (min, max) of both sides; else each side inside its own range (``size_range``
    as in :func:`check_size_ranges`; by default near ``img_size``)."""
    if size_range is not None and not _per_axis(size_range):
        side = example_size(model, size_range)
        return side, side
    heights, widths = check_size_ranges(model, size_range)
    return _example_side(model, heights, 0), _example_side(model, widths, 1)


def static_shape(
    model: SwinTrunk, size_range: tuple[int, int] | tuple[tuple[int, int], tuple[int, int]] | None = None
) -> tuple[int, int]:
    """(height, width) of a static export: the one size ``size_range`` gives, ``(s, s)`` or ``((h, h), (w, w))``,
    any multiple of 32 of at least one patch (a graph traced at one shape computes as eager there: none of the
    ranges of :func:`valid_size_ranges` applies); by default :func:`example_shape`'s."""
    if size_range is None:
        return example_shape(model, None)
    ranges = size_range if _per_axis(size_range) else (size_range, size_range)
    try:
        (h_low, h_high), (w_low, w_high) = ((int(a), int(b)) for a, b in ranges)
    except (TypeError, ValueError):
        raise ValueError(f"a static export's size is (s, s) or ((h, h), (w, w)), got {size_range!r}") from None
    if h_low != h_high or w_low != w_high:
        raise ValueError(f"a static export has one size: give it twice, (s, s) or ((h, h), (w, w)), got {size_range!r}")
    if h_low % SIZE_MULTIPLE or w_low % SIZE_MULTIPLE or min(h_low, w_low) < model.patch_embed.patch_size:
        raise ValueError(
            f"a static export's height and width must be positive multiples of {SIZE_MULTIPLE}, got {size_range!r}"
        )
    return h_low, w_low


def _example(model: SwinTrunk, shape: tuple[int, int], batch: int) -> torch.Tensor:
    """An input to trace with, drawn from a generator of its own (the caller's random stream is left as it is)."""
    parameter = next(model.parameters())
    generator = torch.Generator().manual_seed(0)
    example = torch.randn(batch, model.in_chans, *shape, generator=generator)
    return example.to(device=parameter.device, dtype=parameter.dtype)


def _require_swin(model: nn.Module) -> None:
    if not isinstance(model, SwinTrunk):
        hint = (
            ": export the model it runs (its .model)"
            if isinstance(getattr(model, "model", None), SwinTrunk)  # swin.optimize's OptimizedModel
            else ""
        )
        raise TypeError(f"expected a swin model (SwinTransformer or SwinBackbone), got {type(model).__name__}{hint}")


@contextlib.contextmanager
def _in_eval(model: nn.Module) -> Iterator[None]:
    """``model`` in eval mode for an export, each module's own mode restored afterwards (a model exported in
    the middle of training trains on with its dropout and drop_path), whether the export worked or not."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def export_program(
    model: nn.Module,
    max_batch: int = 64,
    size_range: tuple[int, int] | tuple[tuple[int, int], tuple[int, int]] | None = None,
) -> torch.export.ExportedProgram:
    """``torch.export`` of a classifier or backbone with dynamic batch (1..max_batch; ``max_batch=1``: a static
    batch of 1) and dynamic height and width: multiples of 32 within ``size_range``, one (min, max) for both
    sides or ((min, max), (min, max)) for height and width (default: each axis' :func:`dynamic_size_range`; a
    range one graph cannot serve is refused, see :func:`check_size_ranges`). Eval mode (the model's own modes
    are restored afterwards); the model's dtype. The program itself refuses other sizes and batches."""
    _require_swin(model)
    _check_batch(max_batch)
    heights, widths = check_size_ranges(model, size_range)
    example = _example(model, example_shape(model, size_range), _example_batch(max_batch))
    with _in_eval(model), _size_oblivious():
        return torch.export.export(model, (example,), dynamic_shapes=_dynamic_shapes(max_batch, heights, widths))


def _size_oblivious():
    """Trace as torch's ONNX exporter does, with ``backed_size_oblivious``: a symbolic size is assumed not to
    be 0 or 1 where a branch asks, instead of the shape solver proving it for every later expression. Five
    times faster on Swin (a two-stage backbone: 53 s -> 10 s on two cores) and the same graph: nothing in the
    model branches on a size being 0 or 1 (a batch of one is checked against eager in tests/test_deploy.py)."""
    return torch.fx.experimental._config.patch(backed_size_oblivious=True)


class _SizeGuard(nn.Module):
    """Make ONNX Runtime refuse an input whose height or width the graph does not serve.

    ONNX keeps no range on a symbolic dimension, and the traced graph runs at any size, silently wrong outside
    its range. So the graph adds to its input a zero gathered through tables, one per axis (each has its own
    range): ``heights[h]`` fails (index out of bounds) above the largest height, and is 1 (not 0) at a height
    below the smallest or off the 32 grid, which makes the last gather, from a one-element table, fail; the
    same for widths. ONNX Runtime checks Gather indices and stops with an error naming the node;
    :func:`export_onnx` names those nodes after the rule.
    """

    def __init__(self, heights: tuple[int, int], widths: tuple[int, int], step: int) -> None:
        super().__init__()
        for name, (low, high) in (("heights", heights), ("widths", widths)):
            table = torch.ones(high + 1, dtype=torch.int64)
            table[low::step] = 0
            self.register_buffer(name, table)
        self.register_buffer("zero", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        failures = self.heights[x.shape[-2]] + self.widths[x.shape[-1]]  # 0 when both sides are valid
        return x + self.zero[failures].to(x.dtype)


class _Guarded(nn.Module):
    def __init__(self, model: nn.Module, heights: tuple[int, int], widths: tuple[int, int]) -> None:
        super().__init__()
        self.size_guard = _SizeGuard(heights, widths, SIZE_MULTIPLE)
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


# A logger whose warning the exporter triggers a dozen times per Swin graph, about attributes it writes itself
# (an empty list of ints, written as ints): nothing a user can act on.
_EXPORTER_NOISE = "onnx_ir._convenience"


@contextlib.contextmanager
def _quiet(logger_name: str) -> Iterator[None]:
    """Only errors from ``logger_name`` while the body runs."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


# What a runtime needs to prepare images as the model expects (timm's pretrained_cfg keys).
_PREPROCESSING_KEYS = ("input_size", "resize_size", "crop_pct", "crop_mode", "interpolation", "mean", "std")


def preprocessing_metadata(config: Mapping[str, Any]) -> dict[str, Any]:
    """The preprocessing entries of a data config (``swin.data_config``'s), for an ONNX file's metadata."""
    return {key: config[key] for key in _PREPROCESSING_KEYS if config.get(key) is not None}


def _preprocessing(model: nn.Module) -> dict[str, Any]:
    from .weights.data_config import data_config

    return preprocessing_metadata(data_config(model))


def export_onnx(
    model: nn.Module,
    path: str | os.PathLike,
    max_batch: int | None = None,
    size_range: tuple[int, int] | tuple[tuple[int, int], tuple[int, int]] | None = None,
    dynamic: bool = True,
    metadata: Mapping[str, Any] | None = None,
    dtype: torch.dtype = torch.float32,
) -> str:
    """Write an ONNX file of a classifier or backbone (opset of torch's dynamo exporter; standard ops only).

    Inputs are named ``x``; outputs ``logits`` for a classifier, ``features0..3`` for a backbone. With
    ``dynamic`` the batch, height and width are symbolic: height and width multiples of 32 within
    ``size_range``, one (min, max) for both sides or ((min, max), (min, max)) for height and width (default:
    each axis' :func:`dynamic_size_range`; a range one graph cannot serve is refused, see
    :func:`check_size_ranges`), batch 1..``max_batch`` (default 64; 1 makes the batch static). The graph
    refuses other sizes at run time (ONNX Runtime fails in a Gather named ``size_guard_N: <the rule>``).
    Static (``dynamic=False``): the one size :func:`static_shape` (``size_range=(s, s)`` picks ``s`` x ``s``)
    and the one batch ``max_batch`` (default 2). The file's ``metadata_props`` carry ``height_min``,
    ``height_max``, ``width_min``, ``width_max``, ``size_min`` and ``size_max`` (when height and width share
    one range), ``size_multiple``, ``valid_sizes`` and ``max_batch``, plus ``metadata`` (non-strings
    JSON-encoded), by default the model's evaluation preprocessing (``swin.data_config(model)``: ``input_size``,
    ``resize_size``, ``crop_pct``, ``crop_mode``, ``interpolation``, ``mean``, ``std``); ``metadata={}`` for none.
    Requires ``onnx`` and ``onnxscript`` (``pip install onnx onnxscript``; the ``onnx`` extra of a checkout,
    ``pip install -e ".[onnx]"``, adds onnxruntime).

    The graph computes in ``dtype``: float32 by default, what ONNX Runtime's CPU kernels run (its CPU provider
    refuses a bfloat16 Conv), so a model cast to bfloat16 (``swin.optimize`` does so where the CPU has bf16
    matmul) is exported from a float32 copy; ``dtype=torch.bfloat16`` or ``torch.float16`` for a runtime that
    takes them. Exported in eval mode, the model's own modes restored afterwards. ``path`` is checked before
    the export (its folder must exist) and written whole or not at all (a temporary file renamed over it).
    """
    _require_swin(model)
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype expects a floating point torch.dtype (torch.float32, ...), got {dtype!r}")
    check_output(path)  # before minutes of tracing: a missing folder, a directory, a link...
    max_batch = _check_batch((64 if dynamic else 2) if max_batch is None else max_batch)
    if dynamic:
        heights, widths = check_size_ranges(model, size_range)
        height, width = example_shape(model, size_range)
    else:  # one traced shape computes as eager at that shape, whatever a range around it would do
        height, width = static_shape(model, size_range)
        heights, widths = (height, height), (width, width)
    try:
        import onnxscript  # noqa: F401  (the exporter needs it; fail with our message, not deep inside torch)
    except ImportError:
        raise ImportError(
            "ONNX export needs onnx and onnxscript: pip install onnx onnxscript (or, in a checkout, "
            'pip install -e ".[onnx]")'
        ) from None
    if next(model.parameters()).dtype != dtype:
        model = copy.deepcopy(model).to(dtype)  # the caller's model keeps its dtype
    if isinstance(model, SwinBackbone):
        outputs = [f"features{i}" for i in model.out_indices]
    else:
        outputs = ["logits"]
    with _in_eval(model), _quiet(_EXPORTER_NOISE):
        program = torch.onnx.export(
            _Guarded(model, heights, widths).eval(),
            (_example(model, (height, width), _example_batch(max_batch) if dynamic else max_batch),),
            dynamo=True,
            verbose=False,  # torch's progress lines are no output of ours
            dynamic_shapes=_dynamic_shapes(max_batch, heights, widths) if dynamic else None,
            input_names=["x"],
            output_names=outputs,
        )
    (height_min, height_max), (width_min, width_max) = heights, widths
    if heights == widths:
        rule = f"height and width must be multiples of {SIZE_MULTIPLE} in {height_min}..{height_max}"
        shared = {"size_min": height_min, "size_max": height_max}
    else:
        rule = (
            f"height and width must be multiples of {SIZE_MULTIPLE}, height in {height_min}..{height_max} and "
            f"width in {width_min}..{width_max}"
        )
        shared = {}  # no one range serves both sides: a reader of size_min/size_max would take a wrong one
    props = {
        **shared,
        "height_min": height_min,
        "height_max": height_max,
        "width_min": width_min,
        "width_max": width_max,
        "size_multiple": SIZE_MULTIPLE,
        "valid_sizes": rule,
        "max_batch": max_batch,
        **(_preprocessing(model) if metadata is None else metadata),
    }
    _finish(program.model, rule, {k: v if isinstance(v, str) else json.dumps(v) for k, v in props.items()})
    with atomic_output(path) as temporary:
        program.save(temporary)
    return os.fspath(path)
