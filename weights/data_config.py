"""Evaluation preprocessing of a pretrained tag: ``swin.data_config`` and the transform it describes."""

from __future__ import annotations

from typing import Any

from torch import nn

from . import manifest

__all__ = ["data_config", "pretrained_cfg", "create_transform", "class_names"]

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
    cfg = pretrained_cfg(model_or_name)
    return {k: cfg[k] for k in _keys()}


def pretrained_cfg(model: nn.Module) -> dict[str, Any]:
    """``model.pretrained_cfg``, in timm's key names: what was loaded (recorded by the loader or by
    ``create_model("ARCH.TAG")``), else the architecture's default tag at the model's own ``img_size``.

    Computed on every access from the model's config and the record of what was loaded, so it can never
    disagree with the model (timm's ``resolve_model_data_config`` reads it).
    """
    config = getattr(model, "config", None)
    if config is None:
        raise TypeError(f"expected a model name or a swin model, got {type(model).__name__}")
    loaded = dict(getattr(model, "_loaded_cfg", None) or {})
    if "input_size" in loaded:
        base = {k: loaded[k] for k in _keys() if k in loaded}
        entry_name = loaded.get("name")
    else:
        base, entry_name = _from_config(config)
    height, width = config.img_size
    stride = config.patch_size * 2 ** (len(config.depths) - 1)
    tag = entry_name.split(".", 1)[1] if entry_name else None
    return {
        "architecture": config.name,
        "tag": tag,
        **base,
        "pool_size": (-(-height // stride), -(-width // stride)),
        "first_conv": "patch_embed.proj",
        "classifier": "head",
        **{k: v for k, v in loaded.items() if k not in base},
    }


def _from_config(config) -> tuple[dict[str, Any], str | None]:
    """The default tag's preprocessing at the config's image size (ImageNet statistics without a tag)."""
    try:
        entry = manifest.get_entry(config.name)
    except KeyError:  # an architecture without pretrained weights
        base, labels, name = {**_FALLBACK, "input_size": None}, None, None
    else:
        base = entry.data_config()
        labels = entry.labels if entry.num_classes == config.num_classes else None
        name = entry.name
    height, width = config.img_size
    if base["input_size"] is None or tuple(base["input_size"][1:]) != (height, width):
        base["resize_size"] = int(min(height, width) / base["crop_pct"])
    base.update(input_size=(config.in_chans, height, width), num_classes=config.num_classes, labels=labels)
    return base, name


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
