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

    def __init__(
        self,
        body: SwinBackbone,
        out_channels: int = 256,
        extra_pool: bool = True,
        extra_blocks: nn.Module | None = None,
        norm_layer: Any = None,
    ):
        """``extra_blocks``: torchvision's ``ExtraFPNBlock`` on top of the pyramid (e.g. ``LastLevelP6P7(256,
        256)``, RetinaNet's P6/P7), instead of the max-pooled "pool" level of ``extra_pool``; ``norm_layer``:
        the FPN's convolutions' norm, as torchvision's ``BackboneWithFPN``."""
        super().__init__()
        from torchvision.ops import FeaturePyramidNetwork
        from torchvision.ops.feature_pyramid_network import LastLevelMaxPool

        if extra_blocks is None and extra_pool:
            extra_blocks = LastLevelMaxPool()
        self.body = body
        self.fpn = FeaturePyramidNetwork(
            body.out_channels, out_channels, extra_blocks=extra_blocks, norm_layer=norm_layer
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
    extra_blocks: nn.Module | None = None,
    norm_layer: Any = None,
    **kwargs: Any,
) -> SwinFPN:
    """``create_model(name, features_only=True, ...)`` under an FPN, ready for ``torchvision`` detectors
    (``extra_blocks`` and ``norm_layer`` as torchvision's ``BackboneWithFPN``).

    >>> from torchvision.models.detection import FasterRCNN
    >>> detector = FasterRCNN(swin.detection_backbone("swin_t"), num_classes=91)
    >>> from torchvision.ops.feature_pyramid_network import LastLevelP6P7
    >>> retina = RetinaNet(swin.detection_backbone("swin_t", out_indices=(1, 2, 3),
    ...                    extra_blocks=LastLevelP6P7(256, 256)), num_classes=91)
    """
    from .factory import create_model

    body = create_model(name, pretrained=pretrained, features_only=True, **kwargs)
    return SwinFPN(body, out_channels, extra_pool, extra_blocks, norm_layer)
