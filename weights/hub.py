"""Hugging Face hub files, fetched by ``huggingface_hub`` itself rather than by our downloader.

Three reasons: its cache is shared with timm and transformers (a checkpoint timm already downloaded is used
without a single request), it drops the token on redirects to other hosts (the hub sends large files to a
CDN) and it knows the hub's protocol (commit pinning, ETags, Xet storage). ``huggingface_hub`` reads
``HF_ENDPOINT``, ``HF_HUB_OFFLINE`` and ``HF_HUB_CACHE`` once, when it is first imported; they are read here
on every call instead and passed on, so a variable set later (a test, a notebook cell) still counts.
``HF_TOKEN`` likewise; without it ``huggingface_hub`` falls back to the token of ``hf auth login``.

The module imports ``huggingface_hub`` only inside its functions: ``import swin`` stays fast.
"""

from __future__ import annotations

import os
from pathlib import Path

from . import storage
from .download import DownloadError, redact, scrub

__all__ = [
    "DEFAULT_ENDPOINT",
    "HubFileMissing",
    "cache_dir",
    "check_revision",
    "endpoint",
    "forget",
    "hub_file",
    "hub_url",
    "token",
]

DEFAULT_ENDPOINT = "https://huggingface.co"
_REASON_CHARS = 400


def endpoint() -> str:
    """``$HF_ENDPOINT`` (a mirror, or a test server), else the hub itself."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def cache_dir() -> str | None:
    """``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else None (``huggingface_hub``'s default, as timm's)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.path.expanduser(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return os.path.join(os.path.expanduser(os.environ["HF_HOME"]), "hub")
    return None


def token() -> str | None:
    """``$HF_TOKEN`` (or the older ``$HUGGING_FACE_HUB_TOKEN``); None lets ``huggingface_hub`` use a saved login."""
    return os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN") or None


def hub_url(repo_id: str, filename: str, revision: str = "main") -> str:
    """The ``/resolve/`` URL of a hub file under the current endpoint (what messages show)."""
    return f"{endpoint()}/{repo_id}/resolve/{revision}/{filename}"


class HubFileMissing(DownloadError):
    """The hub answered that the repository has no such file (404, or its EntryNotFound), as against a failure to
    get one it has (a server error, a cut connection): where a fallback to another file is right."""


def _missing(error: BaseException | None) -> bool:
    """Whether the hub's answer behind ``error`` (or an error it was raised from) was "no such file"."""
    while error is not None:
        if "EntryNotFound" in type(error).__name__ and "Local" not in type(error).__name__:
            return True
        response = getattr(error, "response", None)
        if getattr(response, "status_code", None) == 404:
            return True
        error = error.__cause__ or error.__context__
    return False


def forget(path: Path) -> None:
    """Remove a file from the hub cache: the snapshot's entry and the blob it links to (a copy where the
    cache has no links), so that the next request downloads it again. Best effort: what cannot be removed
    stays (the caller reports the file's failure either way)."""
    try:
        blob = path.resolve()
        path.unlink(missing_ok=True)
        if blob != path:
            blob.unlink(missing_ok=True)
    except OSError:
        pass


def check_revision(revision: str) -> str:
    """``revision`` if it can only name a branch, tag, commit or ``refs/pr/N``; else a ValueError. The hub cache
    stores a revision's commit under ``refs/<revision>``: ``..`` or an absolute part there would write (and offline,
    read) a file outside the cache."""
    parts = revision.split("/")
    if not revision or any(part in ("", ".", "..") for part in parts) or any(c in revision for c in "\\@:\0"):
        raise ValueError(
            f"revision {revision!r} is not a branch, tag or commit of a hub repository (no empty, '.' or '..' "
            "parts, no backslash, '@' or ':'); write e.g. main, v1.0, refs/pr/3 or a commit hash"
        )
    return revision


class _Silent:
    """A progress bar that shows nothing (``huggingface_hub`` takes any tqdm-like class)."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def __enter__(self) -> _Silent:
        return self

    def __exit__(self, *exc) -> None:
        pass

    def update(self, n: float | None = 1) -> None:
        pass

    def close(self) -> None:
        pass


def _reason(error: BaseException) -> str:
    """One line: the library's message (its errors span several lines), and the error behind it if any."""
    text = " ".join(line.strip() for line in str(error).splitlines() if line.strip()) or type(error).__name__
    text = scrub(text)  # the library quotes the URLs it tried: a CDN's signed one too
    text = text if len(text) <= _REASON_CHARS else text[:_REASON_CHARS] + "..."
    cause = error.__cause__
    return f"{type(error).__name__}: {text}" + (f" (because of {_reason(cause)})" if cause is not None else "")


def hub_file(
    repo_id: str, filename: str, *, revision: str = "main", local_only: bool = False, progress: bool | None = None
) -> Path | None:
    """The path of ``filename`` of ``repo_id`` in the hub cache, downloaded there first if needed.

    With ``local_only`` (or offline mode: ``SWIN_OFFLINE`` / ``HF_HUB_OFFLINE``) the cache is only looked
    up, and None returned when the file is not there. That lookup is ``try_to_load_from_cache``, not
    ``hf_hub_download(local_files_only=True)``: the latter still builds request headers, and building them
    the first time makes ``huggingface_hub`` 2.x fetch a registry from its import-time endpoint - a request
    that offline mode, set after the import, must not make. The file is *not* checked here: see
    ``pretrained.fetch``.

    Raises:
        DownloadError: ``huggingface_hub`` is missing or could not provide the file; the message starts
            with the file's URL and gives its reason.
    """
    url = hub_url(repo_id, filename, check_revision(revision))
    try:
        from huggingface_hub import hf_hub_download, try_to_load_from_cache
    except ImportError:
        raise DownloadError(
            f"{redact(url)}: huggingface_hub is not installed (pip install huggingface_hub; timm installs it)"
        ) from None
    try:
        if local_only or storage.offline():
            found = try_to_load_from_cache(repo_id, filename, cache_dir=cache_dir(), revision=revision)
            return Path(found) if isinstance(found, str) else None  # else not cached (or cached as missing)
        path = hf_hub_download(
            repo_id,
            filename,
            revision=revision,
            endpoint=endpoint(),
            token=token(),
            cache_dir=cache_dir(),
            tqdm_class=_Silent if progress is False else None,
        )
    except Exception as error:  # noqa: BLE001 - any failure of the library means: this source failed, say why
        kind = HubFileMissing if _missing(error) else DownloadError
        raise kind(f"{redact(url)}: {_reason(error)}") from None
    return Path(path)
