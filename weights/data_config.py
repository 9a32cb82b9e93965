"""Evaluation preprocessing of a pretrained tag: ``swin.data_config`` and the transform it describes."""

from __future__ import annotations

from typing import Any

from torch import nn

from . import manifest

__all__ = ["data_config", "create_transform", "class_names"]

# For models whose architecture has no manifest entry: ImageNet statistics and Swin's evaluation crop.
_FALLBACK = {
    "interpolation": "bicubic",
    "mean": (0.485, 0.456, 0.406),
    "std": (0.229, 0.224, 0.225),
    "crop_pct": 0.9,
    "crop_mode": "center",
    "labels": None,
}


def data_config(model_or_name: nn.Module | str) -> dict[str, Any]:
    """Input size, resize, crop, interpolation and mean/std to evaluate a model or a pretrained tag.

    Args:
        model_or_name: ``"swin_t"`` (its default tag), ``"swin_t.ms_in22k"``, a timm alias, or a model from
            ``create_model``: the tag it was loaded with, else its architecture's default tag at the model's
            own ``img_size``.

    Returns:
        ``input_size`` (C, H, W), ``resize_size`` (shorter side before the center crop), ``crop_pct``,
        ``crop_mode``, ``interpolation``, ``mean``, ``std``, ``num_classes`` and ``labels`` (timm's
        ImageNetInfo subset name, or None).
    """
    if isinstance(model_or_name, str):
        return manifest.get_entry(model_or_name).data_config()
    loaded = getattr(model_or_name, "pretrained_cfg", None)
    if isinstance(loaded, dict) and "input_size" in loaded:
        return {k: loaded[k] for k in _keys()}
    config = getattr(model_or_name, "config", None)
    if config is None:
        raise TypeError(f"expected a model name or a swin model, got {type(model_or_name).__name__}")
    try:
        entry = manifest.get_entry(config.name)
    except KeyError:  # an architecture without pretrained weights
        base, labels = {**_FALLBACK, "input_size": None}, None
    else:
        base, labels = entry.data_config(), (entry.labels if entry.num_classes == config.num_classes else None)
    height, width = config.img_size
    if base["input_size"] is None or tuple(base["input_size"][1:]) != (height, width):
        base["resize_size"] = int(min(height, width) / base["crop_pct"])
    base.update(input_size=(config.in_chans, height, width), num_classes=config.num_classes, labels=labels)
    return base


def _keys() -> tuple[str, ...]:
    return (
        "input_size",
        "interpolation",
        "mean",
        "std",
        "crop_pct",
        "crop_mode",
        "resize_size",
        "num_classes",
        "labels",
    )


def create_transform(config: dict[str, Any]):
    """A torchvision transform (PIL image -> normalised tensor) for a ``data_config`` dict.

    Resize the shorter side to ``resize_size`` with ``interpolation``, center-crop to ``input_size``,
    scale to [0, 1], normalise with ``mean``/``std``: timm's evaluation transform.
    """
    from torchvision import transforms

    _, height, width = config["input_size"]
    mode = transforms.InterpolationMode(config["interpolation"])
    return transforms.Compose(
        [
            transforms.Resize(config["resize_size"], interpolation=mode),
            transforms.CenterCrop((height, width)),
            transforms.ToTensor(),
            transforms.Normalize(config["mean"], config["std"]),
        ]
    )


def class_names(config: dict[str, Any]) -> list[str] | None:
    """Human-readable class names for ``config["labels"]`` (timm ships ImageNet-1k and -22k's), or None."""
    subset = config.get("labels")
    if not subset:
        return None
    from timm.data import ImageNetInfo

    info = ImageNetInfo(subset)
    return [info.index_to_description(i) for i in range(info.num_classes())]
