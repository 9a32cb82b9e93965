"""Building blocks of Swin Transformer, one concept per module."""

from .attention import WindowAttention
from .attention_v2 import WindowAttentionV2
from .block import SEMANTICS, SwinBlock
from .block_v2 import SwinBlockV2
from .mlp import Mlp
from .patch_embed import PatchEmbed
from .patch_merging import PatchMerging, PatchMergingV2
from .position_bias import relative_position_index
from .stage import SwinStage
from .window import MASK_VALUE, WindowPlan, shift_mask, window_partition, window_plan, window_reverse

__all__ = [
    "MASK_VALUE",
    "SEMANTICS",
    "Mlp",
    "PatchEmbed",
    "PatchMerging",
    "PatchMergingV2",
    "SwinBlock",
    "SwinBlockV2",
    "SwinStage",
    "WindowAttention",
    "WindowAttentionV2",
    "WindowPlan",
    "relative_position_index",
    "shift_mask",
    "window_partition",
    "window_plan",
    "window_reverse",
]
