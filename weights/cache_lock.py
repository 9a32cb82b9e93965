"""One download per cache entry at a time, across processes.

Every rank of a distributed job asks for the same checkpoint at the same moment. Each download is atomic, so
without a lock the cache still ends up right, but every rank fetches the whole file: eight ranks, eight
times the traffic and the wait. With it, the first process takes the entry's lock and downloads; the others
wait for it and then find the file in the cache. The lock is the operating system's (``filelock``, which
torch and huggingface_hub already depend on): the kernel releases it when its holder dies, so a killed
download never blocks the next one. Lock files live in ``$SWIN_HOME/.locks``, never among the cached files.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .download import DownloadError

__all__ = ["CacheBusy", "holding", "lock_path"]


class CacheBusy(DownloadError):
    """Another process held the entry's lock for longer than the download deadline."""


def lock_path(home: Path, key: str) -> Path:
    """The lock file of cache entry ``key`` (a cache path or an entry name) under ``home``."""
    return home / ".locks" / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".lock")


@contextmanager
def holding(home: Path, key: str, shown: str, *, wait: float, progress: bool) -> Iterator[None]:
    """Hold the lock of ``key`` while the body runs; wait up to ``wait`` seconds for another process to
    release it (saying so on stderr when ``progress``).

    A cache where no lock file can be made (read-only, full) runs the body unlocked: the lock only saves
    traffic, the atomic download keeps the cache right without it.

    Raises:
        CacheBusy: the lock was still held after ``wait`` seconds.
    """
    from filelock import FileLock, Timeout

    path = lock_path(home, key)
    lock = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(path))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            if progress:
                sys.stderr.write(f"{shown}: another process is downloading it; waiting for it to finish\n")
            lock.acquire(timeout=wait)
    except Timeout:
        raise CacheBusy(
            f"{shown}: another process has been downloading it for over {wait:g} s (its lock: {path}). To wait "
            "longer, raise SWIN_DOWNLOAD_TIMEOUT; if no process is downloading it (a network file system can "
            "keep a dead process's lock), remove the lock file"
        ) from None
    except OSError:  # no lock file can be made here: unlocked
        lock = None
    try:
        yield
    finally:
        if lock is not None:
            lock.release()
