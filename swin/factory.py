"""``create_model``: a registered name (or alias) plus overrides -> a model."""

from __future__ import annotations

import os
from typing import Any

from .model import SwinTransformer
from .registry import get_config, resolve_name

__all__ = ["create_model"]


def create_model(
    name: str,
    pretrained: bool | str | os.PathLike = False,
    **overrides: Any,
) -> SwinTransformer:
    """Build the registered architecture ``name`` (timm's names work as aliases).

    Args:
        name: ``swin_t``, ``swin_b_384``, ``swin_tiny_patch4_window7_224``, ... (see ``swin.list_models()``).
        pretrained: ``False``; or a local checkpoint path of any supported layout (official, timm,
            torchvision), converted and loaded.
        **overrides: any :class:`swin.registry.SwinConfig` field (``num_classes=10``, ``img_size=384``,
            ``drop_path_rate=0.2``, ...) and ``semantics``.

    Raises:
        KeyError: unknown name (the message lists the closest registered names).
        TypeError: an override that is not a config field, or of the wrong type.
    """
    canonical = resolve_name(name)
    semantics = overrides.pop("semantics", "classification")
    config = get_config(canonical).replace(**overrides)
    model = SwinTransformer.from_config(config, semantics=semantics)
    if pretrained:
        from .weights.pretrained import load_pretrained

        load_pretrained(model, canonical, pretrained)
    return model
