"""The Swin Transformer classifier, assembled from ``swin.layers``."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .registry import SwinConfig
from .trunk import SwinTrunk

__all__ = ["SwinTransformer"]


class SwinTransformer(SwinTrunk):
    """Swin Transformer (Liu et al., ICCV 2021) with the official checkpoint layout.

    The trunk works on (B, H, W, C) maps; the input is (B, in_chans, H, W) of any size of at least one
    patch. ``forward_features`` returns the normed last stage as (B, 8C, H/32, W/32), ``forward_head`` pools
    and classifies, ``forward`` does both.

    Args:
        config: the architecture (``swin.get_config("swin_t")``); default ``SwinConfig()`` (swin_t's shape).
        semantics: "classification" (official classifier, timm) or "detection" (official detection
            backbone): see :mod:`swin.layers.semantics`.
        **fields: :class:`swin.registry.SwinConfig` fields that override ``config`` (``num_classes=10``,
            ``embed_dim=128``, ...): the config is the one description of the architecture.
    """

    def __init__(self, config: SwinConfig | None = None, *, semantics: str = "classification", **fields: Any):
        config = (config or SwinConfig()).replace(**fields)
        super().__init__(config, semantics)
        self.num_classes = config.num_classes
        self.norm = nn.LayerNorm(self.num_features)
        self.head_drop = nn.Dropout(config.drop_rate)
        self.head = nn.Linear(self.num_features, config.num_classes) if config.num_classes > 0 else nn.Identity()
        self.init_weights()

    @classmethod
    def from_config(cls, config: SwinConfig, **kwargs: Any) -> SwinTransformer:
        return cls(config, **kwargs)

    # -- forward ----------------------------------------------------------------------------------------

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, in_chans, H, W) -> (B, 8C, ceil(H/32), ceil(W/32)) after the final norm."""
        return self.forward_stages(x, self._features)

    def _features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for stage in self.layers:
            _, x = stage(x)
        return self.norm(x).permute(0, 3, 1, 2)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """(B, 8C, h, w) -> pooled (B, 8C) if ``pre_logits`` else logits (B, num_classes)."""
        x = self.head_drop(x.mean(dim=(2, 3)))
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    # -- utilities --------------------------------------------------------------------------------------

    def reset_classifier(self, num_classes: int) -> None:
        """Replace the head with a freshly initialised one of ``num_classes`` outputs (0: no head)."""
        self.num_classes = num_classes
        self.config = self.config.replace(num_classes=num_classes)
        self.head = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()
        if num_classes > 0:
            self._init_module(self.head)

    def get_classifier(self) -> nn.Module:
        return self.head
