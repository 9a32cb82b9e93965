"""Building blocks of Swin Transformer, one concept per module."""

from .attention import WindowAttention
from .block import SEMANTICS, SwinBlock
from .mlp import Mlp
from .patch_embed import PatchEmbed
from .patch_merging import PatchMerging
from .position_bias import relative_position_index
from .stage import SwinStage
from .window import MASK_VALUE, WindowPlan, shift_mask, window_partition, window_plan, window_reverse

__all__ = [
    "MASK_VALUE",
    "SEMANTICS",
    "Mlp",
    "PatchEmbed",
    "PatchMerging",
    "SwinBlock",
    "SwinStage",
    "WindowAttention",
    "WindowPlan",
    "relative_position_index",
    "shift_mask",
    "window_partition",
    "window_plan",
    "window_reverse",
]
