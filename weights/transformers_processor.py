"""A transformers image processor's file (``preprocessor_config.json``) as timm's preprocessing entries: the
steps of the processor class it names (ViT's, Bit's, CLIP's, ConvNext's) with that class's defaults for what the
file leaves out."""

from __future__ import annotations

import math
import warnings
from typing import Any

__all__ = ["RESAMPLE", "processor_preprocessing"]

# PIL's resampling filters by the number transformers' processors store
RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}

# The image processors transformers' Swin repositories name, each with what it does and its class defaults
# (transformers 5.24): "squash" resizes to size (height, width); "crop" resizes the shorter side to size and
# center-crops crop_size; "crop_pct" (ConvNext's) below 384 resizes the shorter side to int(size / crop_pct) and
# center-crops size, from 384 squashes to size. An int size is square for ViT's, the shorter side for the others.
_CLIP = {"image_mean": (0.48145466, 0.4578275, 0.40821073), "image_std": (0.26862954, 0.26130258, 0.27577711)}
_PROCESSORS: dict[str, tuple[str, dict[str, Any]]] = {
    "ViT": ("squash", {"resample": 2, "image_mean": (0.5,) * 3, "image_std": (0.5,) * 3, "size": 224}),
    "Bit": ("crop", {"resample": 3, **_CLIP, "size": 224, "crop_size": 224, "do_center_crop": True}),
    "CLIP": ("crop", {"resample": 3, **_CLIP, "size": 224, "crop_size": 224, "do_center_crop": True}),
    "ConvNext": (
        "crop_pct",
        {"resample": 3, "image_mean": (0.5,) * 3, "image_std": (0.5,) * 3, "size": 384, "crop_pct": 224 / 256},
    ),
}


def _processor_kind(processor: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """What the processor's class does and its defaults, by ``image_processor_type`` (or the older
    ``feature_extractor_type``); None for a class not listed."""
    name = str(processor.get("image_processor_type") or processor.get("feature_extractor_type") or "")
    for suffix in ("Pil", "Fast"):
        name = name.removesuffix(suffix)
    for kind in ("ImageProcessor", "FeatureExtractor"):
        name = name.removesuffix(kind)
    return _PROCESSORS.get(name)


def _side(value: Any, square: bool) -> tuple[int, int] | int | None:
    """A processor's size entry: (height, width), or the shorter side (an int) where it names one."""
    if isinstance(value, dict):
        if "height" in value and "width" in value:
            return (value["height"], value["width"])
        return value.get("shortest_edge")
    if isinstance(value, int):
        return (value, value) if square else value
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return tuple(value)
    return None


def _per_channel(value: Any) -> tuple[float, ...]:
    return tuple(value) if isinstance(value, (list, tuple)) else (value,) * 3  # a number serves every channel


def processor_preprocessing(processor: dict[str, Any], img_size: tuple[int, int], origin: str) -> dict[str, Any]:
    """pretrained_cfg entries for what the image processor does, its class's defaults where its file leaves
    an entry out: interpolation, mean, std, crop_pct and crop_mode. {} with a warning where its steps are none
    timm's transform takes (the model keeps the default preprocessing)."""
    height, width = img_size

    def unreadable(why: str) -> dict[str, Any]:
        warnings.warn(
            f"{origin}: preprocessor_config.json {why}: the model keeps the default preprocessing "
            "(swin.data_config(model) says which)",
            UserWarning,
            stacklevel=5,
        )
        return {}

    known = _processor_kind(processor)
    if known is None:
        kind = processor.get("image_processor_type") or processor.get("feature_extractor_type")
        return unreadable(f"names the image processor {kind!r}, whose steps are not known here")
    steps, defaults = known
    processor = {**defaults, **{k: v for k, v in processor.items() if v is not None}}
    if not processor.get("do_rescale", True) or abs(float(processor.get("rescale_factor", 1 / 255)) - 1 / 255) > 1e-9:
        return unreadable("does not scale pixel values by 1/255, where images are scaled to [0, 1]")
    if not processor.get("do_resize", True):
        return unreadable("does not resize")
    if processor["resample"] not in RESAMPLE:
        return unreadable(f"resamples with filter {processor['resample']!r}, which PIL has not")
    out: dict[str, Any] = {"interpolation": RESAMPLE[processor["resample"]]}
    if processor.get("do_normalize", True):
        out |= {"mean": _per_channel(processor["image_mean"]), "std": _per_channel(processor["image_std"])}
    else:  # scaled to [0, 1] and no more
        out |= {"mean": (0.0,) * 3, "std": (1.0,) * 3}
    if steps == "crop_pct":
        shortest = _side(processor["size"], square=False)
        if not isinstance(shortest, int):
            return unreadable(f"gives ConvNext's size as {processor['size']!r}, not a shorter side")
        if shortest >= 384:  # ConvNext squashes from 384 on
            steps, box = "squash", (shortest, shortest)
        else:
            steps, resize, crop = "crop", int(shortest / processor["crop_pct"]), (shortest, shortest)
    elif steps == "crop" and processor.get("do_center_crop"):
        resize, crop = _side(processor["size"], square=False), _side(processor["crop_size"], square=True)
        if not isinstance(resize, int):
            return unreadable(f"resizes to {processor['size']!r} before its crop, not a shorter side")
    else:
        steps = "squash"
        box = _side(processor["size"], square=_processor_kind(processor)[0] == "squash")
    if steps == "squash":
        if box != (height, width):
            return unreadable(f"resizes to {box} without a crop, which is not the model's {height}x{width} input")
        return out | {"crop_pct": 1.0, "crop_mode": "squash"}
    if crop != (height, width) or height != width:
        return unreadable(
            f"crops {crop} after a shorter-side resize, which the {height}x{width} model's transform is not"
        )
    # the shortest crop_pct whose floor(height / crop_pct) is the shorter side (0.9 for 224 after 248)
    fits = [round(height / resize, digits) for digits in range(1, 7)] + [round(height / (resize + 0.5), 6)]
    crop_pct = next((c for c in fits if 0 < c <= 1 and math.floor(height / c) == resize), None)
    if crop_pct is None:
        return unreadable(f"resizes to {resize} before a {height} crop")
    return out | {"crop_pct": crop_pct, "crop_mode": "center"}
