"""timm's ``hf-hub:`` model names: a Hugging Face hub repository that timm wrote (``push_to_hf_hub``) describes a
model in its ``config.json`` (``architecture``, ``num_classes``, ``pretrained_cfg``, optional ``model_args``) and
holds its weights (``model.safetensors``, else ``pytorch_model.bin``), in timm's layout.

``create_model("hf-hub:timm/swin_tiny_patch4_window7_224.ms_in1k", pretrained=True)`` reads the same repository
timm reads: the architecture by its timm name, the head and preprocessing from the config, and, asked for, the
weights (converted from timm's layout and checked as every checkpoint is). A transformers Swin repository
(``config.json`` of model_type swin or swinv2, as microsoft's) is read too, through
:mod:`swin.weights.transformers_config`. The description is checked before any weights are fetched: a
repository of another architecture, or one whose values no model or transform can take, costs one small download
and gives an error naming the repository and the entry.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from ..registry import SwinConfig, get_config, resolve_name
from ..registry.params import count_parameters
from . import hub
from .data_config import check_preprocessing
from .download import DownloadError
from .export_checks import stage_size_problem
from .size_limits import MAX_CHECKPOINT_BYTES_ENV, format_bytes, max_checkpoint_bytes
from .transformers_config import MODEL_TYPES, transformers_description

__all__ = [
    "HUB_PREFIX",
    "LOCAL_PREFIX",
    "LOCAL_WEIGHT_FILES",
    "HubModel",
    "check_buildable",
    "hub_model",
    "hub_weights",
    "local_model",
    "local_weights",
]

HUB_PREFIX = "hf-hub:"
# A model description is a few KB, a few MB with the names of ImageNet-22k's 21,841 classes (transformers'
# id2label and label2id); anything far larger is not one.
_MAX_CONFIG_BYTES = 16 << 20
# The pretrained_cfg entries that describe preprocessing (create_model's pretrained_cfg_overlay takes them).
_PREPROCESSING = ("input_size", "interpolation", "crop_pct", "crop_mode", "mean", "std")
# The free-form entries timm keeps from a repository's pretrained_cfg (checked where they have a form). Where the
# weights are (url, file, state_dict, hf_hub_*) is never taken from a repository: only its own files are read.
_KEPT = (
    "tag",
    "license",
    "description",
    "origin_url",
    "paper_ids",
    "paper_name",
    "notes",
    "fixed_input_size",
    "test_input_size",
    "test_crop_pct",
    "min_input_size",
    "label_descriptions",
)
_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
# a transformers repository's image processor, beside its config.json
_PROCESSOR = "preprocessor_config.json"
# timm's preferred weight files in a local-dir: folder, in its order (before any other file)
LOCAL_WEIGHT_FILES = (*_WEIGHTS, "pytorch_model.pth", "model.pth")
LOCAL_PREFIX = "local-dir:"
# timm's default head, for a config.json that names none (its PretrainedCfg default)
_DEFAULT_CLASSES = 1000


class HubModel(dict):
    """What a hub repository describes: ``architecture`` (our registered name), ``overlay`` (preprocessing,
    ``num_classes`` and provenance, as ``pretrained_cfg_overlay``) and ``model_args`` (architecture overrides)."""


def hub_model(spec: str) -> HubModel:
    """The model ``REPO`` or ``REPO@REVISION`` describes (``spec`` without the ``hf-hub:`` prefix).

    Raises:
        DownloadError: ``config.json`` could not be had (offline and not cached, or the hub failed).
        ValueError: a name that is not a repository, a ``config.json`` that is not a timm model description, of
            an architecture that is not a registered Swin, or with values no model or transform can take.
    """
    repo_id, revision = _split(spec)
    origin = f"{HUB_PREFIX}{spec}"
    config = _read_config(_file(repo_id, "config.json", revision), origin)
    # as timm records it: the name as written
    source = {"hf_hub_id": spec, "source": "hf-hub"}
    if config.get("model_type") in MODEL_TYPES:  # a transformers repository: its image processor beside it
        try:
            path = hub.hub_file(repo_id, _PROCESSOR, revision=revision)
        except hub.HubFileMissing:  # the repository has none
            path = None
        else:
            if path is None:  # offline, and not in the cache: online, the repository's own would be read
                warnings.warn(
                    f"{origin}: offline, and its {_PROCESSOR} is not in the Hugging Face cache: the model takes the "
                    "default preprocessing, which may not be the repository's; fetch the repository once online",
                    UserWarning,
                    stacklevel=4,
                )
        processor = None if path is None else _read_json(path, origin, _PROCESSOR)
        return _described_transformers(config, processor, origin, source)
    return _described(config, origin, source)


def local_model(folder: str) -> HubModel:
    """The model a folder in a hub repository's form describes (timm's ``local-dir:``; ``folder`` without the
    prefix): its ``config.json``, as :func:`hub_model` reads a repository's (what ``swin.save_for_hf`` and
    timm's ``save_for_hf`` write).

    Raises:
        FileNotFoundError: ``folder`` is not a folder, or holds no ``config.json``.
        ValueError: as :func:`hub_model`.
    """
    origin = f"{LOCAL_PREFIX}{folder}"
    path = Path(folder).expanduser()
    if not path.is_dir():
        what = "is a file, not a folder" if path.exists() else "no such folder"
        raise FileNotFoundError(f"{origin}: {what}; local-dir: names a folder holding config.json and weights")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"{origin}: the folder holds no config.json (a model description, as swin.save_for_hf, timm's "
            "save_for_hf and swin.save_for_transformers write); load a checkpoint file with pretrained=PATH instead"
        )
    config = _read_config(path / "config.json", origin)
    source = {"hf_hub_id": None, "source": "local-dir"}
    if config.get("model_type") in MODEL_TYPES:  # a transformers folder (what swin.save_for_transformers writes)
        processor = _read_json(path / _PROCESSOR, origin, _PROCESSOR) if (path / _PROCESSOR).is_file() else None
        return _described_transformers(config, processor, origin, source)
    return _described(config, origin, source)


def local_weights(folder: str) -> Path:
    """The weights file of a ``local-dir:`` folder, in timm's order: ``model.safetensors``, ``pytorch_model.bin``,
    ``pytorch_model.pth``, ``model.pth``, else the first ``*.safetensors``, ``*.pth``, ``*.pth.tar``, ``*.bin`` by
    name (with a warning where there are several)."""
    path = Path(folder).expanduser()
    for name in LOCAL_WEIGHT_FILES:
        if (path / name).is_file():
            return path / name
    for extension in (".safetensors", ".pth", ".pth.tar", ".bin"):
        files = sorted(p for p in path.glob(f"*{extension}") if p.is_file())
        if len(files) > 1:
            warnings.warn(
                f"{LOCAL_PREFIX}{folder} holds {len(files)} {extension} checkpoints "
                f"({', '.join(p.name for p in files)}); loading {files[0].name}",
                stacklevel=3,
            )
        if files:
            return files[0]
    raise FileNotFoundError(
        f"{LOCAL_PREFIX}{folder}: no weights in the folder ({', '.join(LOCAL_WEIGHT_FILES)}, or any .safetensors, "
        ".pth, .bin file); pass pretrained=False for the described model without them"
    )


def _described(config: dict[str, Any], origin: str, source: dict[str, Any]) -> HubModel:
    """What a ``config.json`` (read from ``origin``) describes; ``source`` is where it came from, as timm's
    pretrained_cfg records it (``hf_hub_id``, ``source``)."""
    # timm's older configs are the pretrained_cfg itself, with the architecture beside it
    pretrained_cfg = config["pretrained_cfg"] if "pretrained_cfg" in config else config
    check_preprocessing(pretrained_cfg, f"{origin}: config.json's")
    model_args = dict(config.get("model_args") or {})
    placed = sorted(set(model_args) & {"device", "dtype", "scriptable", "exportable", "no_jit"})
    if placed:
        raise ValueError(
            f"{origin}: config.json's model_args name {', '.join(placed)}: where and how the model runs is the "
            "caller's choice (pass device=/dtype= to create_model), not a repository's"
        )
    input_size = pretrained_cfg.get("input_size")
    if input_size is not None:  # the size to build for, unless model_args say another
        model_args.setdefault("in_chans", input_size[0])
        model_args.setdefault("img_size", tuple(input_size[1:]))
    overlay = {key: pretrained_cfg[key] for key in _PREPROCESSING if pretrained_cfg.get(key) is not None}
    overlay.pop("input_size", None)  # the model's own, from what it is built for
    overlay |= {key: pretrained_cfg[key] for key in _KEPT if pretrained_cfg.get(key) is not None}
    # where it came from, and no tag unless the description names one (not the default tag's)
    overlay |= {**source, "tag": pretrained_cfg.get("tag")}
    labels = config.get("label_names", pretrained_cfg.get("label_names", pretrained_cfg.get("labels")))
    if labels is not None and not (isinstance(labels, list) and all(isinstance(x, str) for x in labels)):
        raise ValueError(f"{origin}: config.json's label_names is not a list of class names")
    if labels is not None:  # the repository's own class names, not a tag's ImageNet labels
        overlay |= {"label_names": labels, "labels": None}
    descriptions = config.get("label_descriptions", pretrained_cfg.get("label_descriptions"))
    if descriptions is not None and not isinstance(descriptions, dict):
        raise ValueError(f"{origin}: config.json's label_descriptions is not a mapping of class name to description")
    if descriptions is not None:  # top level, as timm writes them, or in pretrained_cfg
        overlay["label_descriptions"] = descriptions
    num_classes = config.get("num_classes", pretrained_cfg.get("num_classes", _DEFAULT_CLASSES))
    if not (isinstance(num_classes, int) and not isinstance(num_classes, bool) and num_classes >= 0):
        raise ValueError(f"{origin}: config.json's num_classes is {num_classes!r}; expected an int >= 0")
    overlay["num_classes"] = num_classes
    name = config["architecture"].partition(".")[0]  # timm reads the architecture without a tag
    try:
        architecture = resolve_name(name)
    except KeyError:
        raise ValueError(
            f"{origin}: its config.json describes {name!r}, which is not a Swin architecture registered here "
            "(swin.list_models() lists them); build it with timm.create_model"
        ) from None
    return HubModel(architecture=architecture, overlay=overlay, model_args=model_args)


def _described_transformers(
    config: dict[str, Any], processor: dict[str, Any] | None, origin: str, source: dict[str, Any]
) -> HubModel:
    """What a transformers Swin ``config.json`` and its image processor describe (see
    :mod:`swin.weights.transformers_config`)."""
    architecture, model_args, overlay = transformers_description(config, processor, origin)
    check_preprocessing(overlay, f"{origin}: {_PROCESSOR}'s")
    try:
        built = get_config(architecture).replace(**model_args)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{origin}: the model its config.json describes cannot be built: {error}") from None
    backbone = overlay.pop("backbone", None)  # the stages a SwinBackbone repository outputs
    # (a backbone runs the detection rules, transformers' SwinBackbone's too: any size is the same there)
    problem = None if backbone else stage_size_problem(built, "transformers")
    if problem:  # transformers' rules there are not the classification rules here
        raise ValueError(
            f"{origin}: {problem}: transformers' model computes other outputs than any model here would; only "
            "repositories whose image_size gives window multiples at every stage are read (microsoft's all do)"
        )
    return HubModel(
        architecture=architecture, overlay=overlay | source | {"tag": None}, model_args=model_args, backbone=backbone
    )


def check_buildable(
    origin: str, registered: SwinConfig, described: dict[str, Any], yours: dict[str, Any]
) -> SwinConfig:
    """``registered`` with the hub description's entries (``described``: its ``model_args`` and head) and the
    caller's overrides (``yours``), checked before the model is built and before any weights are fetched. Where
    the description alone cannot be built, a ValueError naming the repository (``origin``); where only the
    caller's overrides fail, their own error, as without a hub name; a model whose float32 weights exceed the
    checkpoint bound, a ValueError."""
    try:
        config = registered.replace(**{**described, **yours})
    except (TypeError, ValueError) as error:
        try:
            registered.replace(**described)
        except (TypeError, ValueError):
            raise ValueError(
                f"{origin}: the model its config.json describes (model_args, num_classes) cannot be built: {error}"
            ) from None
        raise
    size = 4 * count_parameters(config)
    if size > max_checkpoint_bytes():
        raise ValueError(
            f"{origin}: the model its config.json describes{' with your overrides' if yours else ''} takes "
            f"{format_bytes(size)} in float32, more than the "
            f"{format_bytes(max_checkpoint_bytes())} any checkpoint may take; set {MAX_CHECKPOINT_BYTES_ENV} to "
            "allow it"
        )
    return config


def hub_weights(spec: str) -> Path:
    """The repository's safetensors weights in the hub cache, else, where the repository has none (or, offline,
    the cache holds none), its pickle: timm's order. A safetensors file that exists but could not be had (a
    server error, a cut connection) is an error, not a reason to load other weights."""
    repo_id, revision = _split(spec)
    try:
        return _file(repo_id, _WEIGHTS[0], revision)
    except hub.HubFileMissing as missing:
        try:
            return _file(repo_id, _WEIGHTS[1], revision)
        except DownloadError as error:
            raise DownloadError(f"the repository's weights could not be had: {missing}; {error}") from None
    except DownloadError as error:
        # Unreachable, or a transfer that failed. A pickle in the cache beside no safetensors is what this
        # repository gave when the hub had no safetensors for it: that, with a word.
        cached = hub.hub_file(repo_id, _WEIGHTS[1], revision=revision, local_only=True)
        if cached is not None and hub.hub_file(repo_id, _WEIGHTS[0], revision=revision, local_only=True) is None:
            warnings.warn(
                f"{error}; loading the {_WEIGHTS[1]} cached from an earlier download of {HUB_PREFIX}{spec}",
                stacklevel=3,
            )
            return cached
        raise DownloadError(
            f"{error}; the repository's {_WEIGHTS[1]} was not loaded instead: that is done only where the hub "
            f"answers it has no {_WEIGHTS[0]}. Try again (or check the connection or the mirror in HF_ENDPOINT)"
        ) from None


def _split(spec: str) -> tuple[str, str]:
    """``REPO[@REVISION]`` -> (repo_id, revision), both checked: OWNER/NAME in the hub's characters, and a
    revision that can only name a branch, tag or commit."""
    repo_id, at, revision = spec.partition("@")
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(_hub_name(part) for part in parts):
        raise ValueError(
            f"{HUB_PREFIX}{spec} is not a hub repository; write hf-hub:OWNER/NAME (e.g. hf-hub:timm/NAME), names of "
            "letters, digits, '-', '_' and '.'"
        )
    if at and not revision:
        raise ValueError(f"{HUB_PREFIX}{spec} ends in '@'; write hf-hub:OWNER/NAME or hf-hub:OWNER/NAME@REVISION")
    try:
        return repo_id, hub.check_revision(revision or "main")
    except ValueError as error:
        raise ValueError(f"{HUB_PREFIX}{spec}: {error}") from None


def _hub_name(part: str) -> bool:
    """A hub owner or repository name: letters, digits, '-', '_', '.', not starting or ending in '-' or '.',
    without '--' or '..' (huggingface_hub's own rule), at most 96 characters."""
    return (
        0 < len(part) <= 96
        and all(c.isascii() and (c.isalnum() or c in "-_.") for c in part)
        and not part.startswith(("-", "."))
        and not part.endswith(("-", "."))
        and "--" not in part
        and ".." not in part
    )


def _file(repo_id: str, filename: str, revision: str) -> Path:
    path = hub.hub_file(repo_id, filename, revision=revision)
    if path is None:  # offline: as good as missing here, the file the cache holds is what was had online
        raise hub.HubFileMissing(
            f"{hub.hub_url(repo_id, filename, revision)}: not in the Hugging Face cache and offline (SWIN_OFFLINE or "
            "HF_HUB_OFFLINE); fetch it once online"
        )
    return path


def _read_json(path: Path, origin: str, name: str) -> dict[str, Any]:
    if path.stat().st_size > _MAX_CONFIG_BYTES:
        raise ValueError(f"{origin}: {name} is {path.stat().st_size} bytes, far more than a model's description")
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError) as error:
        raise ValueError(f"{origin}: {name} is not JSON ({error})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{origin}: {name} is not a JSON object")
    return value


def _read_config(path: Path, origin: str) -> dict[str, Any]:
    config = _read_json(path, origin, "config.json")
    if config.get("model_type") in MODEL_TYPES:
        return config
    if not isinstance(config.get("architecture"), str):
        kind = f" (a transformers {config['model_type']!r} model)" if isinstance(config.get("model_type"), str) else ""
        raise ValueError(
            f"{origin}: config.json names no architecture{kind}; expected a timm Swin repository (architecture) or "
            "a transformers one (model_type swin or swinv2)"
        )
    for key in ("pretrained_cfg", "model_args"):
        if key in config and not isinstance(config[key], dict):
            raise ValueError(f"{origin}: config.json's {key} is not a mapping")
    return config
