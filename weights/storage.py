"""Where downloaded weights live, and whether the network may be used at all.

``$SWIN_HOME`` (default ``$XDG_CACHE_HOME/swin``, i.e. ``~/.cache/swin``) holds
``weights/ARCH.TAG/FILENAME`` for manifest entries and ``urls/HASH/FILENAME`` for checkpoints given by URL.
A file is only ever placed there by an atomic rename after its checks passed (see ``download.py``), so any
file found in the cache is trusted; a user may also put a file there by hand.
"""

from __future__ import annotations

import hashlib
import os
import urllib.parse
from pathlib import Path

__all__ = ["swin_home", "offline", "entry_path", "url_path", "url_filename"]

_TRUE = {"1", "true", "yes", "on"}


def swin_home() -> Path:
    """The cache root: ``$SWIN_HOME``, else ``$XDG_CACHE_HOME/swin``, else ``~/.cache/swin``."""
    if os.environ.get("SWIN_HOME"):
        return Path(os.environ["SWIN_HOME"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return Path(base).expanduser() / "swin"


def offline() -> bool:
    """True when ``SWIN_OFFLINE`` or ``HF_HUB_OFFLINE`` is set to 1/true/yes/on: use the cache or fail at once."""
    return any(os.environ.get(name, "").strip().lower() in _TRUE for name in ("SWIN_OFFLINE", "HF_HUB_OFFLINE"))


def url_filename(url: str) -> str:
    """The last path component of ``url`` (query and fragment ignored)."""
    name = os.path.basename(urllib.parse.urlsplit(url).path)
    if not name or name in (".", ".."):
        raise ValueError(f"cannot tell a file name from the URL {url!r}; it should end in the checkpoint's file name")
    return name


def entry_path(entry_name: str, filename: str) -> Path:
    """Cache path of one source file of a manifest entry (``swin_t.ms_in1k``)."""
    return swin_home() / "weights" / entry_name / filename


def url_path(url: str) -> Path:
    """Cache path of a checkpoint given by URL: a directory per URL, so equal file names never collide."""
    clean = urllib.parse.urlsplit(url)._replace(fragment="").geturl()
    digest = hashlib.sha256(clean.encode()).hexdigest()[:16]
    return swin_home() / "urls" / digest / url_filename(url)
