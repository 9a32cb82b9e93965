"""``create_model``: a registered name (or alias) plus overrides -> a model."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from .backbone import SwinBackbone
from .model import SwinTransformer
from .registry import get_config, resolve_name

__all__ = ["create_model"]


def _check_pretrained(pretrained: Any) -> bool:
    """Whether ``pretrained`` asks for weights; an empty or false-like value other than False/None is an
    error rather than silently random weights."""
    if pretrained is None or pretrained is False:
        return False
    if isinstance(pretrained, Mapping):
        if not pretrained:
            raise ValueError("pretrained= got an empty state dict; pass the checkpoint's tensors, or False")
        return True
    if pretrained is True or (isinstance(pretrained, (str, os.PathLike)) and os.fspath(pretrained)):
        return True
    raise ValueError(
        f"pretrained= got {type(pretrained).__name__} {str(pretrained)[:40]!r}: pass False/None (random weights), "
        "True (the default tag), a tag such as 'ms_in1k', a checkpoint path or URL, or a state dict"
    )


def _split_tag(name: str, pretrained: Any) -> tuple[str, str | None, Any]:
    """``"ARCH.TAG"`` -> (arch, tag, what to load): the tag is the weights ``pretrained=True`` loads, and
    the preprocessing the model describes even with random weights (as timm's ``create_model``)."""
    arch, dot, tag = name.partition(".")
    if not dot:
        return name, None, pretrained
    if not tag:
        raise ValueError(f"model name {name!r} ends in a dot; write ARCH or ARCH.TAG (e.g. swin_t.ms_in1k)")
    if pretrained is True:
        return arch, tag, tag
    if isinstance(pretrained, str) and pretrained not in (tag, name):
        raise ValueError(
            f"create_model({name!r}, pretrained={pretrained!r}) names two different weights; "
            f"use create_model({arch!r}, pretrained={pretrained!r}) or create_model({name!r}, pretrained=True)"
        )
    return arch, tag, pretrained


def create_model(
    name: str,
    pretrained: bool | str | os.PathLike | Mapping = False,
    features_only: bool = False,
    out_indices: Sequence[int] | int | None = None,
    checkpoint_path: str | os.PathLike | None = None,
    optimize: bool | str | Any = False,
    **overrides: Any,
) -> SwinTransformer | SwinBackbone:
    """Build the registered architecture ``name`` (timm's names work as aliases).

    Args:
        name: ``swin_t``, ``swin_b_384``, ``swin_tiny_patch4_window7_224``, ... (see ``swin.list_models()``),
            optionally with a pretrained tag, ``swin_t.ms_in22k`` or timm's
            ``swin_tiny_patch4_window7_224.ms_in22k``: ``pretrained=True`` then loads that tag, and without
            weights the model still takes its head size and preprocessing (``pretrained_cfg``).
        pretrained: ``False``; ``True`` (the architecture's default tag in the weights manifest); a tag
            (``"ms_in22k"``) or ``"ARCH.TAG"``; a local checkpoint file or an http(s) URL, or a state dict
            already in memory, in any supported layout (official, timm, torchvision, transformers,
            mmdetection). A manifest tag also sets
            ``num_classes`` to its head's (21841 for ``ms_in22k``) unless ``num_classes`` is given.
        features_only: return a :class:`SwinBackbone` (multi-scale NCHW features, detection semantics)
            instead of the classifier.
        out_indices: with ``features_only``, the stages to return (0..3, negative from the last, or an int n
            for the last n; returned in stage order; None: all four); ``frozen_stages`` and
            ``norm_eval`` pass through to the backbone as well.
        checkpoint_path: a checkpoint file (any supported layout) loaded after ``pretrained``, as timm's
            ``checkpoint_path=``; its head must fit ``num_classes``.
        optimize: ``True`` (or a dtype: ``"bfloat16"``, ``torch.float32``, ...): return the model through
            :func:`swin.optimize`, the fastest inference version for this machine's CPU (compiled on its first
            call). For a GPU, build the model, move it (``.cuda()``) and call ``swin.optimize`` on it.
        **overrides: any :class:`swin.registry.SwinConfig` field (``num_classes=10``, ``img_size=384``,
            ``drop_path_rate=0.2``, ...), ``semantics``, and for the classifier ``global_pool`` ("avg",
            "max", "avgmax", "catavgmax", ""). As in timm, an override given as ``None`` is left out.

    Raises:
        KeyError: unknown name (the message lists the closest registered names).
        TypeError: an override that is not a config field, or of the wrong type; ``out_indices`` without
            ``features_only``.
    """
    # As timm: an option given as None is not given (timm's train.py passes drop_path_rate=None and the like).
    overrides = {key: value for key, value in overrides.items() if value is not None}
    arch, tag, pretrained = _split_tag(name, pretrained)
    canonical = resolve_name(arch)
    wanted = _check_pretrained(pretrained)
    named = None  # the manifest entry a tag in the name designates, when nothing is loaded from it
    if tag is not None and not wanted:
        from .weights.manifest import get_entry

        named = get_entry(canonical, tag)
        if not features_only and "num_classes" not in overrides:
            overrides["num_classes"] = named.num_classes
    if wanted and not isinstance(pretrained, Mapping) and not features_only and "num_classes" not in overrides:
        from .weights.pretrained import manifest_entry_for

        entry = manifest_entry_for(canonical, pretrained)
        if entry is not None:
            overrides["num_classes"] = entry.num_classes
    if out_indices is not None and not features_only:
        raise TypeError(
            f"out_indices={out_indices!r} selects the stages of a features_only backbone; pass features_only=True "
            "(the classifier has one output)"
        )
    if features_only:
        backbone_args = {k: overrides.pop(k) for k in ("frozen_stages", "norm_eval", "semantics") if k in overrides}
        config = get_config(canonical).replace(**overrides)
        model = SwinBackbone(config, out_indices=(0, 1, 2, 3) if out_indices is None else out_indices, **backbone_args)
    else:
        head_args = {k: overrides.pop(k) for k in ("semantics", "global_pool") if k in overrides}
        config = get_config(canonical).replace(**overrides)
        model = SwinTransformer.from_config(config, **head_args)
    if named is not None:
        from .weights.data_config import record_loaded

        record_loaded(model, {"name": named.name, "file": None, **named.data_config()})
    if wanted or checkpoint_path is not None:
        from .weights.pretrained import load_pretrained

        if wanted:
            load_pretrained(model, canonical, pretrained, model_for=entry_model)
        if checkpoint_path is not None:
            load_pretrained(model, canonical, _existing_file(checkpoint_path))
    if optimize is not False:
        from .optimized import optimize as make_fast

        return make_fast(model, dtype="auto" if optimize is True else optimize)
    return model


def entry_model(entry: Any) -> nn.Module:
    """The architecture and head a manifest entry's weights are of, on the meta device (shapes only): what a
    download is checked to load into before it is cached (``swin.weights.pretrained.fetch(model_for=...)``)."""
    with torch.device("meta"):
        return SwinTransformer.from_config(get_config(entry.arch).replace(num_classes=entry.num_classes))


def _existing_file(path: str | os.PathLike) -> str:
    if not isinstance(path, (str, os.PathLike)) or not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint_path={path!r} is not a file; pass the path of a checkpoint")
    return os.fspath(path)
