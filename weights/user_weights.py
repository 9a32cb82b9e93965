"""Weights a user names for a command: a tag, ``ARCH.TAG``, a checkpoint file or a URL, located (fetched if
need be), read safely, converted to our layout and checked; with the head size, the layout the file came in,
and the preprocessing its publisher prescribes. ``swin predict``, ``swin export`` and ``swin validate`` share it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..registry import resolve_name
from . import manifest
from .pretrained import WeightsNotFoundError, read_checked, resolve

__all__ = [
    "LoadedWeights",
    "class_labels",
    "load_weights",
    "locate_weights",
    "preprocessing_for",
    "read_weights",
    "require_file",
]

# timm's ImageNetInfo subset whose class order a head of this many classes follows.
_LABEL_SETS = {1000: "imagenet-1k", 21841: "imagenet-22k"}


@dataclass(frozen=True)
class LoadedWeights:
    """A checkpoint read for a command: converted to our layout and checked (a complete, finite Swin trunk)."""

    state: dict[str, torch.Tensor]
    path: Path
    layout: str  # the layout the file came in (detected from its keys)
    entry: manifest.PretrainedEntry | None  # the manifest entry, when the weights are a pretrained tag

    @property
    def name(self) -> str:
        """What the weights are, as the user knows them: ``swin_t.ms_in1k``, or the file's path."""
        return self.entry.name if self.entry else os.fspath(self.path)

    @property
    def num_classes(self) -> int | None:
        """Rows of the classifier head (None: a backbone checkpoint, nothing to classify with)."""
        head = self.state.get("head.weight")
        return None if head is None else int(head.shape[0])


def require_file(path: str, what: str) -> None:
    if os.path.isdir(path):
        raise IsADirectoryError(f"{what} {path} is a directory; pass a checkpoint file")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{what} {path}: no such file")
    if not os.path.isfile(path):
        raise ValueError(f"{what} {path} is not a regular file (a pipe or device?); pass a checkpoint file")


def locate_weights(
    arch: str, value: str | bool, option: str = "--weights", model_for: Callable | None = None
) -> tuple[Path, manifest.PretrainedEntry | None]:
    """The local file of ``value`` (True: the default tag; a tag, ``ARCH.TAG``, a file or a URL), fetched
    if needed (a tag's download checked against ``model_for(entry)``, see ``pretrained.fetch``), and its
    manifest entry if it is a tag."""
    arch = resolve_name(arch)
    if isinstance(value, str) and not manifest.has_tag(arch, value):
        if os.path.exists(value):
            require_file(value, option)
            return Path(value), None
        try:
            return resolve(arch, value, model_for)
        except WeightsNotFoundError:
            raise
        except FileNotFoundError:
            tags = ", ".join(manifest.tags(arch)) or "none"
            raise FileNotFoundError(
                f"{option} {value}: no such file, and neither a pretrained tag of {arch} ({tags}) nor an http(s) URL"
            ) from None
    return resolve(arch, value, model_for)


def load_weights(
    arch: str, value: str | bool = True, option: str = "--weights", model_for: Callable | None = None
) -> LoadedWeights:
    """Read the weights ``value`` names for the architecture ``arch`` (True: its default tag; a tag,
    ``ARCH.TAG``, a checkpoint file or an http(s) URL), convert them to our layout and check them.

    Raises one-line errors: the file is missing or a directory; unsafe or corrupt
    (:class:`~swin.weights.UnsafeCheckpointError`, :class:`~swin.weights.CorruptCheckpointError`); not a
    complete Swin checkpoint; nothing could be fetched (:class:`~swin.weights.WeightsNotFoundError`).
    """
    return read_weights(*locate_weights(arch, value, option, model_for))


def read_weights(path: Path, entry: manifest.PretrainedEntry | None = None) -> LoadedWeights:
    """The second half of :func:`load_weights`, for a file :func:`locate_weights` found."""
    origin = f"{entry.name} ({path})" if entry else os.fspath(path)
    ours, layout = read_checked(path, origin)
    return LoadedWeights(NamedState(ours, origin), Path(path), layout, entry)


class NamedState(dict):
    """A state dict that knows which file it was read from: ``create_model(pretrained=it)``'s messages name the
    file (a command's ``--weights FILE``) rather than "the state dict given as pretrained=". A plain dict to
    everything else."""

    def __init__(self, state: dict[str, torch.Tensor], origin: str) -> None:
        super().__init__(state)
        self.origin = origin


def preprocessing_for(
    arch: str, entry: manifest.PretrainedEntry | None = None, layout: str | None = None
) -> dict[str, Any] | None:
    """The evaluation preprocessing the weights' publisher prescribes (``data_config`` keys).

    A pretrained tag: its own. A checkpoint file: that of the architecture's manifest entry published in the
    same layout family: torchvision's files are evaluated with torchvision's transforms (resize 232, crop 224
    for swin_t), Microsoft's and timm's (official, timm, and the transformers / mmdet copies of them) with
    crop_pct 0.9, bicubic. None when the architecture has no manifest entry (the caller falls back on the
    model's ``data_config``).
    """
    if entry is not None:
        return entry.data_config()
    torchvision = layout == "torchvision"
    for tag in manifest.tags(arch):  # default first
        candidate = manifest.get_entry(arch, tag)
        if (candidate.sources[0].layout == "torchvision") == torchvision:
            return candidate.data_config()
    return None


def class_labels(num_classes: int, preferred: str | None = None) -> list[str]:
    """Names of a head's classes: ImageNet-1k's for 1000 classes, ImageNet-22k's for 21,841 (or the
    ``preferred`` timm ImageNetInfo subset if its size fits), else ``class N``."""
    from .data_config import class_names

    for subset in (preferred, _LABEL_SETS.get(num_classes)):
        if not subset:
            continue
        try:
            names = class_names({"labels": subset})
        except Exception:  # a label set this timm lacks: numbers, rather than failing the prediction
            names = None
        if names and len(names) == num_classes:
            return names
    return [f"class {i}" for i in range(num_classes)]
