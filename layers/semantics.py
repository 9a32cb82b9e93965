"""Where windows go at sizes the paper does not cover: the classification and detection rules, in one place.

- ``classification``: the official classifier and timm. A stage whose map (at the size the model is built
  for) is not larger than the window gets the map as its window, which sets the shape of the bias table
  (stage 4 at 224/7 and 384/12 is exactly one window). At run time a map axis not larger than the window is
  not shifted, and the map is rolled, then padded to a window multiple.
- ``detection``: the official detection backbone, mmdetection, torchvision's padding and transformers'
  ``SwinBackbone``. The window never shrinks, odd blocks always shift, and the map is padded to a window
  multiple before it is rolled, so the shift mask covers the padded map.

Plain arithmetic, no torch: the registry counts parameters with it without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SEMANTICS", "Semantics", "get_semantics"]


@dataclass(frozen=True)
class Semantics:
    """One set of rules. ``shrink_window``: a map not larger than the window becomes the window (at build
    time); ``pad_first``: pad to a window multiple, then roll (otherwise roll, then pad)."""

    name: str
    shrink_window: bool
    pad_first: bool

    def stage_window(self, height: int, width: int, window: int) -> tuple[int, int]:
        """The (wh, ww) window of a stage whose map is (height, width) at the model's own input size."""
        if self.shrink_window:
            return min(height, window), min(width, window)
        return window, window

    def shift(self, height: int, width: int, window: tuple[int, int], shifted: bool) -> tuple[int, int]:
        """The cyclic shift per axis of a block (``shifted``: an odd block) on a (height, width) map."""
        if not shifted:
            return 0, 0
        wh, ww = window
        if self.shrink_window:  # an axis that fits in one window has nothing to shift across
            return (0 if height <= wh else wh // 2), (0 if width <= ww else ww // 2)
        return wh // 2, ww // 2

    def __str__(self) -> str:
        return self.name


SEMANTICS: dict[str, Semantics] = {
    "classification": Semantics("classification", shrink_window=True, pad_first=False),
    "detection": Semantics("detection", shrink_window=False, pad_first=True),
}


def get_semantics(name: str | Semantics) -> Semantics:
    """The rules called ``name``; ``ValueError`` naming the choices otherwise."""
    if isinstance(name, Semantics):
        return name
    if name not in SEMANTICS:
        raise ValueError(f"semantics must be one of {tuple(SEMANTICS)}, got {name!r}")
    return SEMANTICS[name]
