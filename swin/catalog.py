"""What can be built and loaded: registered architectures and pretrained tags (no torch needed)."""

from __future__ import annotations

from .registry import list_models as list_architectures

__all__ = ["list_models"]


def list_models(
    pattern: str | list[str] | None = None,
    pretrained: bool = False,
    exclude_filters: str | list[str] | None = None,
    *,
    filter: str | list[str] | None = None,  # noqa: A002 (timm's keyword)
) -> list[str]:
    """Registered architecture names, sorted, filtered by a shell-style ``pattern`` if given (as timm's filter: a
    list of patterns matches any, ``""`` filters nothing; timm's keyword ``filter=`` names it too), less those
    ``exclude_filters`` match (timm's: a pattern or a list of them). A name matches when it or one of its
    aliases does (``"swin_tiny*"`` finds ``swin_t`` by timm's name).

    With ``pretrained=True``, the pretrained checkpoints of the weights manifest instead, as ``ARCH.TAG``
    names (``swin_t.ms_in1k``); ``pattern`` then matches those (``"swin_t"`` alone means ``"swin_t.*"``).
    """
    if filter is not None:
        if pattern is not None and pattern != filter:
            raise TypeError(f"list_models got pattern {pattern!r} and filter {filter!r}; pass one of them")
        pattern = filter
    names = _listed(pattern, pretrained)
    if exclude_filters:
        excluded = set(_listed(exclude_filters, pretrained))
        names = [name for name in names if name not in excluded]
    return names


def _listed(pattern: str | list[str] | None, pretrained: bool) -> list[str]:
    if pretrained:
        from .weights.manifest import list_pretrained

        return list_pretrained(pattern)
    return list_architectures(pattern)
