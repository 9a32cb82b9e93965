"""The Swin Transformer classifier, assembled from ``swin.layers``."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from timm.layers import trunc_normal_
from torch import nn

from .layers import SEMANTICS, PatchEmbed, SwinStage
from .registry import SwinConfig

__all__ = ["SwinTransformer"]


def _pair(value: int | Sequence[int]) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))


class SwinTransformer(nn.Module):
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
        semantics: str = "classification",
        name: str = "swin",
    ):
        super().__init__()
        if semantics not in SEMANTICS:
            raise ValueError(f"semantics must be one of {SEMANTICS}, got {semantics!r}")
        self.config = SwinConfig(
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
            name=name,
        )
        self.semantics = semantics
        self.num_classes = num_classes
        self.in_chans = in_chans
        self.num_layers = len(depths)
        self.num_features = embed_dim * 2 ** (self.num_layers - 1)

        self.patch_embed = PatchEmbed(in_chans, embed_dim, patch_size, norm=patch_norm)
        grid = self.patch_embed.output_size(*self.config.img_size)
        self.absolute_pos_embed = nn.Parameter(torch.zeros(1, grid[0] * grid[1], embed_dim)) if ape else None
        self.pos_drop = nn.Dropout(drop_rate)

        total = sum(depths)
        rates = [drop_path_rate * i / max(total - 1, 1) for i in range(total)]  # linear, as torch.linspace
        self.layers = nn.ModuleList()
        height, width = grid
        for i, depth in enumerate(depths):
            window = (window_size, window_size)
            if semantics == "classification":
                # Official rule: a map not larger than the window gets the map as its window (stage 4 at
                # 224/7 and 384/12 is exactly one window); this sets the shape of the bias table.
                window = (min(height, window_size), min(width, window_size))
            self.layers.append(
                SwinStage(
                    embed_dim * 2**i,
                    depth,
                    num_heads[i],
                    window,
                    mlp_ratio,
                    qkv_bias,
                    drop_rate,
                    attn_drop_rate,
                    rates[sum(depths[:i]) : sum(depths[: i + 1])],
                    downsample=i < self.num_layers - 1,
                    semantics=semantics,
                )
            )
            height, width = -(-height // 2), -(-width // 2)

        self.norm = nn.LayerNorm(self.num_features)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()
        self.apply(self._init_weights)
        if self.absolute_pos_embed is not None:
            trunc_normal_(self.absolute_pos_embed, std=0.02)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            trunc_normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    @classmethod
    def from_config(cls, config: SwinConfig, **kwargs: object) -> SwinTransformer:
        fields = {k: v for k, v in config.to_dict().items() if k != "aliases"}
        return cls(**fields, **kwargs)

    # -- input checks and edges -------------------------------------------------------------------------

    def check_input(self, x: torch.Tensor) -> None:
        """Raise ``ValueError`` / ``TypeError`` naming what is wrong with ``x`` before any layer fails."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"expected a torch.Tensor of shape (B, {self.in_chans}, H, W), got {type(x).__name__}")
        if x.ndim != 4:
            hint = "; add a batch dimension with x.unsqueeze(0)" if x.ndim == 3 else ""
            raise ValueError(
                f"expected a 4-D tensor (B, {self.in_chans}, H, W), got {x.ndim}-D shape {tuple(x.shape)}{hint}"
            )
        if x.shape[1] != self.in_chans:
            raise ValueError(
                f"expected {self.in_chans} input channels, got {x.shape[1]} (shape {tuple(x.shape)}); build "
                f"the model with in_chans={x.shape[1]} or convert the images"
            )
        if not x.is_floating_point():
            raise TypeError(f"expected a floating point tensor, got {x.dtype}; convert with x.float()")
        patch = self.patch_embed.patch_size
        if x.shape[2] < patch or x.shape[3] < patch:
            raise ValueError(
                f"image {x.shape[2]}x{x.shape[3]} is smaller than one {patch}x{patch} patch; "
                "resize it to at least the patch size"
            )

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """(B, in_chans, H, W) -> (B, H/p, W/p, C): patch embedding plus absolute position embedding."""
        self.check_input(x)
        x = self.patch_embed(x)
        if self.absolute_pos_embed is not None:
            x = x + self._position_embedding(x.shape[1], x.shape[2])
        return self.pos_drop(x)

    def _position_embedding(self, height: int, width: int) -> torch.Tensor:
        grid_h, grid_w = self.patch_embed.output_size(*self.config.img_size)
        pos = self.absolute_pos_embed.view(1, grid_h, grid_w, -1)
        if (height, width) != (grid_h, grid_w):
            # As the official detection backbone: bicubic interpolation to the input's grid.
            pos = F.interpolate(pos.permute(0, 3, 1, 2), size=(height, width), mode="bicubic", align_corners=False)
            pos = pos.permute(0, 2, 3, 1)
        return pos

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
            self._init_weights(self.head)

    def get_classifier(self) -> nn.Module:
        return self.head

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block in the backward pass instead of storing its activations."""
        for stage in self.layers:
            stage.grad_checkpointing = enable

    def no_weight_decay(self) -> set[str]:
        """Parameter names that Swin's recipes train without weight decay."""
        names = {n for n, _ in self.named_parameters() if n.endswith("relative_position_bias_table")}
        if self.absolute_pos_embed is not None:
            names.add("absolute_pos_embed")
        return names

    def stage_sizes(self, height: int, width: int) -> list[tuple[int, int]]:
        """Map size of each stage for a (height, width) input: ceil(H/4), then ceil(previous/2)."""
        sizes = [self.patch_embed.output_size(height, width)]
        for _ in range(self.num_layers - 1):
            h, w = sizes[-1]
            sizes.append((-(-h // 2), -(-w // 2)))
        return sizes
