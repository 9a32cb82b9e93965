"""``save_for_transformers``: a model written as a Hugging Face transformers folder, which
``AutoModelForImageClassification.from_pretrained(FOLDER)`` (or ``AutoModel``, ``AutoBackbone``) and
``pipeline("image-classification", model=FOLDER)`` read.

The folder is what transformers' ``save_pretrained`` writes for its Swin: ``config.json`` (transformers' own
``SwinConfig`` / ``Swinv2Config``, with the architecture class, the labels and every field of the model),
``model.safetensors`` in the names ``save_pretrained`` writes, and ``preprocessor_config.json`` for
transformers' ``BitImageProcessor``: the shorter side resized (bicubic) to the size the model's ``crop_pct``
gives, a center crop to its input size, the model's mean and std. What transformers' Swin cannot build (per-stage
or rectangular windows, no patch norm, a pooling other than the average, a backbone of classification semantics)
is refused, naming what to do instead.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from torch import nn

from .atomic import atomic_output
from .backbone import SwinBackbone
from .model import SwinTransformer
from .weights.hub_model import LOCAL_WEIGHT_FILES
from .weights.transformers_processor import RESAMPLE

__all__ = ["save_for_transformers"]

# transformers' PILImageResampling values by our names, as its processors store them
_RESAMPLE = {name: number for number, name in RESAMPLE.items()}


def save_for_transformers(model: nn.Module, folder: str | os.PathLike) -> Path:
    """Write ``model`` to ``folder`` as transformers' ``save_pretrained`` would: ``config.json``,
    ``model.safetensors`` and ``preprocessor_config.json``, each written whole or not at all (the folder is
    made if missing; weights an earlier save left under another name transformers reads first are removed).

    A classifier becomes ``SwinForImageClassification`` (``Swinv2ForImageClassification`` for Swin V2), with
    its class names as ``id2label`` while they name the head's classes; one without a head (``num_classes=0``)
    ``SwinModel``, whose ``pooler_output`` is our output; a ``features_only`` backbone ``SwinBackbone`` (the
    same detection semantics: pad before the shift, windows never shrunk), its stages as ``out_features``.

    Needs transformers (``pip install transformers``), whose configuration classes write the configuration.

    Returns:
        The folder.

    Raises:
        TypeError: not one of our models (an ``OptimizedModel``: save its ``.model``).
        ValueError: a model transformers' Swin cannot build (the message says which field and what to do).
    """
    kind = _kind(model)
    try:
        import transformers
    except ImportError as error:
        raise ImportError(
            "save_for_transformers writes transformers' own configuration and needs transformers: "
            "pip install transformers"
        ) from error
    from .weights import export

    # first: what transformers' model cannot hold, or would compute otherwise, is refused here
    tensors = {k: v.detach().contiguous() for k, v in export(model, "transformers").items()}
    config = _hf_config(model, kind, transformers)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for stale in LOCAL_WEIGHT_FILES:  # pytorch_model.bin and the like beside the new weights
        if stale != "model.safetensors" and (folder / stale).is_file():
            (folder / stale).unlink()
    from safetensors.torch import save_file

    with atomic_output(folder / "model.safetensors") as temporary:
        save_file(tensors, temporary, metadata={"format": "pt"})
    with atomic_output(folder / "config.json") as temporary:
        config.to_json_file(temporary)
    if kind == "SwinBackbone":
        (folder / "preprocessor_config.json").unlink(missing_ok=True)
    else:
        processor, why_not = _image_processor(model, transformers)
        if processor is None:
            (folder / "preprocessor_config.json").unlink(missing_ok=True)  # an earlier save's: the pipeline reads it
            warnings.warn(
                f"save_for_transformers: no preprocessor_config.json written ({why_not}): from_pretrained reads the "
                "model, pipeline() needs an image processor of yours saved beside it",
                UserWarning,
                stacklevel=2,
            )
        else:
            with atomic_output(folder / "preprocessor_config.json") as temporary:
                processor.to_json_file(temporary)
    return folder


def _kind(model: nn.Module) -> str:
    if isinstance(model, SwinBackbone):
        return "SwinBackbone"
    if isinstance(model, SwinTransformer):
        return "ForImageClassification" if model.num_classes else "Model"
    hint = "save the model it runs (its .model)" if isinstance(getattr(model, "model", None), nn.Module) else ""
    raise TypeError(
        f"save_for_transformers writes one of swin's models (a classifier or a features_only backbone), got "
        f"{type(model).__name__}" + (f"; {hint}" if hint else "")
    )


def _hf_config(model: nn.Module, kind: str, transformers: Any) -> Any:
    """transformers' configuration of ``model``: every field of its architecture, the class to build, labels."""
    config = model.config
    stages = model.num_layers  # a backbone builds the stages up to the last one it outputs
    if config.proj_drop_rate or config.pos_drop_rate or config.attn_drop_rate:
        warnings.warn(
            f"the model's dropout (pos_drop_rate={config.pos_drop_rate}, proj_drop_rate={config.proj_drop_rate}, "
            f"attn_drop_rate={config.attn_drop_rate}) is saved as hidden_dropout_prob={config.proj_drop_rate}, "
            f"attention_probs_dropout_prob={config.attn_drop_rate} (pos_drop_rate has no field of its own: "
            "transformers drops after the embeddings at hidden_dropout_prob); transformers places its dropouts "
            "otherwise (after the embeddings and the MLP's output, none between its layers), so training it there "
            "drops differently (eval outputs are the same)",
            UserWarning,
            stacklevel=3,
        )
    height, width = config.img_size
    args = {
        "image_size": height if height == width else [height, width],
        "patch_size": config.patch_size,
        "num_channels": config.in_chans,
        "embed_dim": config.embed_dim,
        "depths": list(config.depths[:stages]),
        "num_heads": list(config.num_heads[:stages]),
        "window_size": config.window_size,
        "mlp_ratio": config.mlp_ratio,
        "qkv_bias": config.qkv_bias,
        "hidden_dropout_prob": config.proj_drop_rate,
        "attention_probs_dropout_prob": config.attn_drop_rate,
        "drop_path_rate": config.drop_path_rate,
        "use_absolute_embeddings": config.ape,
        "layer_norm_eps": 1e-5,
    }
    if config.version == 2:
        args["pretrained_window_sizes"] = list(config.pretrained_window_sizes[:stages])
    if kind == "SwinBackbone":
        args["out_features"] = [f"stage{i + 1}" for i in model.out_indices]
    elif kind == "ForImageClassification":
        args["num_labels"] = model.num_classes
        names = _labels(model)
        if names:
            args["id2label"] = dict(enumerate(names))
            args["label2id"] = {name: i for i, name in enumerate(names)}
    prefix = "Swinv2" if config.version == 2 else "Swin"
    hf_config = getattr(transformers, f"{prefix}Config")(**args)
    hf_config.architectures = ["SwinBackbone" if kind == "SwinBackbone" else prefix + kind]
    return hf_config


def _labels(model: SwinTransformer) -> list[str] | None:
    """The head's class names as transformers' Swin checkpoints give them (ImageNet's descriptions, "tench,
    Tinca tinca"), while they name the head's classes: a hub folder's ``label_names`` (through its
    ``label_descriptions`` where it has them), else the pretrained config's timm label set; else None."""
    cfg = model.pretrained_cfg
    names = cfg.get("label_names")
    if names:
        descriptions = cfg.get("label_descriptions") or {}
        names = [descriptions.get(name, name) for name in names]
    elif cfg.get("labels"):
        from .weights.data_config import class_names

        try:
            names = class_names(cfg)
        except Exception:  # a label set this timm does not ship: transformers' LABEL_i
            names = None
    return list(names) if names and len(names) == model.num_classes else None


def _image_processor(model: nn.Module, transformers: Any) -> tuple[Any, str]:
    """transformers' ``BitImageProcessor`` with the model's evaluation transform (shorter side to the size
    ``crop_pct`` gives, center crop to the input size, scaled to [0, 1], normalised by the model's mean and
    std), or None and why where its steps cannot say that transform."""
    from .weights.data_config import data_config

    cfg = data_config(model)
    channels, height, width = cfg["input_size"]
    if channels != 3:
        return None, f"the model takes {channels} input channel(s), and transformers' processors make RGB images"
    if cfg["crop_mode"] == "squash" and cfg["crop_pct"] == 1 and cfg["interpolation"] in _RESAMPLE:
        # resized to the input size, no crop: ViT's processor (what microsoft's Swin repositories name)
        return transformers.ViTImageProcessor(
            do_resize=True,
            size={"height": height, "width": width},
            resample=_RESAMPLE[cfg["interpolation"]],
            do_rescale=True,
            rescale_factor=1 / 255,
            do_normalize=True,
            image_mean=list(cfg["mean"]),
            image_std=list(cfg["std"]),
        ), ""
    if height != width or cfg["crop_mode"] != "center":
        return (
            None,
            f"its {height}x{width} input with crop_mode {cfg['crop_mode']!r} is no shorter-side resize and crop",
        )
    if cfg["interpolation"] not in _RESAMPLE:
        return None, f"interpolation {cfg['interpolation']!r} has no PIL filter in transformers' processors"
    processor = transformers.BitImageProcessor(
        do_resize=True,
        size={"shortest_edge": cfg["resize_size"]},
        resample=_RESAMPLE[cfg["interpolation"]],
        do_center_crop=True,
        crop_size={"height": height, "width": width},
        do_rescale=True,
        rescale_factor=1 / 255,
        do_normalize=True,
        image_mean=list(cfg["mean"]),
        image_std=list(cfg["std"]),
        do_convert_rgb=True,
    )
    return processor, ""
