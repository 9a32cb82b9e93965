"""What can be built and loaded: registered architectures and pretrained tags (no torch needed)."""

from __future__ import annotations

from .registry import list_models as list_architectures

__all__ = ["list_models"]


def list_models(pattern: str | list[str] | None = None, pretrained: bool = False) -> list[str]:
    """Registered architecture names, sorted, filtered by a shell-style ``pattern`` if given (as timm's filter: a
    list of patterns matches any, ``""`` filters nothing).

    With ``pretrained=True``, the pretrained checkpoints of the weights manifest instead, as ``ARCH.TAG``
    names (``swin_t.ms_in1k``); ``pattern`` then matches those (``"swin_t"`` alone means ``"swin_t.*"``).
    """
    if pretrained:
        from .weights.manifest import list_pretrained

        return list_pretrained(pattern)
    return list_architectures(pattern)
