"""``pretrained=`` for ``create_model``: resolve what the user asked for, fetch it, convert, fit and load it.

``pretrained`` is ``True`` (the architecture's default tag), a tag (``"ms_in22k"``) or full name
(``"swin_t.ms_in22k"``) from the manifest, a local file, or an http(s) URL (optionally ending in
``#sha256=<hex>``). Manifest files and URLs are cached under ``$SWIN_HOME`` (see ``storage.py``); with
``SWIN_OFFLINE=1`` or ``HF_HUB_OFFLINE=1`` only the cache is used.
"""

from __future__ import annotations

import os
import re
import sys
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn

from ..registry import resolve_name
from . import manifest, safe_load, storage
from .adapt import fit_state_dict
from .convert import convert, detect_layout, unwrap
from .download import DownloadError, download
from .manifest import PretrainedEntry

__all__ = [
    "WeightsNotFoundError",
    "manifest_entry_for",
    "fetch",
    "fetch_url",
    "resolve",
    "load_checkpoint",
    "load_pretrained",
]


class WeightsNotFoundError(FileNotFoundError):
    """No source could provide the weights (or offline mode and nothing cached); the message says where
    the file may be placed by hand."""


def _progress() -> bool:
    return sys.stderr.isatty()


def _placement(paths: list[Path]) -> str:
    listed = "\n".join(f"  {p}" for p in paths)
    return f"To use a copy obtained by other means, place it (any supported layout) at:\n{listed}"


def fetch(entry: PretrainedEntry, *, progress: bool | None = None) -> Path:
    """The cached file of ``entry``, downloading its sources in order until one checks out.

    Raises:
        WeightsNotFoundError: offline with nothing cached, or every source failed; the message names each
            source with its error and the exact cache paths where a manually obtained file is picked up.
    """
    cached = entry.cached_file()
    if cached is not None:
        return Path(cached)
    paths = [Path(entry.cache_path(s)) for s in entry.sources]
    if storage.offline():
        sources = "\n".join(f"  {s.describe()}" for s in entry.sources)
        raise WeightsNotFoundError(
            f"{entry.name} is not in the cache and offline mode is on (SWIN_OFFLINE / HF_HUB_OFFLINE), so its "
            f"sources were not tried:\n{sources}\n{_placement(paths)}"
        )
    failures = []
    for source, path in zip(entry.sources, paths, strict=True):
        url = source.resolve_url()
        try:
            return download(
                url,
                path,
                sha256=source.sha256,
                sha256_prefix=source.sha256_prefix,
                size=source.size,
                headers=source.headers(),
                check=safe_load.check_file,
                progress=_progress() if progress is None else progress,
            )
        except DownloadError as error:  # its message starts with the URL
            failures.append(f"  {error}")
        except (safe_load.CorruptCheckpointError, safe_load.UnsafeCheckpointError) as error:
            failures.append(f"  {url}: {error}")
    raise WeightsNotFoundError(
        f"could not download {entry.name}; tried every source:\n" + "\n".join(failures) + "\n" + _placement(paths)
    )


def _split_hash(url: str) -> tuple[str, str | None]:
    parts = urllib.parse.urlsplit(url)
    match = re.fullmatch(r"sha256=([0-9a-fA-F]{8,64})", parts.fragment or "")
    return parts._replace(fragment="").geturl(), (match.group(1) if match else None)


def fetch_url(url: str, *, progress: bool | None = None) -> Path:
    """The cached copy of the checkpoint at ``url``, downloaded on first use.

    A ``#sha256=<hex>`` fragment (full digest, or a prefix of at least 8 digits) is checked.
    """
    clean, digest = _split_hash(url)
    path = storage.url_path(clean)
    if path.is_file():
        return path
    if storage.offline():
        raise WeightsNotFoundError(
            f"{clean} is not in the cache and offline mode is on (SWIN_OFFLINE / HF_HUB_OFFLINE).\n"
            + _placement([path])
        )
    full = digest if digest and len(digest) == 64 else None
    prefix = digest if digest and len(digest) < 64 else None
    try:
        return download(
            clean,
            path,
            sha256=full,
            sha256_prefix=prefix,
            check=safe_load.check_file,
            progress=_progress() if progress is None else progress,
        )
    except DownloadError as error:
        raise WeightsNotFoundError(f"could not download {error}\n{_placement([path])}") from None


def _is_url(value: str) -> bool:
    return value.startswith(("http://", "https://"))


def manifest_entry_for(name: str, pretrained: bool | str | os.PathLike) -> PretrainedEntry | None:
    """The manifest entry ``pretrained`` names for the architecture ``name`` (``True``, a tag, or
    ``ARCH.TAG``), or None for a file path or URL. Nothing is fetched."""
    if pretrained is True:
        return manifest.get_entry(name)
    if not isinstance(pretrained, (str, os.PathLike)):
        raise TypeError(
            f"pretrained must be True, a tag, a file path, a URL or a state dict, got {type(pretrained).__name__}"
        )
    value = os.fspath(pretrained)
    if _is_url(value):
        return None
    if manifest.has_tag(name, value):
        return manifest.get_entry(name, value)
    if os.path.isfile(value):
        return None
    if "." in value and "/" not in value and os.sep not in value:
        try:
            entry = manifest.get_entry(value)
        except KeyError:  # not ARCH.TAG either
            entry = None
        if entry is not None:
            if entry.arch != resolve_name(name):
                raise ValueError(
                    f"pretrained={value!r} holds weights for {entry.arch}, but the model is {resolve_name(name)}; "
                    f"use create_model({entry.arch!r}, pretrained={entry.tag!r})"
                )
            return entry
    available = manifest.tags(name)
    known = f"tags of {name}: {', '.join(available)}" if available else f"{name} has no tags in the manifest"
    raise FileNotFoundError(
        f"pretrained={value!r} is neither a pretrained tag ({known}), nor an existing file, nor an http(s) URL"
    )


def resolve(name: str, pretrained: bool | str | os.PathLike) -> tuple[Path, PretrainedEntry | None]:
    """The local file ``pretrained`` designates for the architecture ``name`` (fetched if needed)."""
    entry = manifest_entry_for(name, pretrained)
    if entry is not None:
        return fetch(entry), entry
    value = os.fspath(pretrained)
    return (fetch_url(value) if _is_url(value) else Path(value)), None


def load_checkpoint(path: str | os.PathLike, source: str = "auto") -> dict[str, Any]:
    """Read ``path`` safely (safetensors, or a weights-only pickle) and convert it to our layout."""
    return convert(safe_load.load_file(path), source=source)


def load_pretrained(model: nn.Module, name: str, pretrained: bool | str | os.PathLike | Mapping) -> nn.Module:
    """Load weights into ``model`` (built from the registered ``name``); see the module docstring.

    The checkpoint's layout is detected from its keys; bias tables are resized to the model's windows,
    the patch embedding adapted to its input channels; a classifier of another size and keys the model
    lacks are dropped with a warning. Records what was loaded in ``model.pretrained_cfg``.

    Raises:
        WeightsNotFoundError: nothing could be fetched (the message says where to place the file).
        UnsafeCheckpointError: a pickle that would run code; nothing from it ran.
        CorruptCheckpointError: a truncated or unreadable file.
        ValueError: a checkpoint of another architecture (the message lists the mismatched keys).
    """
    if isinstance(pretrained, Mapping):  # a state dict already in memory
        path, entry, checkpoint = None, None, pretrained
        origin = "the state dict given as pretrained="
    else:
        path, entry = resolve(name, pretrained)
        checkpoint = safe_load.load_file(path)
        origin = f"{entry.name} ({path})" if entry else os.fspath(path)
    state = unwrap(checkpoint)
    fitted = fit_state_dict(convert(state, source="auto"), model, origin=origin)
    model.load_state_dict(fitted, strict=False)
    info: dict[str, Any] = {"file": None if path is None else os.fspath(path), "layout": detect_layout(state)}
    if entry is not None:
        info.update(name=entry.name, tag=entry.tag, **entry.data_config())
    model.pretrained_cfg = info
    return model
