"""Adapters that plug the backbone into torchvision's detection models (torchvision imported lazily)."""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any

import torch
from torch import nn

from .backbone import SwinBackbone

__all__ = ["SwinFPN", "detection_backbone"]


class SwinFPN(nn.Module):
    """:class:`SwinBackbone` under torchvision's ``FeaturePyramidNetwork``, the interface torchvision's
    ``FasterRCNN`` / ``MaskRCNN`` / ``RetinaNet`` expect: ``out_channels`` and an ordered dict of maps
    ("0".."3" and "pool", like ``BackboneWithFPN``)."""

    def __init__(self, body: SwinBackbone, out_channels: int = 256, extra_pool: bool = True):
        super().__init__()
        from torchvision.ops import FeaturePyramidNetwork
        from torchvision.ops.feature_pyramid_network import LastLevelMaxPool

        self.body = body
        self.fpn = FeaturePyramidNetwork(
            body.out_channels, out_channels, extra_blocks=LastLevelMaxPool() if extra_pool else None
        )
        self.out_channels = out_channels

    def forward(self, x: torch.Tensor) -> OrderedDict[str, torch.Tensor]:
        levels = self.body(x)
        return self.fpn(OrderedDict((str(i), level) for i, level in enumerate(levels)))


def detection_backbone(
    name: str,
    pretrained: bool | str | os.PathLike = False,
    out_channels: int = 256,
    extra_pool: bool = True,
    **kwargs: Any,
) -> SwinFPN:
    """``create_model(name, features_only=True, ...)`` under an FPN, ready for ``torchvision`` detectors.

    >>> from torchvision.models.detection import FasterRCNN
    >>> detector = FasterRCNN(swin.detection_backbone("swin_t"), num_classes=91)
    """
    from .factory import create_model

    body = create_model(name, pretrained=pretrained, features_only=True, **kwargs)
    return SwinFPN(body, out_channels, extra_pool)
