"""``pretrained=`` for ``create_model``: resolve what the user asked for and load it into a model."""

from __future__ import annotations

import os

import torch
from torch import nn

from .convert import convert

__all__ = ["load_pretrained"]


def load_pretrained(model: nn.Module, name: str, pretrained: bool | str | os.PathLike) -> nn.Module:
    """Load weights into ``model`` (built from the registered ``name``).

    ``pretrained`` is a local checkpoint path in any supported layout. (Tags, URLs and the manifest's
    default come with the weights manifest.)
    """
    if pretrained is True:
        raise NotImplementedError(
            "pretrained=True needs the weights manifest, which is not available yet; "
            "pass the path of a checkpoint file instead"
        )
    checkpoint = torch.load(os.fspath(pretrained), map_location="cpu", weights_only=True)
    model.load_state_dict(convert(checkpoint))
    return model
