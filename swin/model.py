"""The Swin Transformer classifier, assembled from ``swin.layers``."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .registry import SwinConfig
from .trunk import SwinTrunk

__all__ = ["SwinTransformer"]


def _pair(value: int | Sequence[int]) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))


class SwinTransformer(SwinTrunk):
    """Swin Transformer (Liu et al., ICCV 2021) with the official checkpoint layout.

    The trunk works on (B, H, W, C) maps; the input is (B, in_chans, H, W) of any size of at least one
    patch. ``forward_features`` returns the normed last stage as (B, 8C, H/32, W/32), ``forward_head`` pools
    and classifies, ``forward`` does both.

    Args:
        embed_dim: channels C of stage 1.
        depths: blocks per stage.
        num_heads: attention heads per stage.
        window_size: window M in tokens.
        img_size: input size the model is built for; with ``semantics="classification"``, a stage whose map
            at this size is not larger than the window gets a window the size of the map (official rule).
        patch_size: patch embedding kernel and stride.
        in_chans: input channels.
        num_classes: classifier outputs; 0 gives pooled features from ``forward``.
        mlp_ratio: MLP width over block width.
        qkv_bias: bias in the q/k/v projections.
        drop_rate: dropout after projections and before the head.
        attn_drop_rate: dropout on attention probabilities.
        drop_path_rate: stochastic depth, rising linearly over the blocks to this value.
        ape: absolute position embedding (interpolated bicubically to other input sizes).
        patch_norm: LayerNorm after the patch embedding.
        version: 1 (Swin) or 2 (Swin V2, Liu et al., CVPR 2022).
        pretrained_window_sizes: Swin V2: per stage, the window of pre-training (0: none).
        semantics: "classification" (official classifier, timm) or "detection" (official detection
            backbone): see ``swin.layers.SEMANTICS``.
        name: the registered name, kept in ``model.config``.
    """

    def __init__(
        self,
        embed_dim: int = 96,
        depths: Sequence[int] = (2, 2, 6, 2),
        num_heads: Sequence[int] = (3, 6, 12, 24),
        window_size: int = 7,
        img_size: int | Sequence[int] = 224,
        patch_size: int = 4,
        in_chans: int = 3,
        num_classes: int = 1000,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.1,
        ape: bool = False,
        patch_norm: bool = True,
        version: int = 1,
        pretrained_window_sizes: Sequence[int] = (0, 0, 0, 0),
        semantics: str = "classification",
        name: str = "swin",
    ):
        config = SwinConfig(
            name=name,
            embed_dim=embed_dim,
            depths=tuple(depths),
            num_heads=tuple(num_heads),
            window_size=window_size,
            img_size=_pair(img_size),
            patch_size=patch_size,
            in_chans=in_chans,
            num_classes=num_classes,
            mlp_ratio=mlp_ratio,
            qkv_bias=qkv_bias,
            drop_rate=drop_rate,
            attn_drop_rate=attn_drop_rate,
            drop_path_rate=drop_path_rate,
            ape=ape,
            patch_norm=patch_norm,
            version=version,
            pretrained_window_sizes=tuple(pretrained_window_sizes),
        )
        super().__init__(config, semantics)
        self.num_classes = num_classes
        self.norm = nn.LayerNorm(self.num_features)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()
        self.init_weights()

    @classmethod
    def from_config(cls, config: SwinConfig, **kwargs: object) -> SwinTransformer:
        fields = {k: v for k, v in config.to_dict().items() if k != "aliases"}
        return cls(**fields, **kwargs)

    # -- forward ----------------------------------------------------------------------------------------

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, in_chans, H, W) -> (B, 8C, ceil(H/32), ceil(W/32)) after the final norm."""
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
