"""``pretrained=`` for ``create_model``: resolve what the user asked for, fetch it, check, convert, fit, load.

``pretrained`` is ``True`` (the architecture's default tag), a tag (``"ms_in22k"``) or full name
(``"swin_t.ms_in22k"``) from the manifest, a local file, or an http(s) URL (optionally ending in
``#sha256=<hex>``). Manifest files and URLs are cached under ``$SWIN_HOME`` (see ``storage.py``), hub files in
the Hugging Face cache shared with timm (see ``hub.py``); with ``SWIN_OFFLINE=1`` or ``HF_HUB_OFFLINE=1``
only the caches are used. Nothing is cached before :func:`check_checkpoint` passed: a file that fails is
never kept, so it cannot fail again on every later call, and the next source is tried.
"""

from __future__ import annotations

import errno
import os
import re
import sys
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from torch import nn

from ..registry import resolve_name
from . import cache_lock, checks, hub, manifest, safe_load, storage
from .adapt import fit_state_dict
from .convert import convert, detect_layout, unwrap
from .download import (
    DestinationError,
    DownloadError,
    check_digest,
    download,
    download_timeout,
    file_sha256,
    probe_destination,
    redact,
    sweep_stale_parts,
)
from .manifest import PretrainedEntry, Source

__all__ = [
    "WeightsNotFoundError",
    "check_checkpoint",
    "manifest_entry_for",
    "fetch",
    "fetch_url",
    "resolve",
    "load_checkpoint",
    "load_pretrained",
    "split_pin",
]

# What a checkpoint that fails its checks raises: the source is then reported and the next one tried.
CHECK_ERRORS = (safe_load.CorruptCheckpointError, safe_load.UnsafeCheckpointError)
_PIN = re.compile(r"sha256[=:]([0-9a-f]{8,64})", re.IGNORECASE)
_PIN_FORM = "#sha256=<64 hex digits> (the file's full SHA-256, or a prefix of at least 8 of its digits)"


class WeightsNotFoundError(FileNotFoundError):
    """No source could provide the weights (or offline mode and nothing cached); the message says where
    the file may be placed by hand."""


def _progress() -> bool:
    return sys.stderr.isatty()


def _placement(paths: list[Path]) -> str:
    listed = "\n".join(f"  {p}" for p in dict.fromkeys(paths))  # sources may share a file name
    return f"To use a copy obtained by other means, place it (any supported layout) at:\n{listed}"


def read_checked(path: str | os.PathLike, origin: str | None = None) -> tuple[dict[str, Any], str]:
    """The checkpoint at ``path`` in our layout, and the layout it came in, once it has passed everything a
    file must pass before it is cached or used: it loads completely without running code, converts to a Swin
    state dict, and that is a complete trunk with finite weights (``checks.check_state``).

    Raises:
        UnsafeCheckpointError: a pickle that would run code.
        CorruptCheckpointError: anything else; the message names ``origin`` (default: ``path``).
    """
    origin = origin or os.fspath(path)
    try:
        checkpoint = safe_load.load_file(path)
    except CHECK_ERRORS as error:  # named by the file read: a download's is a temporary one, say what it is of
        if origin == os.fspath(path):
            raise
        raise type(error)(str(error).replace(os.fspath(path), origin)) from None
    try:
        state = unwrap(checkpoint)
        layout = detect_layout(state)
        converted = convert(state, source=layout)
    except (ValueError, TypeError, KeyError, IndexError, RuntimeError) as error:
        raise safe_load.CorruptCheckpointError(f"{origin}: not convertible to a Swin state dict ({error})") from None
    checks.check_state(converted, origin)
    return converted, layout


def check_checkpoint(path: str | os.PathLike, origin: str | None = None) -> None:
    """:func:`read_checked` for its checks only (the download's check before the file is cached)."""
    read_checked(path, origin)


def _failure(shown: str, error: BaseException) -> str:
    """A line of the final report: the source, then why it failed (once, if the message names it already)."""
    text = str(error)
    return f"  {text}" if text.startswith(shown) else f"  {shown}: {text}"


def _checker(origin: str, model: nn.Module | None = None, name: str = ""):
    """The check a download passes before it is cached; given the ``model`` it is fetched for, also that the
    weights load into it (a mirror or a moved revision serving another architecture's weights is never cached)."""
    if model is None:
        return lambda tmp: check_checkpoint(tmp, origin=origin)
    return lambda tmp: _check_fits(read_checked(tmp, origin)[0], model, origin, name)


def _check_fits(state: dict[str, Any], model: nn.Module, origin: str, name: str) -> None:
    """Raise CorruptCheckpointError unless ``state`` loads into ``model`` (:func:`fit_state_dict`'s test)."""
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # what a load would drop or keep is the load's to say
            fit_state_dict(state, model, origin=origin)
    except ValueError as error:
        raise safe_load.CorruptCheckpointError(f"not the weights of {name or 'this model'}: {error}") from None


def _hub_accept(source: Source, found: Path, link: Path, model: nn.Module | None, name: str) -> Path:
    """Check a file of the hub cache as a download would be; on success link it into our cache."""
    shown = f"{redact(source.resolve_url())} (in the Hugging Face cache: {found})"
    try:
        if source.size is not None and found.stat().st_size != source.size:
            raise DownloadError(f"{shown}: {found.stat().st_size} bytes, the manifest expects {source.size}")
        digest = None
        if source.sha256 or source.sha256_prefix:
            digest = file_sha256(found)
            check_digest(shown, digest, sha256=source.sha256, sha256_prefix=source.sha256_prefix)
        _checker(shown, model, name)(found)
    except (DownloadError, *CHECK_ERRORS):
        # Not kept in the shared cache, where the next call (timm's and transformers' too) would take it
        # again without a request: removed, so that the next try downloads it afresh.
        hub.forget(found)
        raise
    linked = storage.link_verified(found, link)
    if digest is not None and linked == link:  # the next use need not hash it again (never in the hub's cache)
        storage.record_digest(linked, digest)
    return linked


def fetch(
    entry: PretrainedEntry,
    *,
    progress: bool | None = None,
    timeout: float | None = None,
    max_bytes: int | None = None,
    model_for: Callable[[PretrainedEntry], nn.Module] | None = None,
) -> Path:
    """The cached file of ``entry`` (one that matches its source's pins: size, sha256), downloading its sources
    in order until one passes every check, replacing a cached file that does not match them: given
    ``model_for`` (``swin.factory.entry_model``: the entry's architecture and head, built on the meta device),
    also that its weights load into that model, so that a source serving another architecture's weights is
    skipped and never cached.

    A hub source already in the Hugging Face cache (timm or transformers downloaded it) is used without any
    request, before anything is downloaded. ``timeout`` and ``max_bytes`` bound each plain-URL download
    (see ``download.download``); hub downloads follow ``huggingface_hub``'s own settings.

    Raises:
        WeightsNotFoundError: offline with nothing cached that matches the manifest, or every source failed;
            the message names each source with its error, a cached file that does not match its pins, and the
            exact cache paths where a manually obtained file is picked up.
        CacheDirError: ``$SWIN_HOME`` cannot be written (a file, read-only, a name too long, a full disk).
    """
    cached = entry.cached_file()
    if cached is not None:
        sweep_stale_parts(Path(cached).parent)  # a killed download's part beside it: no later download sweeps it
        return Path(cached)
    paths = [Path(entry.cache_path(s)) for s in entry.sources]
    model = model_for(entry) if model_for is not None else None
    progress = _progress() if progress is None else progress
    failures: list[str] = []
    done: set[int] = set()  # sources that already failed: not tried twice
    for index, (source, path) in enumerate(zip(entry.sources, paths, strict=True)):
        if source.hf_hub is None:
            continue
        try:
            found = hub.hub_file(source.hf_hub, source.filename, revision=source.revision, local_only=True)
            if found is not None:
                return _hub_accept(source, found, path, model, entry.name)
        except (DownloadError, *CHECK_ERRORS) as error:  # the cached copy failed and is gone: downloaded afresh
            failures.append(_failure(redact(source.resolve_url()), error))
            if storage.offline():
                done.add(index)
    stale = "".join(f"\nThe cached file at {line}; remove it." for line in entry.stale_files())
    home = storage.swin_home()
    if storage.offline() and home.exists() and not home.is_dir():  # no copy can be placed where it would say
        cause = NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(home))
        raise storage.cache_dir_error(DestinationError(str(cause), paths[0], cause)) from None
    if storage.offline():
        sources = "\n".join(f"  {s.describe()}" for s in entry.sources)
        failed = "".join(f"\n{f}" for f in failures)
        raise WeightsNotFoundError(
            f"{entry.name} {'has only a stale file in the cache (below)' if stale else 'is not in the cache'} and "
            "offline mode is on (SWIN_OFFLINE / HF_HUB_OFFLINE), so its "
            f"sources were not tried:\n{sources}{failed}{stale}\n{_placement(paths)}"
        )
    try:  # a $SWIN_HOME that cannot be written is one error before any request (README); a file already in
        # the Hugging Face cache was used above without it (link_verified tolerates an unwritable cache)
        for source, path in zip(entry.sources, paths, strict=True):
            probe_destination(path, redact(source.resolve_url()))
    except DestinationError as error:
        raise storage.cache_dir_error(error) from None
    wait = download_timeout(timeout) * len(entry.sources)  # the holder may try every source, each with a deadline
    try:  # every rank of a distributed job asks at once: one downloads, the others wait and take its file
        with cache_lock.holding(storage.swin_home(), entry.name, entry.name, wait=wait, progress=progress):
            cached = entry.cached_file()
            if cached is not None:
                return Path(cached)
            return _download_first(entry, paths, done, failures, model, progress, timeout, max_bytes, stale)
    except cache_lock.CacheBusy as error:
        raise WeightsNotFoundError(f"{error}\n{_placement(paths)}") from None


def _download_first(
    entry: PretrainedEntry,
    paths: list[Path],
    done: set[int],
    failures: list[str],
    model: nn.Module | None,
    progress: bool,
    timeout: float | None,
    max_bytes: int | None,
    stale: str,
) -> Path:
    """The first of ``entry``'s sources (not in ``done``) that downloads and passes every check, cached."""
    for index, (source, path) in enumerate(zip(entry.sources, paths, strict=True)):
        if index in done:
            continue
        shown = redact(source.resolve_url())
        try:
            if source.hf_hub is not None:
                found = hub.hub_file(source.hf_hub, source.filename, revision=source.revision, progress=progress)
                return _hub_accept(source, found, path, model, entry.name)
            downloaded = download(
                source.url,
                path,
                sha256=source.sha256,
                sha256_prefix=source.sha256_prefix,
                size=source.size,
                check=_checker(shown, model, entry.name),
                progress=progress,
                timeout=timeout,
                max_bytes=max_bytes,
            )
            if source.sha256 is not None:  # verified: not hashed again on use (a prefix pin: on the first use)
                storage.record_digest(downloaded, source.sha256.lower())
            return downloaded
        except DestinationError as error:  # the same for every source: say it once, clearly
            raise storage.cache_dir_error(error) from None
        except (DownloadError, *CHECK_ERRORS) as error:
            failures.append(_failure(shown, error))
    raise WeightsNotFoundError(
        f"could not download {entry.name}; tried every source:\n"
        + "\n".join(failures)
        + f"{stale}\n{_placement(paths)}"
    )


def split_pin(url: str) -> tuple[str, str | None]:
    """``url`` without its fragment, and the hex digest of a ``#sha256=<hex>`` pin (or None without one).

    ``sha256=`` or ``sha256:``, any case, with 8 to 64 hex digits (a prefix, as torchvision's file names
    carry). Any other fragment is an error, never ignored: a mistyped pin must not silently turn into no pin.
    """
    parts = urllib.parse.urlsplit(url)
    clean = parts._replace(fragment="").geturl()
    if not parts.fragment:
        return clean, None
    match = _PIN.fullmatch(parts.fragment)
    if match is None:
        raise ValueError(
            f"{redact(url)}: the URL fragment is not a checksum pin; the only form understood is {_PIN_FORM}"
        )
    return clean, match.group(1).lower()


def fetch_url(
    url: str, *, progress: bool | None = None, timeout: float | None = None, max_bytes: int | None = None
) -> Path:
    """The cached copy of the checkpoint at ``url``, downloaded on first use.

    A ``#sha256=<hex>`` pin (see :func:`split_pin`) is checked on the download and again on every use of the
    cached file: a file cached without a pin, or before the server changed it, is downloaded again when it
    does not match the pin given now (and kept as it was if the new download does not match either).

    Raises:
        ValueError: a malformed pin.
        WeightsNotFoundError: the download failed (or offline and nothing matching is cached).
        CorruptCheckpointError, UnsafeCheckpointError: the file fails its checks; nothing was cached.
        CacheDirError: ``$SWIN_HOME`` cannot be written (read-only, a full disk, ...).
    """
    clean, digest = split_pin(url)
    path = storage.url_path(clean)
    full = digest if digest and len(digest) == 64 else None
    prefix = digest if digest and len(digest) < 64 else None
    stale = ""
    if path.is_file():
        sweep_stale_parts(path.parent)  # a killed download's part beside it: no later download would sweep it
        if digest is None:
            return path
        found = file_sha256(path)
        if found.startswith(digest):
            return path
        stale = f"\nThe cached copy {path} has sha256 {found}, which does not match the pin {digest}."
    if storage.offline():
        raise WeightsNotFoundError(
            f"{redact(clean)} is not in the cache and offline mode is on (SWIN_OFFLINE / HF_HUB_OFFLINE).{stale}\n"
            + _placement([path])
        )
    progress = _progress() if progress is None else progress
    wait = download_timeout(timeout)
    try:  # a $SWIN_HOME that cannot be written is one error before the lock and any request
        probe_destination(path, redact(clean))
        # every rank of a distributed job asks at once: one downloads, the others wait and take its file
        with cache_lock.holding(storage.swin_home(), str(path), redact(clean), wait=wait, progress=progress):
            if path.is_file() and (digest is None or file_sha256(path).startswith(digest)):
                return path  # another process downloaded it while this one waited
            return download(
                clean,
                path,
                sha256=full,
                sha256_prefix=prefix,
                check=_checker(redact(clean)),
                progress=progress,
                timeout=timeout,
                max_bytes=max_bytes,
            )
    except DestinationError as error:
        raise storage.cache_dir_error(error) from None
    except DownloadError as error:
        raise WeightsNotFoundError(f"could not download {error}{stale}\n{_placement([path])}") from None


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


def resolve(
    name: str,
    pretrained: bool | str | os.PathLike,
    model_for: Callable[[PretrainedEntry], nn.Module] | None = None,
) -> tuple[Path, PretrainedEntry | None]:
    """The local file ``pretrained`` designates for the architecture ``name`` (fetched if needed; a manifest
    entry's download checked against ``model_for(entry)`` when given, see :func:`fetch`)."""
    entry = manifest_entry_for(name, pretrained)
    if entry is not None:
        return fetch(entry, model_for=model_for), entry
    value = os.fspath(pretrained)
    return (fetch_url(value) if _is_url(value) else Path(value)), None


def load_checkpoint(path: str | os.PathLike, source: str = "auto") -> dict[str, Any]:
    """Read ``path`` safely (safetensors, or a weights-only pickle) and convert it to our layout."""
    return convert(safe_load.load_file(path), source=source)


def load_pretrained(
    model: nn.Module,
    name: str,
    pretrained: bool | str | os.PathLike | Mapping,
    model_for: Callable[[PretrainedEntry], nn.Module] | None = None,
    whole: bool = False,
) -> nn.Module:
    """Load weights into ``model`` (built from the registered ``name``); see the module docstring.
    ``model_for``: builds the model a manifest tag's weights are of (:func:`fetch`), which a download must load
    into before it is cached. ``whole``: the checkpoint must be the model's, every key
    loaded (``create_model``'s ``checkpoint_path=``; see :func:`~.adapt.fit_state_dict`).

    The checkpoint's layout is detected from its keys; bias tables are resized to the model's windows,
    the patch embedding adapted to its input channels; a classifier of another size and keys the model
    lacks are dropped with a warning. Records what was loaded in ``model.pretrained_cfg``.

    Raises:
        WeightsNotFoundError: nothing could be fetched (the message says where to place the file).
        UnsafeCheckpointError: a pickle that would run code; nothing from it ran.
        CorruptCheckpointError: a truncated or unreadable file, an incomplete Swin trunk, or NaN or infinity
            in the weights (the message names the tensors).
        ValueError: a checkpoint of another architecture (the message lists the mismatched keys); with
            ``whole``, a classifier that is not the model's (the message names both) or a key missing on either side.
    """
    if isinstance(pretrained, Mapping):  # a state dict already in memory
        path, entry, checkpoint = None, None, pretrained
        origin = getattr(pretrained, "origin", None) or "the state dict given as pretrained="
    else:
        path, entry = resolve(name, pretrained, model_for)
        checkpoint = safe_load.load_file(path)
        origin = f"{entry.name} ({path})" if entry else os.fspath(path)
    state = unwrap(checkpoint)
    converted = convert(state, source="auto")
    # first: its errors name a prefix in the way
    fitted = fit_state_dict(converted, model, origin=origin, whole=whole)
    checks.check_state(converted, origin)  # as a download is checked: a complete trunk, finite weights
    model.load_state_dict(fitted, strict=False)
    info: dict[str, Any] = {"file": None if path is None else os.fspath(path), "layout": detect_layout(state)}
    from .data_config import described_weights, record_loaded  # not the pretrained_cfg setter: the user's values

    if entry is not None:
        info.update(name=entry.name, tag=entry.tag, **entry.provenance(), **entry.data_config())
    else:  # a file for a model built as ARCH.TAG (checkpoint_path=, as timm): the tag's preprocessing stays
        info = {**described_weights(model), **info}
    record_loaded(model, info)
    return model
