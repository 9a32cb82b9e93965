"""What a Swin Transformer costs: global MSA against window attention per stage, and the whole model.

Two counts, side by side. The *analytic* count adds up what each module says it costs (``macs`` on every
layer, the official code's ``flops()``); the *measured* count is what ``torch.utils.flop_counter`` saw in a
real forward. They should agree within 1%: the analytic count also adds one per LayerNorm element, as the
official code does, which the counter does not see.

Units: the paper's table calls multiply-accumulates "FLOPs". Everything here is in MACs unless a key says
``flops``, which is always 2 x MACs.

>>> import swin
>>> report = swin.flops("swin_t")
>>> round(report["macs"]["analytic"] / 1e9, 1)
4.5
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from .backbone import SwinBackbone
from .factory import create_model
from .model import SwinTransformer
from .registry import get_config, resolve_name, window_size_field

__all__ = ["TOLERANCE", "UNITS", "analytic_macs", "flop_counter", "flops", "measure_macs", "parse_size"]

UNITS = "MACs (multiply-accumulates, which the Swin paper's table calls FLOPs); FLOPs = 2 x MACs"

# Largest relative gap between measured and analytic totals that still counts as agreement.
TOLERANCE = 0.01


def parse_size(value: int | str | Sequence[int]) -> tuple[int, int]:
    """``224``, ``"224"``, ``"800,1333"``, ``"800x1333"`` or ``(800, 1333)`` -> (H, W) of positive integers."""
    if isinstance(value, int) and not isinstance(value, bool):
        parts: list[Any] = [value, value]
    elif isinstance(value, str):
        text = value.strip().lower().replace("x", ",")
        parts = [p.strip() for p in text.split(",")]
        if len(parts) == 1:
            parts = parts * 2
    elif isinstance(value, Sequence) and len(value) in (1, 2):
        parts = list(value) * (2 if len(value) == 1 else 1)
    else:
        parts = []
    try:
        if len(parts) != 2:
            raise ValueError
        size = tuple(int(p) for p in parts)
    except (TypeError, ValueError):
        raise ValueError(f"image size must be H or H,W in pixels (e.g. 224 or 800,1333), got {value!r}") from None
    if min(size) < 1:
        raise ValueError(f"image size must be positive, got {value!r}; give e.g. 224 or 800,1333")
    return size  # type: ignore[return-value]


# -- analytic ---------------------------------------------------------------------------------------------


def analytic_macs(model: SwinTransformer, img_size: int | Sequence[int], padded: bool = True) -> dict[str, int]:
    """Analytic MACs of each part of ``model`` for one (H, W) image, from the modules' ``macs`` methods.

    Keys: ``patch_embed``, ``layers.0`` ... (blocks and merging of each stage), ``norm``, ``head``, and
    ``total``. ``padded=False`` gives the paper's count, as if every map were a window multiple.
    """
    height, width = parse_size(img_size)
    parts = {"patch_embed": model.patch_embed.macs(height, width)}
    sizes = model.stage_sizes(height, width)
    for i, ((h, w), stage) in enumerate(zip(sizes, model.layers, strict=True)):
        parts[f"layers.{i}"] = stage.macs(h, w, padded)
    h, w = sizes[-1]
    # LayerNorm elements, as the official code counts every norm. (The official flops() counts this one as
    # num_features * H * W / 2**num_layers, four times the tokens that reach it: 0.0001 G for swin_t.)
    parts["norm"] = model.num_features * h * w
    head = model.head.in_features * model.head.out_features if isinstance(model.head, nn.Linear) else 0
    # Without pooling (global_pool="") the classifier scores every position of the last map.
    parts["head"] = head * (h * w if getattr(model, "global_pool", "avg") == "" else 1)
    parts["total"] = sum(parts.values())
    return parts


# -- measured ---------------------------------------------------------------------------------------------


def _sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """FLOPs of the two matmuls of attention, Q K^T and P V, at 2 per multiply-add (the counter's unit).

    The additive bias and the softmax are not matmuls and are not counted, as for torch's own formulas.
    """
    *batch, queries, head_dim = query_shape
    keys, value_dim = key_shape[-2], value_shape[-1]
    return 2 * math.prod(batch) * queries * keys * (head_dim + value_dim)


def flop_counter() -> FlopCounterMode:
    """``torch.utils.flop_counter.FlopCounterMode`` (2 FLOPs per multiply-add) that also counts CPU attention.

    Under no-grad on CPU, ``scaled_dot_product_attention`` on 4-D inputs dispatches to
    ``_scaled_dot_product_flash_attention_for_cpu``, for which torch (like fvcore) has no formula: without
    this one the attention matmuls would silently be missing from the count.
    """
    op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    return FlopCounterMode(display=False, custom_mapping={op: _sdpa_flops} if op is not None else {})


def measure_macs(model: nn.Module, img_size: int | Sequence[int]) -> tuple[int, dict[str, int]]:
    """MACs a counter saw in one forward of a (1, C, H, W) image on the model's device (meta works).

    Returns the total and the MACs per module path (``"layers.0"``, ``"layers.0.blocks.1.attn"``, ...).
    The model runs in eval mode without autograd; its training flag is restored afterwards.
    """
    height, width = parse_size(img_size)
    parameter = next(model.parameters())
    image = torch.zeros(1, model.in_chans, height, width, device=parameter.device, dtype=parameter.dtype)
    training = model.training
    model.eval()
    try:
        with torch.no_grad(), flop_counter() as counter:
            model(image)
    finally:
        model.train(training)
    root = type(model).__name__
    per_module = {}
    for name, counts in counter.get_flop_counts().items():
        if name.startswith(root + "."):
            per_module[name[len(root) + 1 :]] = sum(counts.values()) // 2
    return counter.get_total_flops() // 2, per_module


# -- the report -------------------------------------------------------------------------------------------


def _build(
    name: str, img_size: tuple[int, int], window_size: int | tuple[int, int] | None, semantics: str, device: str
):
    overrides: dict[str, Any] = {"img_size": img_size, "semantics": semantics}
    if window_size is not None:
        overrides["window_size"] = window_size
    with torch.device(device):
        return create_model(name, **overrides)


def _measure(model_or_name, model, img_size, window_size, semantics) -> tuple[int, dict[str, int], str]:
    if not isinstance(model_or_name, str):
        return (*measure_macs(model, img_size), str(next(model.parameters()).device))
    try:  # the meta device costs no memory and no arithmetic, so even swin_l at 1024 is instant
        return (*measure_macs(model, img_size), "meta")
    except (NotImplementedError, RuntimeError):  # an op without a meta kernel: count a real forward on CPU
        cpu_model = _build(model_or_name, img_size, window_size, semantics, "cpu")
        return (*measure_macs(cpu_model, img_size), "cpu")


def _doubled(macs: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if v is None else 2 * v) for k, v in macs.items()}


def flops(
    model_or_name: str | SwinTransformer,
    img_size: int | str | Sequence[int] | None = None,
    window_size: int | tuple[int, int] | Sequence[int | tuple[int, int]] | None = None,
    *,
    semantics: str = "classification",
    measure: bool = True,
) -> dict[str, Any]:
    """Cost of one image: global MSA against W-MSA per stage, the whole model analytic and measured.

    Args:
        model_or_name: a registered name (``"swin_t"``, a timm alias) or a built :class:`SwinTransformer`.
        img_size: H or (H, W); default: the size the model is registered / built for. A name is built for
            this size (``img_size`` override), as the official code builds each model for its input.
        window_size: window M override when building by name (``create_model(name, window_size=M)``).
        semantics: ``"classification"`` or ``"detection"``, when building by name.
        measure: also count a real forward (on the meta device for names, on the model's device for a
            model); ``False`` gives ``None`` for the measured figures.

    Returns:
        The data ``swin flops --format json`` prints: ``model``, ``img_size`` [H, W], ``window_size``,
        ``semantics``, ``params``, ``units``, ``padded`` (whether any stage pads its map to a window
        multiple), ``macs`` and ``flops`` (2 x MACs), each with ``analytic`` (what the forward computes,
        padding included), ``ideal`` (the paper's count, no padding), ``msa`` (the same model with global
        attention in every block) and ``measured``; ``check`` (``gap`` = measured / analytic - 1,
        ``tolerance``, ``ok``, ``measured_on``); ``parts`` (analytic and measured MACs of the patch
        embedding, each stage, the final norm and the head); ``stages``, one entry per stage with
        ``resolution`` [h, w], ``padded_resolution``, ``window``, ``channels``, ``depth``, ``msa_macs``,
        ``wmsa_macs``, ``ratio`` (MSA / W-MSA), ``wmsa_macs_padded`` and ``wmsa_macs_measured``.

    Raises:
        KeyError: unknown model name (the message names the closest registered ones).
        ValueError: a bad image size or window, or an image smaller than one patch.
    """
    if isinstance(model_or_name, str):
        name = resolve_name(model_or_name)
        if window_size is not None:  # as create_model takes it: one side, (height, width), or one per stage
            try:
                window_size = window_size_field(window_size)
            except (TypeError, ValueError):
                raise ValueError(
                    f"window_size must be a positive integer (e.g. 7 or 12), a (height, width) pair of them, or one "
                    f"of those per stage, got {window_size!r}"
                ) from None
        size = parse_size(get_config(name).img_size if img_size is None else img_size)
        _check_patch(size, get_config(name).patch_size)  # before a model is built for that size
        model = _build(name, size, window_size, semantics, "meta")
    elif isinstance(model_or_name, SwinTransformer):
        if window_size is not None:
            raise ValueError(
                "window_size rebuilds a registered model: pass a name (flops('swin_t', window_size=12)), "
                "or build the model with create_model(name, window_size=12) and pass it"
            )
        model = model_or_name
        name = model.config.name
        size = parse_size(model.config.img_size if img_size is None else img_size)
    elif isinstance(model_or_name, SwinBackbone):  # the trunk it shares with the classifier is what is counted
        raise TypeError(
            "flops counts a classifier: for a features_only backbone's trunk pass its name with its rules, "
            f"flops({model_or_name.config.name!r}, size, semantics={model_or_name.semantics!r})"
        )
    else:
        raise TypeError(
            f"expected a model name or a SwinTransformer, got {type(model_or_name).__name__}; "
            "see swin.list_models() for names"
        )
    _check_patch(size, model.patch_embed.patch_size)

    ideal = analytic_macs(model, size, padded=False)
    padded = analytic_macs(model, size, padded=True)
    measured, per_module, measured_on = None, {}, None
    if measure:
        measured, per_module, measured_on = _measure(model_or_name, model, size, window_size, semantics)

    # Swin V2's position bias MLP runs once per window size, not per token: the official flops() formulas
    # leave it out, so every measured figure here does too (its MACs are reported as
    # check.position_bias_mlp_macs).
    def position_mlp(prefix: str) -> int:
        return sum(v for k, v in per_module.items() if k.startswith(prefix) and k.endswith(".attn.cpb_mlp"))

    if measure:
        measured_mlp = position_mlp("")
        per_module = {k: v - position_mlp(k + ".") for k, v in per_module.items() if not k.endswith(".cpb_mlp")}
        measured -= measured_mlp

    stages = []
    for i, ((h, w), stage) in enumerate(zip(model.stage_sizes(*size), model.layers, strict=True)):
        attention = stage.attention_macs(h, w)
        attn_measured = [
            v for k, v in per_module.items() if k.startswith(f"layers.{i}.blocks.") and k.endswith(".attn")
        ]
        stages.append(
            {
                "stage": i + 1,
                "resolution": [h, w],
                "padded_resolution": list(stage.padded_size(h, w)),
                "window": list(stage.window),
                "channels": stage.dim,
                "depth": stage.depth,
                "msa_macs": attention["msa"],
                "wmsa_macs": attention["wmsa"],
                "ratio": attention["msa"] / attention["wmsa"],
                "wmsa_macs_padded": attention["wmsa_padded"],
                "wmsa_macs_measured": sum(attn_measured) if measure else None,
            }
        )

    macs = {
        "analytic": padded["total"],
        "ideal": ideal["total"],
        "msa": ideal["total"] - sum(s["wmsa_macs"] for s in stages) + sum(s["msa_macs"] for s in stages),
        "measured": measured,
    }
    gap = None if measured is None else measured / macs["analytic"] - 1
    parts = []
    for key in [k for k in padded if k != "total"]:
        label = f"stage {int(key.split('.')[1]) + 1}" if key.startswith("layers.") else key
        parts.append(
            {
                "part": label,
                "analytic": padded[key],
                "ideal": ideal[key],
                "measured": per_module.get(key, 0) if measure else None,
            }
        )
    return {
        "model": name,
        "img_size": list(size),
        "window_size": model.config.window_size,
        "semantics": model.semantics,
        "params": sum(p.numel() for p in model.parameters()),
        "units": UNITS,
        "padded": any(s["padded_resolution"] != s["resolution"] for s in stages),
        "macs": macs,
        "flops": _doubled(macs),
        "check": {
            "gap": gap,
            "tolerance": TOLERANCE,
            "ok": None if gap is None else abs(gap) <= TOLERANCE,
            "position_bias_mlp_macs": measured_mlp if measure else None,
            "measured_on": measured_on,
        },
        "parts": parts,
        "stages": stages,
    }


def _check_patch(size: tuple[int, int], patch: int) -> None:
    if min(size) < patch:
        raise ValueError(f"image {size[0]}x{size[1]} is smaller than one {patch}x{patch} patch; give at least {patch}")
