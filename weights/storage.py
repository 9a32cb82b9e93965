"""Where downloaded weights live, whether the network may be used, and what to say when the cache cannot be used.

``$SWIN_HOME`` (default ``$XDG_CACHE_HOME/swin``, i.e. ``~/.cache/swin``) holds
``weights/ARCH.TAG/FILENAME`` for manifest entries and ``urls/HASH/FILENAME`` for checkpoints given by URL.
A file is only ever placed there by an atomic rename after its checks passed (see ``download.py`` and
``pretrained.check_checkpoint``); a user may also put a file there by hand. A manifest file that came from
the Hugging Face hub stays in the hub's own cache (shared with timm and transformers): ``weights/ARCH.TAG/``
then holds a link to it, made once the file passed the same checks.

A cached file is served only while it matches what its source pins now (:func:`pin_mismatch`): an entry
registered again with another file under the same name must not be answered with the old one (a pinned
URL's file is likewise re-hashed on every use). Hashing a checkpoint on every load would cost seconds, so
the digest of a manifest file is recorded beside it, in ``.FILENAME.sha256``, when it is first known (a
verified download or hub file, or the first hash of a file put there by hand), and trusted while the file
keeps the size, modification time and inode it was recorded for: a download replaces the file (a new
inode), an edit changes its time. A record is neither a checkpoint nor a ``.part`` file of a download.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import tempfile
import urllib.parse
import uuid
from pathlib import Path

from .download import DestinationError, file_sha256, part_name_prefix, redact, strip_userinfo

__all__ = [
    "CacheDirError",
    "cache_dir_error",
    "digest_record",
    "entry_path",
    "file_digest",
    "link_verified",
    "offline",
    "pin_mismatch",
    "record_digest",
    "swin_home",
    "url_filename",
    "url_path",
]

_TRUE = {"1", "true", "yes", "on"}
# A write that fails for want of room, whatever limit it met: the disk, the user's quota, a file-size limit
# (``ulimit -f``, or the file system's own). Each is the cache's problem, never the source's.
_ROOM = "free some space, or point SWIN_HOME at a larger disk"
_NO_ROOM = {
    errno.ENOSPC: ("is on a full disk", _ROOM),
    errno.EFBIG: (
        "has no room for a file this large (a file-size limit: ulimit -f, or the file system's)",
        "raise the limit, or point SWIN_HOME at a disk that takes larger files",
    ),
}
if hasattr(errno, "EDQUOT"):  # not on Windows
    _NO_ROOM[errno.EDQUOT] = ("is on a full disk (the disk quota is used up)", _ROOM)


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
    elif code in _NO_ROOM:
        what, fix = _NO_ROOM[code]
    else:
        what = f"cannot be written ({cause.strerror or cause})"
        fix = "point SWIN_HOME at a writable directory"
    return CacheDirError(f"{_where()} {what}; {fix}. Nothing was kept.", dest, cause)


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


def digest_record(path: str | os.PathLike) -> Path:
    """Where the digest of the cached file at ``path`` is recorded: ``.FILENAME.sha256`` beside it."""
    path = Path(path)
    return path.with_name(f".{path.name}.sha256")


def record_digest(path: str | os.PathLike, hexdigest: str, stat: os.stat_result | None = None) -> None:
    """Record that the file at ``path`` has the SHA-256 ``hexdigest`` while it is as ``stat`` (default: as it
    is now) describes it. Best effort: where no record can be written, the file is hashed on each use."""
    record = digest_record(path)
    tmp = None
    try:
        stat = stat or os.stat(path)
        fields = {"sha256": hexdigest, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "ino": stat.st_ino}
        fd, tmp = tempfile.mkstemp(prefix=part_name_prefix(record.name), suffix=".part", dir=record.parent)
        try:
            os.write(fd, json.dumps(fields).encode())
        finally:
            os.close(fd)
        os.replace(tmp, record)  # a reader sees the old record or the new one, never half of one
    except OSError:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def _recorded(path: str | os.PathLike, stat: os.stat_result) -> str | None:
    """The recorded digest of ``path``, if there is one and the file is still the one it was recorded for."""
    try:
        with open(digest_record(path), "rb") as handle:
            fields = json.loads(handle.read(1024))
        same = [fields["size"], fields["mtime_ns"], fields["ino"]] == [stat.st_size, stat.st_mtime_ns, stat.st_ino]
        digest = fields["sha256"]
    except (OSError, ValueError, TypeError, KeyError):  # none, unreadable, or not a record
        return None
    return digest if same and isinstance(digest, str) else None


def file_digest(path: str | os.PathLike) -> str:
    """The SHA-256 of the cached file at ``path``: its record's while the file is unchanged, else hashed now
    (and recorded, for the next time)."""
    stat = os.stat(path)  # before hashing: a file changed meanwhile no longer matches what is recorded
    digest = _recorded(path, stat)
    if digest is None:
        digest = file_sha256(path)
        record_digest(path, digest, stat)
    return digest


def pin_mismatch(
    path: str | os.PathLike, *, sha256: str | None = None, sha256_prefix: str | None = None, size: int | None = None
) -> str | None:
    """None if the cached file at ``path`` matches the pins given, else which one it does not match and how,
    for a message that continues "does not match the manifest's ...". The size is checked first (a stat)."""
    try:
        held = os.stat(path).st_size
        if size is not None and held != size:
            return f"size (the file holds {held} bytes, the manifest {size})"
        if sha256 is None and sha256_prefix is None:
            return None
        digest = file_digest(path)
    except OSError as error:
        return f"pins (the file cannot be read: {error.strerror or error})"
    if sha256 is not None and digest != sha256.lower():
        return f"sha256 (the file's is {digest}, the manifest's {sha256.lower()})"
    if sha256_prefix is not None and not digest.startswith(sha256_prefix.lower()):
        return f"sha256 prefix (the file's sha256 is {digest}, the manifest's prefix {sha256_prefix.lower()})"
    return None
