"""Swin V1 and V2 as data: which block and which patch merging a version builds (torchvision's ``block=``)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from .block import SwinBlock
from .block_v2 import SwinBlockV2
from .patch_merging import PatchMerging, PatchMergingV2

__all__ = ["VARIANTS", "Variant"]


@dataclass(frozen=True)
class Variant:
    """The classes one version of the architecture is built from."""

    block: type[nn.Module]
    merging: type[nn.Module]


VARIANTS: dict[int, Variant] = {
    1: Variant(block=SwinBlock, merging=PatchMerging),
    2: Variant(block=SwinBlockV2, merging=PatchMergingV2),  # Liu et al., CVPR 2022
}
