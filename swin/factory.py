"""``create_model``: a registered name (or alias) plus overrides -> a model."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from .backbone import SwinBackbone
from .model import SwinTransformer
from .registry import get_config, resolve_name

__all__ = ["create_model"]


def create_model(
    name: str,
    pretrained: bool | str | os.PathLike = False,
    features_only: bool = False,
    out_indices: Sequence[int] = (0, 1, 2, 3),
    **overrides: Any,
) -> SwinTransformer | SwinBackbone:
    """Build the registered architecture ``name`` (timm's names work as aliases).

    Args:
        name: ``swin_t``, ``swin_b_384``, ``swin_tiny_patch4_window7_224``, ... (see ``swin.list_models()``).
        pretrained: ``False``; or a local checkpoint path of any supported layout (official, timm,
            torchvision), converted and loaded.
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
    if features_only:
        backbone_args = {k: overrides.pop(k) for k in ("frozen_stages", "norm_eval", "semantics") if k in overrides}
        config = get_config(canonical).replace(**overrides)
        model = SwinBackbone(config, out_indices=out_indices, **backbone_args)
    else:
        semantics = overrides.pop("semantics", "classification")
        config = get_config(canonical).replace(**overrides)
        model = SwinTransformer.from_config(config, semantics=semantics)
    if pretrained:
        from .weights.pretrained import load_pretrained

        load_pretrained(model, canonical, pretrained)
    return model
