"""A Hugging Face transformers Swin folder or repository (``config.json`` of ``model_type`` swin or swinv2, beside
``preprocessor_config.json``) read as a model description: what ``hf-hub:microsoft/swin-tiny-patch4-window7-224``
and ``local-dir:FOLDER`` (what ``swin.save_for_transformers`` writes) build.

The architecture comes from the configuration's fields, the head and class names from ``id2label``, the
preprocessing from the image processor's steps: a shorter-side resize and a center crop (``BitImageProcessor``,
``ConvNextImageProcessor`` below 384), or a resize to the input size without a crop (``ViTImageProcessor``, which
microsoft's Swin repositories name) as timm's ``crop_mode="squash"``.
"""

from __future__ import annotations

import warnings
from typing import Any

from .transformers_processor import processor_preprocessing

__all__ = ["MODEL_TYPES", "dropout_fields", "transformers_description"]

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
    args |= dropout_fields(given["hidden_dropout_prob"], given["attention_probs_dropout_prob"], origin)
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
        overlay |= processor_preprocessing(processor, args["img_size"], origin)
    if any(str(name).endswith("Backbone") for name in architectures):  # read only as a features_only model
        stages = [f"stage{i + 1}" for i in range(len(args["depths"]))]
        features = given.get("out_features") or stages[-1:]
        overlay["backbone"] = tuple(stages.index(name) for name in features if name in stages)
    return _closest_registered(version, args), args, overlay


def dropout_fields(hidden: float, attention: float, origin: str) -> dict[str, float]:
    """Our dropout rates for transformers' ``hidden_dropout_prob`` and ``attention_probs_dropout_prob``, with a
    warning where either is not zero: transformers places its dropouts otherwise, which only training sees."""
    if hidden or attention:
        warnings.warn(
            f"{origin}: hidden_dropout_prob={hidden} and attention_probs_dropout_prob={attention} are read as "
            f"pos_drop_rate=proj_drop_rate={hidden}, attn_drop_rate={attention}; transformers places its dropouts "
            "otherwise (none between the MLP's two layers, where proj_drop_rate also drops; the attention output at "
            "attention_probs_dropout_prob in Swin V2 and transformers 4.x), so training drops differently from "
            "transformers' model (eval outputs are the same); pass the rates you want to create_model to change them",
            UserWarning,
            stacklevel=3,
        )
    return {"pos_drop_rate": hidden, "proj_drop_rate": hidden, "attn_drop_rate": attention}


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
