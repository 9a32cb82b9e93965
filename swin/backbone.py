"""Swin as a detection / segmentation backbone: multi-scale NCHW features at any input size."""

from __future__ import annotations

import operator
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from .features import FeatureInfo, stage_info
from .registry import SwinConfig
from .trunk import SwinTrunk

__all__ = ["SwinBackbone"]


def stage_indices(out_indices: Sequence[int] | int, num_stages: int) -> tuple[int, ...]:
    """``out_indices`` as timm reads them, in stage order (the order the maps come out in, and so of
    ``out_channels``, ``strides`` and ``feature_info``): distinct stage indices, negative ones counted from the
    last stage, or an int ``n`` for the last ``n`` stages."""
    if _integer(out_indices) is not None and getattr(out_indices, "ndim", 0) == 0:
        out_indices = _integer(out_indices)
        if not 1 <= out_indices <= num_stages:
            raise ValueError(f"out_indices={out_indices}: an int takes the last n stages, n in 1..{num_stages}")
        return tuple(range(num_stages - out_indices, num_stages))
    given = tuple(i if _integer(i) is None else _integer(i) for i in out_indices)  # numpy's and torch's ints too
    bad = [i for i in given if isinstance(i, bool) or not isinstance(i, int) or not -num_stages <= i < num_stages]
    stages = sorted({i % num_stages for i in given if i not in bad})
    if bad or not given or len(stages) != len(given):
        raise ValueError(
            f"out_indices must be distinct stage indices in 0..{num_stages - 1} (or -{num_stages}..-1 from the last), "
            f"or an int n for the last n stages; got {given}"
        )
    return tuple(stages)


def _integer(value: Any) -> int | None:
    """``value`` as an int where it is an integer (Python's, numpy's, a one-element integer tensor), not a bool."""
    if isinstance(value, bool) or getattr(value, "dtype", None) == torch.bool:
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


class SwinBackbone(SwinTrunk):
    """Features of stages ``out_indices`` (strides 4/8/16/32, channels C/2C/4C/8C), each through its own
    LayerNorm ``norm{i}`` and returned as (B, C_i, ceil(H/s_i), ceil(W/s_i)), taken before patch merging.

    Detection semantics by default, as the official detection backbone and mmdetection: the image is padded
    to a multiple of the patch size and each stage's map to a multiple of the window before the cyclic
    shift; the window never shrinks and odd blocks always shift. Any size runs without rebuilding; the shift
    masks for a size are computed once and reused (the position bias comes from the parameters on every call).

    Args:
        config: the architecture (``swin.get_config("swin_b")``), fields overridable by ``**overrides``.
        out_indices: which stages to return, in 0..num_stages-1 (negative: from the last; an int n: the last n
            stages), in stage order whatever the order given; stages after the last one are not built.
        frozen_stages: as mmdetection: -1 freezes nothing, 0 the patch embedding (and absolute position
            embedding), k >= 1 also stages 0..k-1 with their norms; frozen parts stay in eval mode.
        norm_eval: as mmdetection: keep batch-norm layers in eval mode while training (Swin itself has only
            LayerNorms, which have no running statistics, so this only matters for added BatchNorms).
        semantics: "detection" (default) or "classification".
    """

    def __init__(
        self,
        config: SwinConfig,
        out_indices: Sequence[int] | int = (0, 1, 2, 3),
        frozen_stages: int = -1,
        norm_eval: bool = False,
        semantics: str = "detection",
        **overrides: Any,
    ):
        config = config.replace(**overrides) if overrides else config
        num_stages = len(config.depths)
        out_indices = stage_indices(out_indices, num_stages)
        if _integer(frozen_stages) is None:
            raise TypeError(f"frozen_stages must be an int in -1..{num_stages}, got {frozen_stages!r}")
        frozen_stages = _integer(frozen_stages)
        if not -1 <= frozen_stages <= num_stages:
            raise ValueError(f"frozen_stages must be in -1..{num_stages}, got {frozen_stages}")
        if isinstance(norm_eval, str) or norm_eval not in (True, False):  # 0 / 1 and numpy's bools are fine
            raise TypeError(f"norm_eval must be True or False, got {norm_eval!r}")
        norm_eval = bool(norm_eval)
        if config.drop_rate:
            warnings.warn(
                f"drop_rate={config.drop_rate} is the dropout before the classifier head (timm's meaning) and a "
                "backbone has none: it does nothing here; proj_drop_rate (in the blocks) and pos_drop_rate (after "
                "the patch embedding) drop inside the trunk",
                UserWarning,
                stacklevel=2,
            )
        super().__init__(config.replace(num_classes=0), semantics, num_stages=max(out_indices) + 1)
        self.out_indices = out_indices
        self.frozen_stages = frozen_stages
        self.norm_eval = norm_eval
        self.out_channels = [config.embed_dim * 2**i for i in out_indices]
        self.strides = [config.patch_size * 2**i for i in out_indices]
        # timm's interface: info on every stage, channels() / reduction() / module_name() for out_indices.
        self.feature_info = FeatureInfo(stage_info(config.embed_dim, config.patch_size, num_stages), out_indices)
        for i, channels in zip(out_indices, self.out_channels, strict=True):
            self.add_module(f"norm{i}", nn.LayerNorm(channels))
        self.init_weights()
        self._freeze()

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return self.forward_stages(x, self._levels)

    def _levels(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self.embed(x)
        outputs = []
        for i, stage in enumerate(self.layers):
            features, x = stage(x)
            if i in self.out_indices:
                norm = getattr(self, f"norm{i}")
                outputs.append(norm(features).permute(0, 3, 1, 2).contiguous())
        return outputs

    def _freeze(self) -> None:
        frozen: list[nn.Module] = []
        if self.frozen_stages >= 0:
            frozen += [self.patch_embed, self.pos_drop]
            if self.absolute_pos_embed is not None:
                self.absolute_pos_embed.requires_grad_(False)
        for i in range(min(self.frozen_stages, len(self.layers))):
            frozen.append(self.layers[i])
            if i in self.out_indices:
                frozen.append(getattr(self, f"norm{i}"))
        for module in frozen:
            module.eval()
            module.requires_grad_(False)
        self._frozen = frozen

    def train(self, mode: bool = True) -> SwinBackbone:
        super().train(mode)
        if mode:
            for module in getattr(self, "_frozen", []):
                module.eval()
            if self.norm_eval:
                for module in self.modules():
                    if isinstance(module, nn.modules.batchnorm._BatchNorm):
                        module.eval()
        return self

    def no_weight_decay(self) -> set[str]:
        return super().no_weight_decay()
