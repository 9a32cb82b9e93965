"""A Hugging Face transformers Swin folder or repository (``config.json`` of ``model_type`` swin or swinv2, beside
``preprocessor_config.json``) read as a model description: what ``hf-hub:microsoft/swin-tiny-patch4-window7-224``
and ``local-dir:FOLDER`` (what ``swin.save_for_transformers`` writes) build.

The architecture comes from the configuration's fields, the head and class names from ``id2label``, the
preprocessing from the image processor's steps: a shorter-side resize and a center crop (``BitImageProcessor``,
``ConvNextImageProcessor`` below 384), or a resize to the input size without a crop (``ViTImageProcessor``, which
microsoft's Swin repositories name) as timm's ``crop_mode="squash"``.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

__all__ = ["MODEL_TYPES", "RESAMPLE", "transformers_description"]

MODEL_TYPES = {"swin": 1, "swinv2": 2}
# transformers' config fields -> ours (what is left out is checked or has no bearing on the outputs)
_FIELDS = {
    "patch_size": "patch_size",
    "num_channels": "in_chans",
    "embed_dim": "embed_dim",
    "depths": "depths",
    "num_heads": "num_heads",
    "window_size": "window_size",
    "mlp_ratio": "mlp_ratio",
    "qkv_bias": "qkv_bias",
    "use_absolute_embeddings": "ape",
    "drop_path_rate": "drop_path_rate",
    "hidden_dropout_prob": "proj_drop_rate",
    "attention_probs_dropout_prob": "attn_drop_rate",
}
# transformers' SwinConfig and Swinv2Config defaults (5.24) of the fields read
_DEFAULTS = {
    "image_size": 224,
    "patch_size": 4,
    "num_channels": 3,
    "embed_dim": 96,
    "depths": [2, 2, 6, 2],
    "num_heads": [3, 6, 12, 24],
    "window_size": 7,
    "mlp_ratio": 4.0,
    "qkv_bias": True,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
    "drop_path_rate": 0.1,
    "use_absolute_embeddings": False,
}
# PIL's resampling filters by the number transformers' processors store
RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}


def transformers_description(
    config: dict[str, Any], processor: dict[str, Any] | None, origin: str
) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(a registered architecture to start from, the model's fields, the pretrained_cfg entries: head, class
    names, preprocessing) of a transformers Swin ``config.json`` and its ``preprocessor_config.json`` (None where
    the folder or repository has none); a ValueError naming ``origin`` and the entry for what no model here runs
    as transformers does."""
    version = MODEL_TYPES[config["model_type"]]

    def fail(entry: str, why: str) -> None:
        raise ValueError(f"{origin}: config.json's {entry} is {config.get(entry)!r}; {why}")

    if config.get("hidden_act", "gelu") != "gelu":
        fail("hidden_act", "the Swin here runs the exact GELU ('gelu') only")
    if abs(float(config.get("layer_norm_eps", 1e-5)) - 1e-5) > 1e-12:
        fail("layer_norm_eps", "the Swin here norms with eps 1e-5, as transformers' default")
    # a field the file leaves out is transformers' default, never the registered architecture's
    given = _DEFAULTS | {k: v for k, v in config.items() if v is not None}
    args = {ours: given[theirs] for theirs, ours in _FIELDS.items()}
    size = given["image_size"]
    args["img_size"] = tuple(size) if isinstance(size, (list, tuple)) else (size, size)
    for key in ("depths", "num_heads"):
        args[key] = tuple(args[key])
    if version == 2:  # zeros included: the registered architecture it starts from may have others
        args["version"] = 2
        args["pretrained_window_sizes"] = tuple(given.get("pretrained_window_sizes") or (0,) * len(args["depths"]))
    architectures = config.get("architectures") or []
    # a config.json without architectures (not written by save_pretrained) is taken as the classifier it can be
    classifier = any(str(name).endswith("ForImageClassification") for name in architectures) or not architectures
    labels = _labels(config.get("id2label"), origin) if classifier else None
    # a SwinModel or SwinBackbone repository has no head; transformers' default classifier has 2 labels
    num_classes = (len(labels) if labels else config.get("num_labels") or 2) if classifier else 0
    # the repository's own classes: no ImageNet label set of the registered architecture it starts from
    overlay: dict[str, Any] = {"num_classes": num_classes, "labels": None}
    if labels and not all(label == f"LABEL_{i}" for i, label in enumerate(labels)):
        overlay["label_names"] = labels
    args["num_classes"] = num_classes
    if processor is not None:
        overlay |= _preprocessing(processor, args["img_size"], origin)
    if any(str(name).endswith("Backbone") for name in architectures):  # read only as a features_only model
        stages = [f"stage{i + 1}" for i in range(len(args["depths"]))]
        features = given.get("out_features") or stages[-1:]
        overlay["backbone"] = tuple(stages.index(name) for name in features if name in stages)
    return _closest_registered(version, args), args, overlay


def _closest_registered(version: int, args: dict[str, Any]) -> str:
    """The registered architecture of ``version`` whose widths and depths are ``args``' (the one of the same
    window and size first), else the smallest of that version: the fields all come from ``args``; the name is
    what the model reports as its architecture."""
    from ..registry import get_config, list_models

    same = [
        name
        for name in list_models()
        if (config := get_config(name)).version == version
        and (config.embed_dim, config.depths, config.num_heads)
        == (args.get("embed_dim"), args.get("depths"), args.get("num_heads"))
    ]
    exact = [
        n
        for n in same
        if (get_config(n).window_size, get_config(n).img_size, get_config(n).pretrained_window_sizes)
        == (args["window_size"], args["img_size"], args.get("pretrained_window_sizes", (0, 0, 0, 0)))
    ]
    return (exact or same or ["swinv2_t_w8" if version == 2 else "swin_t"])[0]


def _labels(id2label: Any, origin: str) -> list[str] | None:
    if not id2label:
        return None
    if not isinstance(id2label, dict):
        raise ValueError(f"{origin}: config.json's id2label is not a mapping of class index to name")
    try:
        indexed = {int(key): str(value) for key, value in id2label.items()}
    except (TypeError, ValueError):
        raise ValueError(f"{origin}: config.json's id2label has a key that is no class index") from None
    if sorted(indexed) != list(range(len(indexed))):
        raise ValueError(f"{origin}: config.json's id2label does not number its classes 0..{len(indexed) - 1}")
    return [indexed[i] for i in range(len(indexed))]


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


def _preprocessing(processor: dict[str, Any], img_size: tuple[int, int], origin: str) -> dict[str, Any]:
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
