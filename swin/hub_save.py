"""``save_for_hf``: a classifier written as a timm model folder (``config.json`` and weights in timm's layout),
which ``timm.create_model("local-dir:FOLDER")``, ``swin.create_model("local-dir:FOLDER")`` and, once uploaded,
both libraries' ``hf-hub:`` names read.

The folder is what timm's own ``save_for_hf`` writes: ``config.json`` names the architecture by timm's name,
the head, the preprocessing (``pretrained_cfg``) and, as ``model_args``, every field in which the model differs
from that architecture as registered (a fine-tuned head, another input size or window). The weights are
converted to timm's layout; what timm's Swin cannot build (a backbone, an absolute position embedding, no patch
norm, detection semantics, an architecture timm does not know) is refused, naming what to do instead.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .atomic import atomic_output
from .model import SwinTransformer
from .registry import SwinConfig, get_config
from .weights.hub_model import LOCAL_WEIGHT_FILES

__all__ = ["save_for_hf"]

# SwinConfig fields timm's SwinTransformer and SwinTransformerV2 take under the same name and meaning.
_TIMM_ARGS = (
    "img_size",
    "patch_size",
    "in_chans",
    "num_classes",
    "embed_dim",
    "depths",
    "num_heads",
    "window_size",
    "mlp_ratio",
    "qkv_bias",
    "drop_rate",
    "proj_drop_rate",
    "attn_drop_rate",
    "drop_path_rate",
)
# Fields timm has no argument for: their value must be the architecture's (what timm builds).
_NOT_IN_TIMM = {
    "ape": "an absolute position embedding",
    "patch_norm": "a patch embedding without its LayerNorm",
    "version": "another Swin version",
}
_WEIGHT_FILES = {"model.safetensors": "safetensors", "pytorch_model.bin": "pickle"}


def save_for_hf(model: nn.Module, folder: str | os.PathLike, safe_serialization: bool | str = True) -> Path:
    """Write ``model`` (a classifier) to ``folder`` as timm's ``save_for_hf`` would: ``config.json`` and
    ``model.safetensors`` (``safe_serialization=False``: ``pytorch_model.bin``; ``"both"``: both), weights in
    timm's layout. Each file is written whole or not at all; the folder is made if missing, and weights an
    earlier save left there under another name the loaders take first are removed.

    ``config.json`` holds timm's architecture name, ``num_classes``, ``num_features``, ``global_pool``,
    ``model_args`` (the fields in which the model differs from the registered architecture: e.g. ``num_classes``,
    ``img_size``, ``window_size``, drop rates) and ``pretrained_cfg`` (the model's preprocessing, its tag and
    license, and ``label_names`` / ``label_descriptions`` while they name the head's classes). ``pos_drop_rate``,
    a training regulariser timm's Swin does not have, is not written. As everywhere, timm's Swin gives its
    per-position logits (``global_pool=""``) as NHWC where ours are NCHW.

    Returns:
        The folder.

    Raises:
        TypeError: not a classifier built here (a backbone: save its ``state_dict``; an ``OptimizedModel``: save
            its ``.model``).
        ValueError: a model timm's Swin cannot build (the message says which field and what to do).
    """
    if not isinstance(model, SwinTransformer):
        hint = (
            "save the model it runs (its .model)"
            if isinstance(getattr(model, "model", None), SwinTransformer)
            else "a backbone has no timm model to load it: save its state_dict, or the classifier it came from"
        )
        raise TypeError(f"save_for_hf writes a classifier (timm's SwinTransformer), got {type(model).__name__}; {hint}")
    if safe_serialization not in (True, False, "both"):
        raise ValueError(f"safe_serialization is {safe_serialization!r}; expected True, False or 'both' (timm's)")
    config = _config_json(model)
    from .weights import export

    tensors = {k: v.detach().contiguous() for k, v in export(model.state_dict(), "timm").items()}
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    names = {True: ["model.safetensors"], False: ["pytorch_model.bin"], "both": list(_WEIGHT_FILES)}
    # weights an earlier save left under another of the names loaders look for first: gone, so that this
    # config.json is never read beside them (model.safetensors comes before pytorch_model.bin in both libraries)
    for stale in LOCAL_WEIGHT_FILES:
        if stale not in names[safe_serialization] and (folder / stale).is_file():
            (folder / stale).unlink()
    for name in names[safe_serialization]:
        with atomic_output(folder / name) as temporary:
            if _WEIGHT_FILES[name] == "safetensors":
                from safetensors.torch import save_file

                save_file(tensors, temporary, metadata={"format": "pt"})
            else:
                torch.save(tensors, temporary)
    with atomic_output(folder / "config.json") as temporary, open(temporary, "w", encoding="utf-8") as file:
        json.dump(config, file, indent=2)
    return folder


def _config_json(model: SwinTransformer) -> dict[str, Any]:
    config: SwinConfig = model.config
    registered = get_config(config.name)
    timm_name = _timm_name(registered)
    if model.semantics != "classification":
        raise ValueError(
            f"the model runs with {model.semantics} semantics, which timm's Swin has not; save one built with "
            "the default (classification) semantics"
        )
    for field, what in _NOT_IN_TIMM.items():
        if getattr(config, field) != getattr(registered, field):
            raise ValueError(
                f"{field}={getattr(config, field)!r}: timm's Swin has no argument for {what}, so timm would build "
                f"{timm_name} without it; save this model's state_dict (swin convert --to official) instead"
            )
    args = {field: _plain(getattr(config, field)) for field in _TIMM_ARGS}
    changed = {k: v for k, v in args.items() if v != _plain(getattr(registered, k))}
    if config.version == 2 and config.pretrained_window_sizes != registered.pretrained_window_sizes:
        changed["pretrained_window_sizes"] = list(config.pretrained_window_sizes)
    changed["num_classes"] = model.num_classes  # as timm writes it, and the head may have been reset
    if model.global_pool != "avg":
        changed["global_pool"] = model.global_pool
    cfg = dict(model.pretrained_cfg)
    pretrained_cfg = {
        "tag": cfg.get("tag"),
        "custom_load": False,
        "input_size": list(cfg["input_size"]),
        "fixed_input_size": True,
        "interpolation": cfg["interpolation"],
        "crop_pct": cfg["crop_pct"],
        "crop_mode": cfg["crop_mode"],
        "mean": _per_channel(cfg["mean"], config.in_chans),
        "std": _per_channel(cfg["std"], config.in_chans),
        "num_classes": model.num_classes,
        "pool_size": list(cfg["pool_size"]),
        "first_conv": "patch_embed.proj",
        "classifier": "head.fc",
        "license": cfg.get("license"),
    }
    out: dict[str, Any] = {
        "architecture": timm_name,
        "num_classes": model.num_classes,
        "num_features": model.num_features,
    }
    if model.global_pool:
        out["global_pool"] = model.global_pool
    # class names only while they name the head's classes (timm drops them when num_classes changed)
    if cfg.get("label_names") and len(cfg["label_names"]) == model.num_classes:
        out["label_names"] = list(cfg["label_names"])
        if cfg.get("label_descriptions"):
            out["label_descriptions"] = dict(cfg["label_descriptions"])
    out["model_args"] = changed
    out["pretrained_cfg"] = {k: v for k, v in pretrained_cfg.items() if v is not None}
    return out


def _timm_name(registered: SwinConfig) -> str:
    """The architecture's name in timm (the alias timm registers), or a ValueError."""
    import timm

    for name in registered.aliases:
        if timm.is_model(name):
            return name
    raise ValueError(
        f"{registered.name} has no timm architecture among its aliases ({', '.join(registered.aliases) or 'none'}), "
        "so timm could not build it from the folder; save its state_dict instead"
    )


def _per_channel(values: Any, channels: int) -> list[float]:
    """One value, or one per input channel; values for another count (ImageNet's three, for a one-channel
    model) become their average, as timm's save_for_hf writes them."""
    values = list(values)
    return values if len(values) in (1, channels) else [sum(values) / len(values)]


def _plain(value: Any) -> Any:
    """JSON's form: tuples as lists, all the way down."""
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value
