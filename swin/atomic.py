"""Atomic output files: a command's output appears complete or not at all, and never lands anywhere but a
regular file at the name given.

Writing straight to the output name goes wrong in ways that cost data: a crash or Ctrl-C leaves a truncated
file that looks like a checkpoint; truncating the output while the input is still memory-mapped from the
same file destroys the input (and the reader dies of SIGBUS); opening a symlink, FIFO or device for writing
writes through it (``swin convert in.pth /dev/full`` as root replaced the device node). So outputs are
checked first (:func:`check_output`, cheap, before any slow work) and then written to a temporary file in
the target's folder, flushed to disk and renamed over the target in one step (:func:`atomic_output`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterable, Iterator

__all__ = ["UnsafeOutputError", "check_output", "atomic_output"]

# File kinds an output name must not be, with how to say it.
_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


class UnsafeOutputError(ValueError):
    """The output name is not somewhere a command may write a file; the message says why and what to do."""


def _refuse_special(path: str) -> os.stat_result | None:
    """The ``lstat`` of ``path`` (None if absent); raise if it is anything but a regular file."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    for test, kind in _KINDS:
        if test(info.st_mode):
            target = f" (to {os.readlink(path)})" if stat.S_ISLNK(info.st_mode) else ""
            raise UnsafeOutputError(
                f"output {path} is {kind}{target}, not a regular file; outputs are written as new regular files "
                "and never through links or into special files - remove it or choose another output name"
            )
    return info


def check_output(path: str | os.PathLike, inputs: Iterable[str | os.PathLike] = ()) -> None:
    """Refuse, before any slow work, an output the command must not or cannot write.

    Raises:
        UnsafeOutputError: ``path`` is a symlink, directory, FIFO, socket or device, or is one of ``inputs``
            (the same name after resolving links, or the same file through a hard link).
        FileNotFoundError: its folder does not exist.
        NotADirectoryError: a part of its folder's path is a file.
        PermissionError: its folder is not writable, or it is an existing read-only file.
    """
    path = os.fspath(path)
    if not os.path.basename(path):
        raise UnsafeOutputError(f"output {path!r} names a folder, not a file; add a file name")
    parent = os.path.dirname(os.path.abspath(path))
    while parent and not os.path.exists(parent) and os.path.dirname(parent) != parent:
        parent = os.path.dirname(parent)  # the deepest part of the path that exists
    if os.path.exists(parent) and not os.path.isdir(parent):
        raise NotADirectoryError(f"output {path}: {parent} is a file, not a folder; choose another output path")
    existing = _refuse_special(path)
    for source in map(os.fspath, inputs):
        same = os.path.realpath(source) == os.path.realpath(path)
        if not same and existing is not None and os.path.exists(source):
            same = os.path.samefile(source, path)
        if same:
            raise UnsafeOutputError(
                f"output {path} would overwrite the input while reading it ({source}); choose another output name"
            )
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"output folder {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PermissionError(f"output folder {folder} is not writable")
    if existing is not None and not os.access(path, os.W_OK):
        raise PermissionError(f"output {path} exists and is read-only; remove it or choose another output name")


def _temporary(folder: str, name: str) -> tuple[str, int]:
    """Create an empty temporary file beside the target, named after it (same extension: some writers check
    it); return it with the mode a new file gets (0666 less the umask, as ``open(path, "w")``)."""
    stem, extension = os.path.splitext(name)
    for _ in range(100):
        candidate = os.path.join(folder, f".{stem}.{secrets.token_hex(4)}.partial{extension}")
        try:
            fd = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        try:
            return candidate, stat.S_IMODE(os.fstat(fd).st_mode)
        finally:
            os.close(fd)
    raise FileExistsError(f"could not create a temporary file for {name} in {folder}")


def _fsync(path: str, directory: bool = False) -> None:
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        if directory:  # some systems cannot open a folder; the rename is still atomic, only less durable
            return
        raise
    try:
        os.fsync(fd)
    except OSError:
        if not directory:
            raise
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, inputs: Iterable[str | os.PathLike] = ()) -> Iterator[str]:
    """Yield a temporary path to write the output to; on success it replaces ``path`` in one rename.

    The temporary file lies in the target's folder (a rename never crosses file systems), is flushed to
    disk before the rename, and is removed on any failure, Ctrl-C included: ``path`` then keeps what it had.
    The result has the mode of the file it replaces, else that of a new file (0666 less the umask), not the
    0600 of ``mkstemp`` or of writers that make their own temporary file.
    ``path`` is checked (:func:`check_output`) on entry and checked again just before the rename.

    >>> with atomic_output("model.safetensors", inputs=["model.pth"]) as temporary:
    ...     save_file(tensors, temporary)
    """
    path = os.fspath(path)
    inputs = [os.fspath(p) for p in inputs]
    check_output(path, inputs)
    folder, name = os.path.split(os.path.abspath(path))
    temporary, mode = _temporary(folder, name)
    try:
        yield temporary
        existing = _refuse_special(path)  # it may have changed kind while the output was being written
        # Writers that replace the file they are given (safetensors writes its own 0600 file) lose the mode.
        os.chmod(temporary, stat.S_IMODE(existing.st_mode) if existing is not None else mode)
        _fsync(temporary)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    _fsync(folder, directory=True)
