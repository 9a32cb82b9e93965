"""timm's ``hf-hub:`` model names: a Hugging Face hub repository that timm wrote (``push_to_hf_hub``) describes a
model in its ``config.json`` (``architecture``, ``num_classes``, ``pretrained_cfg``, optional ``model_args``) and
holds its weights (``model.safetensors``, else ``pytorch_model.bin``), in timm's layout.

``create_model("hf-hub:timm/swin_tiny_patch4_window7_224.ms_in1k", pretrained=True)`` reads the same repository
timm reads: the architecture by its timm name, the head and preprocessing from the config, and, asked for, the
weights (converted from timm's layout and checked as every checkpoint is).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import hub
from .download import DownloadError

__all__ = ["HUB_PREFIX", "HubModel", "hub_model"]

HUB_PREFIX = "hf-hub:"
# A model description is a few KB; anything far larger is not one.
_MAX_CONFIG_BYTES = 1 << 20
# The pretrained_cfg entries that describe preprocessing (create_model's pretrained_cfg_overlay takes them).
_PREPROCESSING = ("input_size", "interpolation", "crop_pct", "crop_mode", "mean", "std")
_WEIGHTS = ("model.safetensors", "pytorch_model.bin")


class HubModel(dict):
    """What a hub repository describes: ``architecture`` (timm's name), ``overlay`` (preprocessing and
    ``num_classes``, as ``pretrained_cfg_overlay``) and ``model_args`` (architecture overrides)."""


def hub_model(spec: str, weights: bool = False) -> HubModel:
    """The model ``REPO`` or ``REPO@REVISION`` describes (``spec`` without the ``hf-hub:`` prefix); with
    ``weights``, the overlay's ``file`` is its weights in the hub cache.

    Raises:
        DownloadError: a file of the repository could not be had (offline and not cached, or the hub failed).
        ValueError: a ``config.json`` that is not a timm model description.
    """
    repo_id, _, revision = spec.partition("@")
    if not repo_id or repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise ValueError(f"hf-hub:{spec} is not a hub repository; write hf-hub:OWNER/NAME (e.g. hf-hub:timm/NAME)")
    revision = revision or "main"
    config = _read_config(_file(repo_id, "config.json", revision), f"hf-hub:{spec}")
    # timm's older configs are the pretrained_cfg itself, with the architecture beside it
    pretrained_cfg = config["pretrained_cfg"] if "pretrained_cfg" in config else config
    model_args = dict(config.get("model_args") or {})
    input_size = pretrained_cfg.get("input_size")
    if input_size is not None and len(input_size) == 3:  # the size to build for, unless model_args say another
        model_args.setdefault("in_chans", input_size[0])
        model_args.setdefault("img_size", tuple(input_size[1:]))
    overlay = {key: pretrained_cfg[key] for key in _PREPROCESSING if pretrained_cfg.get(key) is not None}
    overlay.pop("input_size", None)  # the model's own, from what it is built for
    overlay |= {"hf_hub_id": f"{repo_id}@{revision}", "source": "hf-hub", "tag": pretrained_cfg.get("tag")}
    labels = config.get("label_names", pretrained_cfg.get("label_names", pretrained_cfg.get("labels")))
    if isinstance(labels, list):  # the repository's own class names, not a tag's ImageNet labels
        overlay |= {"label_names": labels, "labels": None}
    num_classes = config.get("num_classes", pretrained_cfg.get("num_classes"))
    if num_classes is not None:
        overlay["num_classes"] = num_classes
    if weights:
        overlay["file"] = str(_weights(repo_id, revision))
    architecture = config["architecture"].partition(".")[0]  # timm reads the architecture without a tag
    return HubModel(architecture=architecture, overlay=overlay, model_args=model_args)


def _file(repo_id: str, filename: str, revision: str) -> Path:
    path = hub.hub_file(repo_id, filename, revision=revision)
    if path is None:
        raise DownloadError(
            f"{hub.hub_url(repo_id, filename, revision)}: not in the Hugging Face cache and offline (SWIN_OFFLINE or "
            "HF_HUB_OFFLINE); fetch it once online"
        )
    return path


def _weights(repo_id: str, revision: str) -> Path:
    """The repository's safetensors weights, else its pickle (timm's order); one error naming both otherwise."""
    reasons = []
    for filename in _WEIGHTS:
        try:
            return _file(repo_id, filename, revision)
        except DownloadError as error:
            reasons.append(str(error))
    raise DownloadError("the repository's weights could not be had: " + "; ".join(reasons))


def _read_config(path: Path, origin: str) -> dict[str, Any]:
    if path.stat().st_size > _MAX_CONFIG_BYTES:
        raise ValueError(f"{origin}: config.json is {path.stat().st_size} bytes, not a model description")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise ValueError(f"{origin}: config.json is not JSON ({error})") from None
    if not isinstance(config, dict) or not isinstance(config.get("architecture"), str):
        raise ValueError(f"{origin}: config.json names no architecture; is it a timm model's repository?")
    for key in ("pretrained_cfg", "model_args"):
        if not isinstance(config.get(key) or {}, dict):
            raise ValueError(f"{origin}: config.json's {key} is not a mapping")
    return config
