"""Checkpoint layouts as data: key rename rules, keys to drop, and how to recognise each layout.

Ours is the official Microsoft layout without its derived buffers. Each other layout is a list of
``(pattern, replacement)`` regex rules applied in order to every key (replacement may be a function of
the match, for index arithmetic), plus patterns of keys that carry no weights.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Layout", "LAYOUTS", "BUFFER_KEYS"]

Rule = tuple[str, "str | Callable[[re.Match], str]"]

# Derived buffers that some layouts save; rebuilt from the window size, never loaded.
BUFFER_KEYS = r"(relative_position_index|relative_coords_table|attn_mask)$"


@dataclass(frozen=True)
class Layout:
    name: str
    to_ours: tuple[Rule, ...] = ()
    from_ours: tuple[Rule, ...] = ()
    drop: str = BUFFER_KEYS
    signature: tuple[str, ...] = field(default=())  # regexes: a key matching any marks the layout


def _shift_stage(offset: int) -> Callable[[re.Match], str]:
    return lambda m: f"layers.{int(m.group(1)) + offset}.downsample"


def _torchvision_stage(m: re.Match) -> str:
    index = int(m.group(1))
    if index % 2:  # features.1, 3, 5, 7: the blocks of stage 0..3
        return f"layers.{(index - 1) // 2}.blocks."
    return f"layers.{index // 2 - 1}.downsample."  # features.2, 4, 6: merging after stage 0..2


OFFICIAL = Layout(
    name="official",
    signature=(r"^layers\.0\.downsample\.", r"attn_mask$", r"relative_position_index$"),
)

TIMM = Layout(
    name="timm",
    # timm merges patches at the start of the next stage and keeps the classifier in head.fc.
    to_ours=((r"^layers\.(\d+)\.downsample", _shift_stage(-1)), (r"^head\.fc\.", "head.")),
    from_ours=((r"^layers\.(\d+)\.downsample", _shift_stage(+1)), (r"^head\.", "head.fc.")),
    signature=(r"^head\.fc\.", r"^layers\.[1-9]\.downsample\."),
)

TORCHVISION = Layout(
    name="torchvision",
    to_ours=(
        (r"^features\.0\.0\.", "patch_embed.proj."),
        (r"^features\.0\.2\.", "patch_embed.norm."),
        (r"^features\.(\d+)\.", _torchvision_stage),
        (r"\.mlp\.0\.", ".mlp.fc1."),
        (r"\.mlp\.3\.", ".mlp.fc2."),
    ),
    signature=(r"^features\.0\.0\.",),
)

LAYOUTS: dict[str, Layout] = {layout.name: layout for layout in (OFFICIAL, TIMM, TORCHVISION)}
