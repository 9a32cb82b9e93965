"""``create_model``: a registered name (or alias) plus overrides -> a model."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

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


def create_model(
    name: str,
    pretrained: bool | str | os.PathLike | Mapping = False,
    features_only: bool = False,
    out_indices: Sequence[int] = (0, 1, 2, 3),
    **overrides: Any,
) -> SwinTransformer | SwinBackbone:
    """Build the registered architecture ``name`` (timm's names work as aliases).

    Args:
        name: ``swin_t``, ``swin_b_384``, ``swin_tiny_patch4_window7_224``, ... (see ``swin.list_models()``).
        pretrained: ``False``; ``True`` (the architecture's default tag in the weights manifest); a tag
            (``"ms_in22k"``) or ``"ARCH.TAG"``; a local checkpoint file or an http(s) URL, or a state dict
            already in memory, in any supported layout (official, timm, torchvision, transformers,
            mmdetection). A manifest tag also sets
            ``num_classes`` to its head's (21841 for ``ms_in22k``) unless ``num_classes`` is given.
        features_only: return a :class:`SwinBackbone` (multi-scale NCHW features, detection semantics)
            instead of the classifier.
        out_indices: with ``features_only``, the stages to return (0..3); ``frozen_stages`` and
            ``norm_eval`` pass through to the backbone as well.
        **overrides: any :class:`swin.registry.SwinConfig` field (``num_classes=10``, ``img_size=384``,
            ``drop_path_rate=0.2``, ...) and ``semantics``.

    Raises:
        KeyError: unknown name (the message lists the closest registered names).
        TypeError: an override that is not a config field, or of the wrong type.
    """
    canonical = resolve_name(name)
    wanted = _check_pretrained(pretrained)
    if wanted and not isinstance(pretrained, Mapping) and not features_only and "num_classes" not in overrides:
        from .weights.pretrained import manifest_entry_for

        entry = manifest_entry_for(canonical, pretrained)
        if entry is not None:
            overrides["num_classes"] = entry.num_classes
    if features_only:
        backbone_args = {k: overrides.pop(k) for k in ("frozen_stages", "norm_eval", "semantics") if k in overrides}
        config = get_config(canonical).replace(**overrides)
        model = SwinBackbone(config, out_indices=out_indices, **backbone_args)
    else:
        semantics = overrides.pop("semantics", "classification")
        config = get_config(canonical).replace(**overrides)
        model = SwinTransformer.from_config(config, semantics=semantics)
    if wanted:
        from .weights.pretrained import load_pretrained

        load_pretrained(model, canonical, pretrained)
    return model
