"""Atomic downloads: into a temporary file beside the destination, renamed only after every check passed.

An interrupted, truncated, corrupt or tampered download therefore never leaves a file at the destination
that a later run would trust: the temporary file is removed on any failure (including Ctrl-C).
"""

from __future__ import annotations

import hashlib
import http.client
import os
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

__all__ = ["DownloadError", "download"]

_CHUNK = 1 << 20


class DownloadError(OSError):
    """A download failed or its result did not check out; nothing was left at the destination."""


def _progress(done: int, total: int | None, name: str) -> None:
    if total:
        sys.stderr.write(f"\r{name}: {done / 2**20:.1f} / {total / 2**20:.1f} MiB ({100 * done / total:.0f}%)")
    else:
        sys.stderr.write(f"\r{name}: {done / 2**20:.1f} MiB")
    sys.stderr.flush()


def download(
    url: str,
    dest: str | os.PathLike,
    *,
    sha256: str | None = None,
    sha256_prefix: str | None = None,
    size: int | None = None,
    headers: Mapping[str, str] | None = None,
    check: Callable[[str], object] | None = None,
    progress: bool = False,
    timeout: float = 60.0,
) -> Path:
    """Fetch ``url`` to ``dest`` atomically; return ``dest``.

    Args:
        url: http(s) URL (redirects are followed).
        dest: final path; its directory is created.
        sha256: expected hex digest of the whole file.
        sha256_prefix: expected leading hex digits of the digest (torchvision puts 8 of them in file names).
        size: expected size in bytes; the server's Content-Length is always checked when it sends one.
        headers: extra request headers (an Authorization token for the Hugging Face hub).
        check: called with the temporary file's path before the rename (e.g. a checkpoint format check);
            anything it raises fails the download.
        progress: write a progress line to stderr.
        timeout: seconds to wait on the connection.

    Raises:
        DownloadError: HTTP error, network error, cut-off transfer, wrong size or digest; ``check``'s own
            exception propagates. In every case the temporary file is gone and ``dest`` untouched.
    """
    dest = Path(dest)
    created = [p for p in (dest.parent, *dest.parent.parents) if not p.exists()]
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    done = False
    try:
        digest = hashlib.sha256()
        received = 0
        request = urllib.request.Request(url, headers=dict(headers or {}))
        try:
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(request, timeout=timeout) as response:
                length = response.headers.get("Content-Length")
                expected = int(length) if length and length.isdigit() else None
                while chunk := response.read(_CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    received += len(chunk)
                    if progress:
                        _progress(received, expected, dest.name)
            if progress:
                sys.stderr.write("\n")
        except urllib.error.HTTPError as error:
            raise DownloadError(f"{url}: HTTP {error.code} {error.reason}") from None
        except http.client.IncompleteRead as error:
            got = received + len(error.partial)
            raise DownloadError(f"{url}: the transfer was cut off after {got} bytes") from None
        except (urllib.error.URLError, http.client.HTTPException, OSError) as error:
            reason = getattr(error, "reason", None) or error
            raise DownloadError(f"{url}: {reason}") from None
        if expected is not None and received != expected:
            raise DownloadError(f"{url}: received {received} bytes, the server announced {expected} (cut off?)")
        if size is not None and received != size:
            raise DownloadError(f"{url}: received {received} bytes, the manifest expects {size}")
        hexdigest = digest.hexdigest()
        if sha256 is not None and hexdigest != sha256.lower():
            raise DownloadError(f"{url}: sha256 {hexdigest} does not match the expected {sha256.lower()}")
        if sha256_prefix is not None and not hexdigest.startswith(sha256_prefix.lower()):
            raise DownloadError(
                f"{url}: sha256 {hexdigest} does not start with {sha256_prefix.lower()}, the hash prefix in its name"
            )
        if check is not None:
            check(tmp)
        os.replace(tmp, dest)
        done = True
        return dest
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if not done:  # leave no empty directories behind either
            for directory in created:
                try:
                    directory.rmdir()
                except OSError:  # not empty (another download) or already gone
                    break
