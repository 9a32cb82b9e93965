"""Convert state dicts between checkpoint layouts: detect, unwrap, rename, transform, drop derived buffers."""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping

import torch
from torch import nn

from .checks import require_swin_trunk
from .layouts import DETECTION_ORDER, LAYOUTS, Layout

__all__ = ["Unwrapped", "convert", "detect_layout", "saved_coordinates", "unwrap"]

# Keys a checkpoint keeps its state dict under, the first one present winning. The moving average (EMA) of
# the weights comes before the weights themselves, as timm's ``load_state_dict(use_ema=True)``, its default,
# reads them: state_dict_ema, model_ema, state_dict, model. A timm training checkpoint holds both state_dict
# and state_dict_ema, and timm evaluates and publishes the EMA. model_state and module are other
# training scripts' names, tried last.
_WRAPPERS = ("state_dict_ema", "model_ema", "state_dict", "model", "model_state", "module")
_EMA_WRAPPERS = ("state_dict_ema", "model_ema")
# Prefixes that wrap a whole state dict: DDP's module., torch.compile's _orig_mod., a model/backbone attribute.
_PREFIXES = ("module.", "_orig_mod.", "model.", "backbone.")
# How deep a checkpoint may nest its state dict ({"model": {"state_dict": ...}}) before it is refused.
_MAX_NESTING = 8
# Keys of a Swin trunk in any supported layout. A two-stage detector's other parts (neck., rpn_head., ...)
# never match; a DETR-style detector's transformer (encoder.layers.*) does.
_TRUNK = re.compile(r"^(patch_embed|layers|stages|features|absolute_pos_embed|embeddings|encoder|swin)\.")
_BACKBONE = "backbone."
# Where a detector keeps its trunk, the most specific first: torchvision's BackboneWithFPN under a detector, the
# BackboneWithFPN alone, mmdetection's and the official detection code's backbone.
_DETECTOR_PREFIXES = ("backbone.body.", "body.", _BACKBONE)
_AVERAGED_COUNT = "n_averaged"  # torch.optim.swa_utils.AveragedModel's buffer beside its module.* weights


class Unwrapped(dict):
    """What :func:`unwrap` returns: the checkpoint's tensors by name, and in ``passthrough`` the names of
    those that lay beside a detector's ``backbone.`` (neck, heads, a DETR transformer). Conversion neither
    reads the layout from those nor renames them: they are kept as they are, and loading reports them as
    keys the model does not have."""

    passthrough: frozenset[str] = frozenset()
    # (EMA key, trained key) where the checkpoint held both kinds of weights at the level unwrap chose between
    # them (a training checkpoint saved with EMA), else None: which one was read depends on ``use_ema``.
    ema_and_trained: tuple[str, str] | None = None


def _forms_trunk(sd: Mapping[str, torch.Tensor]) -> bool:
    """Whether ``sd`` (any supported layout) converts to a complete Swin trunk."""
    try:
        require_swin_trunk(_convert(sd, _layout(detect_layout(sd))), "the backbone")
    except (ValueError, TypeError, KeyError, IndexError, RuntimeError):  # CorruptCheckpointError is a ValueError
        return False
    return True


def _strip_backbone(tensors: dict[str, torch.Tensor]) -> Unwrapped:
    """A detector checkpoint's trunk from under ``backbone.`` (mmdetection, the official detection code) or
    ``backbone.body.`` / ``body.`` (torchvision's detectors and their ``BackboneWithFPN``, as
    ``swin.detection_backbone`` builds them), its other keys passed through; the tensors as they are when the
    prefixed keys are no Swin trunk and other keys look like one."""
    for prefix in _DETECTOR_PREFIXES:
        inside = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
        beside = {k: v for k, v in tensors.items() if not k.startswith(prefix)}
        # backbone.: where the other keys cannot be mistaken for the trunk (neck., rpn_head.), the prefix goes, as
        # it always has; otherwise (a DETR's encoder.layers.*) only when the backbone is a whole Swin trunk of its
        # own. body.: only a whole Swin trunk (torchvision's detectors hold other backbones there).
        lenient = prefix == _BACKBONE and not any(_TRUNK.match(k) for k in beside)
        if inside and (lenient or _forms_trunk(inside)):
            out = Unwrapped(inside)
            out.update({k: v for k, v in beside.items() if k not in inside})
            out.passthrough = frozenset(k for k in beside if k not in inside)
            return out
    return Unwrapped(tensors)


def unwrap(checkpoint: Mapping, *, use_ema: bool = True, whole_model: bool = False) -> Unwrapped:
    """The tensor mapping inside a checkpoint: ``{"model": sd}``, ``{"state_dict": sd}``, ``module.`` ...

    A training checkpoint that also holds the weights' moving average gives that (``state_dict_ema``, then
    ``model_ema``, before ``state_dict`` and ``model``), as ``timm.models.load_checkpoint`` loads it by default;
    ``use_ema=False`` gives the trained weights instead (timm's ``use_ema=False``).

    A detector checkpoint (mmdetection's two-stage and DETR-style detectors, the official detection code)
    keeps the trunk under ``backbone.`` beside its neck, heads or detection transformer: the prefix is
    removed from the backbone's keys and the others are kept as they are, in ``passthrough`` (conversion
    leaves them alone; loading reports them as keys the model does not have).

    ``whole_model=True`` reads the state dict of a whole model whose backbone lies beside its heads (an
    UperNet's ``backbone.body.*`` beside ``decode_head.*``): wrappers and the ``module.`` / ``_orig_mod.`` /
    ``model.`` prefixes are removed, and nothing is taken out from under ``backbone.``.
    """
    if isinstance(checkpoint, Unwrapped):
        return checkpoint
    sd = checkpoint
    wrappers = _WRAPPERS if use_ema else tuple(k for k in _WRAPPERS if k not in _EMA_WRAPPERS)
    seen: set[int] = set()
    both = None
    # A wrapper key is followed where it holds a mapping, as timm's load_state_dict does, even with tensors
    # beside it (a training script's metrics: torchvision's and PyTorch's ImageNet examples save best_acc1 as
    # one), as long as it leads to tensors: a metadata dict under "model" beside a flat state dict is no wrapper.
    while isinstance(sd, Mapping):
        inner = next((sd[k] for k in wrappers if isinstance(sd.get(k), Mapping)), None)
        if inner is None or (_holds_tensors(sd, ()) and not _holds_tensors(inner, wrappers)):
            break
        ema = next((k for k in _EMA_WRAPPERS if isinstance(sd.get(k), Mapping)), None)
        trained = next((k for k in _WRAPPERS if k not in _EMA_WRAPPERS and isinstance(sd.get(k), Mapping)), None)
        both = (ema, trained) if ema and trained else both
        seen.add(id(sd))
        if id(inner) in seen or len(seen) > _MAX_NESTING:
            raise ValueError(
                f"the checkpoint nests its state dict in a cycle or more than {_MAX_NESTING} levels deep "
                f"(under {', '.join(wrappers)}); it is not a checkpoint this package can read"
            )
        sd = inner
    if not isinstance(sd, Mapping):
        raise TypeError(f"expected a state dict (a mapping of names to tensors), got {type(sd).__name__}")
    tensors = {k: v for k, v in sd.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        ema_only = not use_ema and any(isinstance(sd.get(k), Mapping) for k in _EMA_WRAPPERS)
        advice = "; it holds only EMA weights (state_dict_ema / model_ema): pass use_ema=True" if ema_only else ""
        raise ValueError(
            f"no tensors found in the checkpoint; its top-level keys are {sorted(map(str, sd))[:10]}{advice}"
        )
    _refuse_shards(tensors)
    tensors = _without_averaged_model_count(tensors)
    # in any order and nesting, as timm's clean_state_dict: torch.compile of a DDP model saves _orig_mod.module.
    prefixes = [p for p in _PREFIXES if not (whole_model and p == _BACKBONE)]
    while prefix := next((p for p in prefixes if all(isinstance(k, str) and k.startswith(p) for k in tensors)), None):
        tensors = {k[len(prefix) :]: v for k, v in tensors.items()}
    unwrapped = Unwrapped(tensors) if whole_model else _strip_backbone(tensors)
    unwrapped.ema_and_trained = both
    return unwrapped


def _refuse_shards(tensors: Mapping[str, torch.Tensor]) -> None:
    """Raise where the tensors are DTensors: ``model.state_dict()`` of an FSDP2 (``fully_shard``) or
    tensor-parallel model, one rank's shards. Any op on them (the finiteness check, a conversion) is a
    collective the other ranks never join: rank 0 alone loading such a file hung."""
    dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
    if dtensor is None:  # none exist unless torch's distributed tensors were imported
        return
    sharded = [k for k, v in tensors.items() if isinstance(v, dtensor)]
    if sharded:
        raise ValueError(
            f"the checkpoint holds DTensors ({sharded[0]}{f' and {len(sharded) - 1} more' if len(sharded) > 1 else ''}"
            "): one rank's shards of a distributed (FSDP2 fully_shard or tensor-parallel) model, not its weights. "
            "Save the whole weights with torch.distributed.checkpoint.state_dict.get_model_state_dict(model, "
            "options=StateDictOptions(full_state_dict=True, cpu_offload=True)) on every rank and torch.save on "
            "rank 0, or turn a torch.distributed.checkpoint folder into one file with "
            "torch.distributed.checkpoint.format_utils.dcp_to_torch_save"
        )


def _holds_tensors(mapping: Mapping, wrappers: tuple[str, ...], depth: int = 0) -> bool:
    """Whether ``mapping`` has tensors among its values, or under the first of ``wrappers`` it has (the one
    :func:`unwrap` would follow), within a few levels."""
    if any(isinstance(v, torch.Tensor) for v in mapping.values()):
        return True
    inner = next((mapping[k] for k in wrappers if isinstance(mapping.get(k), Mapping)), None)
    return inner is not None and depth < _MAX_NESTING and _holds_tensors(inner, wrappers, depth + 1)


def _without_averaged_model_count(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The weights of a ``torch.optim.swa_utils.AveragedModel`` state dict (torchvision's EMA, whose training
    recipe made its Swin weights, saves one as ``model_ema``): its ``module.`` keys without the count of
    averages beside them, which is no weight."""
    keys = [k for k in tensors if k != _AVERAGED_COUNT]
    if _AVERAGED_COUNT in tensors and keys and all(isinstance(k, str) and k.startswith("module.") for k in keys):
        return {k: tensors[k] for k in keys}
    return tensors


def detect_layout(keys) -> str:
    """Name of the layout whose signature the keys carry; "official" (ours) when none does.

    Keys an :func:`unwrap` result passes through (a detector's parts beside its backbone) are not read.
    """
    passthrough = getattr(keys, "passthrough", frozenset())
    keys = [k for k in keys if k not in passthrough]
    for name in DETECTION_ORDER:
        if any(re.search(pattern, k) for pattern in LAYOUTS[name].signature for k in keys):
            return name
    return "official"


def _apply(sd: Mapping[str, torch.Tensor], rules, drop: str | None) -> dict[str, torch.Tensor]:
    out = {}
    passthrough = getattr(sd, "passthrough", frozenset())
    for key, value in sd.items():
        if key in passthrough:
            continue
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


def convert(state_dict: Mapping, source: str | nn.Module = "auto") -> dict[str, torch.Tensor]:
    """Our (official) layout from a checkpoint of layout ``source`` ("auto" detects it from the keys).

    As timm's ``filter_fn`` (``timm.models.load_checkpoint(model, path, filter_fn=swin.weights.convert)``), a
    model given as ``source`` means "auto".

    ``source`` is one of "official", "timm", "torchvision", "transformers" (Swin and Swin V2, 4.x and 5.x
    key names), "mmdet" (mmdetection / mmsegmentation) or "auto". Wrappers (``model``, ``state_dict``,
    ``module.``, ``backbone.``; a training checkpoint's EMA weights first, see :func:`unwrap`) are unwrapped
    and derived buffers (``relative_position_index``, ``attn_mask``) dropped. Keys that are not part of a Swin
    trunk (a detector's neck, heads or detection transformer, per-level ``norm0..3``) pass through.
    """
    if isinstance(source, nn.Module):  # called as timm's filter_fn(state_dict, model)
        source = "auto"
    sd = unwrap(state_dict)
    out = _convert(sd, _layout(detect_layout(sd) if source == "auto" else source))
    return out | {k: v for k, v in sd.items() if k in sd.passthrough and k not in out}


def _convert(sd: Mapping[str, torch.Tensor], layout: Layout) -> dict[str, torch.Tensor]:
    """The trunk keys of ``sd`` (not those it passes through) renamed and transformed into our layout."""
    out = _apply(sd, layout.to_ours, layout.drop)
    for transform in layout.to_ours_transforms:
        out = transform(out)
    return out


def saved_coordinates(state_dict: Mapping, source: str = "auto") -> dict[str, torch.Tensor]:
    """The Swin V2 coordinates tables (``*.attn.relative_coords_table``) a checkpoint saved (the official code's
    and torchvision's do), under our names: derived state that :func:`convert` drops, and the only record of a
    V2 checkpoint's windows (see :func:`swin.weights.export`)."""
    sd = unwrap(state_dict)
    layout = _layout(detect_layout(sd) if source == "auto" else source)
    renamed = _apply(sd, layout.to_ours, drop=None)
    return {k: v for k, v in renamed.items() if k.endswith(".attn.relative_coords_table")}
