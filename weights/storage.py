"""Where downloaded weights live, whether the network may be used, and what to say when the cache cannot be used.

``$SWIN_HOME`` (default ``$XDG_CACHE_HOME/swin``, i.e. ``~/.cache/swin``) holds
``weights/ARCH.TAG/FILENAME`` for manifest entries and ``urls/HASH/FILENAME`` for checkpoints given by URL.
A file is only ever placed there by an atomic rename after its checks passed (see ``download.py`` and
``pretrained.check_checkpoint``), so a file found in the cache is trusted (a pinned URL's file is still
re-hashed on every use); a user may also put a file there by hand. A manifest file that came from the
Hugging Face hub stays in the hub's own cache (shared with timm and transformers): ``weights/ARCH.TAG/``
then holds a link to it, made once the file passed the same checks.
"""

from __future__ import annotations

import errno
import hashlib
import os
import urllib.parse
import uuid
from pathlib import Path

from .download import DestinationError, part_name_prefix, redact, strip_userinfo

__all__ = [
    "CacheDirError",
    "cache_dir_error",
    "entry_path",
    "link_verified",
    "offline",
    "swin_home",
    "url_filename",
    "url_path",
]

_TRUE = {"1", "true", "yes", "on"}


class CacheDirError(DestinationError):
    """The weights cache (``$SWIN_HOME``) cannot hold the file: the message says why and what to change."""


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
        raise ValueError(
            f"cannot tell a file name from the URL {redact(url)}; it should end in the checkpoint's file name"
        )
    return name


def entry_path(entry_name: str, filename: str) -> Path:
    """Cache path of one source file of a manifest entry (``swin_t.ms_in1k``).

    The manifest refuses tags and file names that could leave the cache; this checks again, on the names
    as joined, so that no other caller can write outside ``weights/ENTRY/`` either.

    Raises:
        ValueError: ``entry_name`` is not one plain path component, or ``filename`` leads out of the
            entry's directory (an absolute path, ``..``).
    """
    entry_dir = swin_home() / "weights" / entry_name
    path = entry_dir / filename
    inside = os.path.normpath(os.path.abspath(entry_dir))
    resolved = os.path.normpath(os.path.abspath(path))
    single = entry_name not in ("", ".", "..") and os.path.basename(entry_name) == entry_name and "\\" not in entry_name
    if not single or os.path.commonpath([inside, resolved]) != inside or resolved == inside:
        raise ValueError(
            f"manifest entry {entry_name!r} with file {filename!r} would be cached at {resolved}, outside its "
            f"directory {swin_home() / 'weights'}/<entry>/; entry names and file names may not hold '..', "
            "separators in the entry name or absolute paths - rename the entry or the file"
        )
    return path


def url_path(url: str) -> Path:
    """Cache path of a checkpoint given by URL: a directory per URL, so equal file names never collide.

    The fragment (a ``#sha256=`` pin) and any ``user:password@`` are not part of the key: the same file under
    a rotated password, or with a pin added later, is the same cache entry (a pin is checked on every use).
    """
    clean = urllib.parse.urlsplit(strip_userinfo(url))._replace(fragment="").geturl()
    digest = hashlib.sha256(clean.encode()).hexdigest()[:16]
    return swin_home() / "urls" / digest / url_filename(url)


def _where() -> str:
    if os.environ.get("SWIN_HOME"):
        return f"SWIN_HOME={os.environ['SWIN_HOME']}"
    return f"the weights cache {swin_home()} (set SWIN_HOME to put it elsewhere)"


def cache_dir_error(error: DestinationError) -> CacheDirError:
    """``error`` (a download that could not write its destination) told in terms of ``$SWIN_HOME``."""
    cause, dest, home = error.cause, Path(error.dest), swin_home()
    code = getattr(cause, "errno", None)
    if home.exists() and not home.is_dir():
        what = "is a file, not a directory"
        fix = "point SWIN_HOME at a directory (or move the file away)"
    elif code == errno.ENAMETOOLONG:
        shown = dest.name if len(dest.name) <= 40 else dest.name[:40] + "..."
        what = f"cannot hold a file named {shown} ({len(dest.name)} characters): too long for its file system"
        fix = "download the file yourself under a shorter name and pass its local path as pretrained="
    elif code in (errno.EACCES, errno.EPERM, errno.EROFS):
        what = f"is not writable ({cause.strerror}: {cause.filename or dest.parent})"
        fix = "make it writable, or point SWIN_HOME at a writable directory"
    elif code in (errno.ENOTDIR, errno.EEXIST):
        what = f"has a file where a directory is needed ({cause.filename or dest.parent})"
        fix = "remove that file, or point SWIN_HOME at another directory"
    elif code == errno.ENOSPC:
        what = "is on a full disk"
        fix = "free some space, or point SWIN_HOME at a larger disk"
    else:
        what = f"cannot be written ({cause.strerror or cause})"
        fix = "point SWIN_HOME at a writable directory"
    return CacheDirError(f"{_where()} {what}; {fix}. Nothing was downloaded.", dest, cause)


def _missing_dirs(directory: Path) -> list[Path]:
    return [p for p in (directory, *directory.parents) if not p.exists()]


def link_verified(target: str | os.PathLike, link: str | os.PathLike) -> Path:
    """Make ``link`` (a path in the cache) point at ``target``, a file that passed every check; return ``link``.

    A symbolic link (a hard link where those are not allowed), so a hub file is stored once, in the hub's
    cache. If no link can be made (``$SWIN_HOME`` unwritable, ...) ``target`` itself is returned: the file
    is usable, only the cache lookup of the next run goes through the hub's cache again. No directory is
    left behind when nothing could be linked.
    """
    target, link = Path(os.path.realpath(target)), Path(link)
    created = _missing_dirs(link.parent)
    tmp = link.with_name(f"{part_name_prefix(link.name)}{uuid.uuid4().hex[:8]}.part")  # swept if left behind
    try:
        link.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.symlink(target, tmp)
        except (OSError, NotImplementedError):
            os.link(target, tmp)
        os.replace(tmp, link)
        return link
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        for directory in created:
            try:
                directory.rmdir()
            except OSError:
                break
        return target
