"""Plain-URL downloads: atomic, bounded in time and size, and careful with credentials.

Atomic: the body goes into a temporary ``.part`` file beside the destination, renamed only after every check
passed, so an interrupted, truncated, corrupt or tampered download never leaves a file a later run would
trust. The temporary file is removed on any failure (Ctrl-C included); one left by a killed process is
swept by the next download into the same directory once it has not been written for ``STALE_PART_AGE``
(a day: no live download goes that long without writing, and age works across machines sharing the
directory, where a writer's process id would not).

Bounded: an overall deadline (``timeout=`` or ``$SWIN_DOWNLOAD_TIMEOUT``, default an hour) cuts even a
server that drips a byte at a time, and a size cap (``max_bytes=`` or ``$SWIN_MAX_DOWNLOAD_BYTES``, default
8 GiB) stops an endless body before it fills the disk.

Credentials: redirects are followed here, hop by hop, not by urllib (which resends every header to any
host). The caller's headers and the URL's ``user:password@`` go only to the URL's own origin (scheme, host
and port); an https -> http redirect is refused unless the download started on http; and every message
shows URLs through :func:`redact` (``https://***@host/...``).

Where the download lands is the caller's: a directory that cannot be made, or a local write that fails
(a full disk, a used-up quota, a file-size limit), is a :class:`DestinationError`, never a bad source, so
that a caller trying several sources stops at once instead of downloading each in turn.
"""

from __future__ import annotations

import base64
import errno
import functools
import hashlib
import http.client
import math
import os
import re
import socket
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

from .size_limits import byte_setting

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_TIMEOUT",
    "STALE_PART_AGE",
    "DestinationError",
    "DownloadError",
    "check_digest",
    "download",
    "download_timeout",
    "file_sha256",
    "max_download_bytes",
    "origin",
    "part_name_prefix",
    "redact",
    "redirect_keeps_credentials",
    "strip_userinfo",
    "sweep_stale_parts",
]

DEFAULT_TIMEOUT = 3600.0  # seconds for a whole download
DEFAULT_MAX_BYTES = 8 * 2**30  # larger than any published Swin checkpoint (swin_l 22k: ~0.9 GB)
READ_TIMEOUT = 60.0  # seconds without a byte before a connection counts as dead
STALE_PART_AGE = 24 * 3600.0  # seconds without a write after which a .part file is a dead download's
MAX_REDIRECTS = 10
_CHUNK = 1 << 20
_PART_SUFFIX = ".part"
_NAME_IN_PART = 40  # characters of the file name kept in its .part name: long names still fit the file system
_OPEN_TRIES = 5  # attempts to create a directory and a temporary file in it while others remove it again
_REDIRECT_CODES = {301, 302, 303, 307, 308}
_DEFAULT_PORTS = {"http": 80, "https": 443}
# Query (or fragment) keys whose values are credentials in signed or tokenised URLs; their values are hidden.
_SECRET_KEY = re.compile(r"token|sig|signature|secret|passw|pwd|credential|auth|api[-_]?key|^key$|^pw$", re.IGNORECASE)


class DownloadError(OSError):
    """A download failed or its result did not check out; nothing was left at the destination."""


class DestinationError(DownloadError):
    """The destination cannot be written: its directory cannot be created (a file in the way, no permission,
    a name too long for the file system), or writing the file failed (a full disk, a used-up quota, a
    file-size limit). ``cause`` is the underlying OSError. Nothing was kept at the destination."""

    def __init__(self, message: str, dest: Path, cause: OSError) -> None:
        super().__init__(message)
        self.dest = dest
        self.cause = cause


def _redact_pairs(text: str) -> str:
    pairs = []
    for pair in text.split("&"):
        key, sep, value = pair.partition("=")
        pairs.append(f"{key}=***" if sep and value and _SECRET_KEY.search(urllib.parse.unquote(key)) else pair)
    return "&".join(pairs)


# A URL, or any word with a query string (an error's text may quote a request's path and query without its host).
_URLISH = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+|[^\s'\"<>]*\?[^\s'\"<>]+")


def scrub(text: str) -> str:
    """``text`` (an exception's message) with every URL in it redacted (:func:`redact`), and the token-like values
    of any query string it quotes without a host: what a message or a log may show."""

    def hide(match: re.Match) -> str:
        found = match.group(0)
        if "://" in found:
            return redact(found)
        path, _, query = found.partition("?")
        return f"{path}?{_redact_pairs(query)}"

    return _URLISH.sub(hide, text)


def redact(url: str) -> str:
    """``url`` fit for a message or a log: the whole ``user:password@`` and the values of token- or
    signature-like query parameters replaced by ``***``. The user name goes too: GitHub's documented form
    puts the token there (``https://TOKEN:x-oauth-basic@github.com/...``)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<an unparsable URL>"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    hidden = parts._replace(netloc=netloc, query=_redact_pairs(parts.query), fragment=_redact_pairs(parts.fragment))
    return hidden.geturl()


def strip_userinfo(url: str) -> str:
    """``url`` without its ``user:password@`` part."""
    parts = urllib.parse.urlsplit(url)
    return parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1]).geturl() if "@" in parts.netloc else url


def origin(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of ``url``, the port defaulted by scheme: what must match for credentials to go."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    return scheme, (parts.hostname or "").lower(), port or _DEFAULT_PORTS.get(scheme, 0)


def redirect_keeps_credentials(first: str, current: str, target: str) -> bool:
    """The redirect policy: may the download go from ``current`` to ``target``, and with credentials?

    ``first`` is the URL the download started from. Returns True when ``target`` has the origin of ``first``
    (credentials and the caller's headers are sent), False for any other origin (they are not).

    Raises:
        DownloadError: ``target`` is not http(s), or an https -> http downgrade of a download that started
            on https (its content, and the fact that it is wanted, would go over the network in clear).
    """
    scheme = urllib.parse.urlsplit(target).scheme.lower()
    if scheme not in ("http", "https"):
        raise DownloadError(f"{redact(first)}: redirected to {redact(target)}, which is not an http(s) URL")
    if scheme == "http" and urllib.parse.urlsplit(current).scheme.lower() == "https":
        if urllib.parse.urlsplit(first).scheme.lower() != "http":
            raise DownloadError(
                f"{redact(first)}: refusing the redirect from {redact(current)} to {redact(target)}, a downgrade "
                "from https to plain http; download the file by other means and pass its local path"
            )
    return origin(target) == origin(first)


def _positive(name: str, raw: str, kind: type, example: str) -> float | int:
    try:
        value = kind(raw)
    except (TypeError, ValueError):
        value = None
    if value is None or not (0 < value < math.inf):
        raise ValueError(f"{name}={raw!r} is not a positive {'number' if kind is float else 'whole number'}; {example}")
    return value


def download_timeout(value: float | None = None) -> float:
    """The overall deadline in seconds: ``value``, else ``$SWIN_DOWNLOAD_TIMEOUT``, else an hour."""
    if value is not None:
        return float(_positive("timeout", value, float, "e.g. timeout=600 for ten minutes"))
    raw = os.environ.get("SWIN_DOWNLOAD_TIMEOUT", "").strip()
    if not raw:
        return DEFAULT_TIMEOUT
    return float(_positive("SWIN_DOWNLOAD_TIMEOUT", raw, float, "set it in seconds, e.g. 7200 for two hours"))


def max_download_bytes(value: int | None = None) -> int:
    """The size cap in bytes: ``value``, else ``$SWIN_MAX_DOWNLOAD_BYTES``, else 8 GiB."""
    if value is not None:
        return int(_positive("max_bytes", value, int, "e.g. max_bytes=2**30 for 1 GiB"))
    return byte_setting("SWIN_MAX_DOWNLOAD_BYTES", DEFAULT_MAX_BYTES)  # 4096, 512M, 16G: as the checkpoint bound


def file_sha256(path: str | os.PathLike) -> str:
    """Hex SHA-256 of the file at ``path``."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def check_digest(what: str, hexdigest: str, *, sha256: str | None = None, sha256_prefix: str | None = None) -> None:
    """Raise :class:`DownloadError` (its message starting with ``what``) unless ``hexdigest`` is ``sha256`` and
    starts with ``sha256_prefix``."""
    if sha256 is not None and hexdigest != sha256.lower():
        raise DownloadError(f"{what}: sha256 {hexdigest} does not match the expected {sha256.lower()}")
    if sha256_prefix is not None and not hexdigest.startswith(sha256_prefix.lower()):
        raise DownloadError(
            f"{what}: sha256 {hexdigest} does not start with {sha256_prefix.lower()}, the expected prefix"
        )


@functools.cache
def _umask() -> int:
    """The process's umask, read once (by setting it and setting it back: there is no other way to read it)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def sweep_stale_parts(directory: str | os.PathLike, *, keep: str | os.PathLike | None = None) -> list[Path]:
    """Remove the ``.NAME.*.part`` files of dead downloads in ``directory`` (untouched for ``STALE_PART_AGE``);
    return what was removed. Files a live download is writing are recent and stay."""
    removed = []
    now = time.time()
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        path = Path(directory, name)
        if not (name.startswith(".") and name.endswith(_PART_SUFFIX)) or (keep is not None and path == Path(keep)):
            continue
        try:
            if now - path.lstat().st_mtime > STALE_PART_AGE:
                path.unlink()
                removed.append(path)
        except OSError:  # gone already (another process swept it) or not ours to remove
            continue
    return removed


def part_name_prefix(name: str) -> str:
    """Prefix of the temporary file of a download to ``name`` (the sweep recognises ``.*.part``)."""
    return f".{name[:_NAME_IN_PART]}."


def _unwritable(shown: str, dest: Path, error: OSError) -> DestinationError:
    reason = f"{error.strerror or error}: {error.filename}" if error.filename else str(error.strerror or error)
    return DestinationError(f"{shown}: cannot write {dest} ({reason})", dest, error)


def _remove_empty(directories: list[Path]) -> None:
    for directory in directories:  # deepest first
        try:
            directory.rmdir()
        except OSError:  # not empty (another download) or already gone
            break


def _name_max(directory: Path) -> int:
    try:
        return os.pathconf(directory, "PC_NAME_MAX")
    except (AttributeError, OSError, ValueError):  # no pathconf (Windows) or not answered by this file system
        return 255


def _open_part(dest: Path, shown: str) -> tuple[list[Path], int, str]:
    """Create ``dest``'s directory and a temporary file in it; return (directories created, fd, temp path).

    Another process filling the same cache entry (every rank of a distributed job) removes the directories
    it made when its probe or its download ends, possibly while our ``mkdir`` runs or before our
    ``mkstemp``: both are tried again, the directory made anew (once our file is in it, nobody's cleanup can
    remove it).
    """
    created: set[Path] = set()
    for attempt in range(1, _OPEN_TRIES + 1):
        created |= {p for p in (dest.parent, *dest.parent.parents) if not p.exists()}
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            if len(os.fsencode(dest.name)) > _name_max(dest.parent):  # found now, not after the whole transfer
                raise OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG), os.fspath(dest))
            fd, tmp = tempfile.mkstemp(prefix=part_name_prefix(dest.name), suffix=_PART_SUFFIX, dir=dest.parent)
            break
        except OSError as error:
            # the directory vanished under us: made by another, found by mkdir, gone before mkdir saw it
            # was one (FileExistsError), or gone before mkstemp (FileNotFoundError); a file in the way
            # fails the same way every time, and is reported after the last try
            if isinstance(error, (FileNotFoundError, FileExistsError)) and attempt < _OPEN_TRIES:
                continue
            _remove_empty(_deepest_first(created))
            raise _unwritable(shown, dest, error) from None
    return _deepest_first(created), fd, tmp


def _deepest_first(directories: set[Path]) -> list[Path]:
    return sorted(directories, key=lambda p: len(p.parts), reverse=True)


def probe_destination(dest: Path, shown: str) -> None:
    """Raise :class:`DestinationError` now, before any request, if ``dest`` could not be written (its
    directory made, a file of its name created there); nothing is left behind either way."""
    created, fd, tmp = _open_part(dest, shown)
    os.close(fd)
    os.unlink(tmp)
    _remove_empty(created)


class _Watch:
    """Shuts the download's sockets down when the overall deadline passes: a read blocked in the middle of a
    dripped status line or header returns at once, which a per-read timeout alone never achieves."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.fired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(max(0.0, deadline - time.monotonic()), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def add(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            fired = self.fired
        if fired:
            self._shutdown(sock)

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            sockets = list(self._sockets)
        for sock in sockets:
            self._shutdown(sock)

    @staticmethod
    def _shutdown(sock: socket.socket) -> None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # already closed
            pass

    def stop(self) -> None:
        self._timer.cancel()


class _Watched:
    """A connection whose socket the deadline watch can shut down (mixed into http.client's classes)."""

    def __init__(self, *args, watch: _Watch, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._watch = watch

    def connect(self) -> None:
        super().connect()
        self._watch.add(self.sock)


class _WatchedHTTP(_Watched, http.client.HTTPConnection):
    pass


class _WatchedHTTPS(_Watched, http.client.HTTPSConnection):
    pass


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, watch: _Watch) -> None:
        super().__init__()
        self._watch = watch

    def http_open(self, req):
        return self.do_open(lambda *a, **k: _WatchedHTTP(*a, watch=self._watch, **k), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, watch: _Watch) -> None:
        super().__init__()
        self._watch = watch

    def https_open(self, req):
        return self.do_open(lambda *a, **k: _WatchedHTTPS(*a, watch=self._watch, **k), req, context=self._context)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Hands every redirect back as an HTTPError: ``_open`` follows it itself, deciding each hop's headers."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


def _credentials(url: str, headers: Mapping[str, str] | None) -> dict[str, str]:
    found = dict(headers or {})
    parts = urllib.parse.urlsplit(url)
    if "@" in parts.netloc and not any(k.lower() == "authorization" for k in found):
        user, password = parts.username or "", parts.password or ""
        token = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}".encode()
        found["Authorization"] = "Basic " + base64.b64encode(token).decode()
    return found


def _open(url: str, shown: str, headers: Mapping[str, str] | None, watch: _Watch, read_timeout: float):
    """The response for ``url``, redirects followed under :func:`redirect_keeps_credentials`."""
    opener = urllib.request.build_opener(_NoRedirect, _HTTPHandler(watch), _HTTPSHandler(watch))
    credentials = _credentials(url, headers)
    first = current = strip_userinfo(url)
    if urllib.parse.urlsplit(first).scheme.lower() not in ("http", "https"):
        raise DownloadError(f"{shown}: not an http(s) URL")
    for _ in range(MAX_REDIRECTS + 1):
        send = credentials if origin(current) == origin(first) else {}
        request = urllib.request.Request(current, headers=send)
        try:
            return opener.open(request, timeout=max(0.001, min(read_timeout, watch.remaining())))
        except ValueError as error:  # a URL (or a redirect's Location) no parser takes: this source failed
            raise DownloadError(
                f"{shown}: a malformed location in the request or a redirect ({scrub(str(error))})"
            ) from None
        except urllib.error.HTTPError as error:
            location = error.headers.get("Location") if error.code in _REDIRECT_CODES else None
            error.close()
            if not location:
                where = "" if current == first else f" (redirected to {redact(current)})"
                raise DownloadError(f"{shown}: HTTP {error.code} {error.reason}{where}") from None
            try:
                target = strip_userinfo(urllib.parse.urljoin(current, location))
            except ValueError:  # a Location no URL parser takes ("http://[::1/x"): this source failed
                raise DownloadError(
                    f"{shown}: HTTP {error.code} redirect to a malformed location {redact(location)!r}"
                ) from None
            redirect_keeps_credentials(first, current, target)  # raises for a downgrade
            current = target
    raise DownloadError(f"{shown}: more than {MAX_REDIRECTS} redirects")


def _progress(done: int, total: int | None, name: str) -> None:
    if total:
        sys.stderr.write(f"\r{name}: {done / 2**20:.1f} / {total / 2**20:.1f} MiB ({100 * done / total:.0f}%)")
    else:
        sys.stderr.write(f"\r{name}: {done / 2**20:.1f} MiB")
    sys.stderr.flush()


def _transfer(url, shown, out, dest, headers, *, timeout, max_bytes, read_timeout, progress) -> tuple[str, int]:
    """Write the body of ``url`` to ``out`` (the temporary file of ``dest``); return (sha256 hex, bytes).
    Every failure is a DownloadError: a DestinationError when writing ``out`` failed."""
    digest = hashlib.sha256()
    received = 0
    expected = None
    watch = _Watch(time.monotonic() + timeout)
    limit = f"the limit of {max_bytes} bytes (SWIN_MAX_DOWNLOAD_BYTES or max_bytes=)"
    try:
        with _open(url, shown, headers, watch, read_timeout) as response:
            length = (response.headers.get("Content-Length") or "").strip()
            # ASCII digits only: str.isdigit() accepts "²", which int() refuses; anything else is no length
            expected = int(length) if re.fullmatch(r"[0-9]+", length) else None
            if expected is not None and expected > max_bytes:
                raise DownloadError(f"{shown}: the server announces {expected} bytes, more than {limit}")
            while chunk := response.read1(_CHUNK):
                received += len(chunk)
                if received > max_bytes:
                    raise DownloadError(f"{shown}: stopped after more than {limit}; the body did not end")
                try:
                    out.write(chunk)
                except OSError as error:  # a full disk, a quota, a file-size limit: no source would do better
                    raise _unwritable(shown, dest, error) from None
                digest.update(chunk)
                if progress:
                    _progress(received, expected, dest.name)
                if watch.remaining() <= 0:
                    break
        if watch.fired or watch.remaining() <= 0:
            raise TimeoutError
        if progress:
            sys.stderr.write("\n")
    except DownloadError:
        raise
    except (OSError, http.client.HTTPException) as error:  # URLError and timeouts are OSErrors
        if watch.fired or watch.remaining() <= 0:
            raise DownloadError(
                f"{shown}: not finished after {timeout:g} s ({received} bytes received); that is the overall "
                "deadline (SWIN_DOWNLOAD_TIMEOUT or timeout=), raise it for a slow connection"
            ) from None
        if isinstance(error, http.client.IncompleteRead):
            got = received + len(error.partial)
            raise DownloadError(f"{shown}: the transfer was cut off after {got} bytes") from None
        reason = getattr(error, "reason", None) or error
        if isinstance(reason, TimeoutError):
            reason = f"no data for {min(read_timeout, timeout):g} s"
        raise DownloadError(f"{shown}: {scrub(str(reason))}") from None
    finally:
        watch.stop()
    if expected is not None and received != expected:
        raise DownloadError(f"{shown}: received {received} bytes, the server announced {expected} (cut off?)")
    return digest.hexdigest(), received


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
    timeout: float | None = None,
    max_bytes: int | None = None,
    read_timeout: float = READ_TIMEOUT,
) -> Path:
    """Fetch ``url`` to ``dest`` atomically; return ``dest``.

    Args:
        url: http(s) URL; a ``user:password@`` in it becomes Basic authentication for its own origin only.
        dest: final path; its directory is created (and removed again if the download fails).
        sha256: expected hex digest of the whole file.
        sha256_prefix: expected leading hex digits of the digest (torchvision puts 8 of them in file names).
        size: expected size in bytes; the server's Content-Length is always checked when it sends one.
        headers: extra request headers (credentials): sent to the URL's own origin, never to another.
        check: called with the temporary file's path before the rename (e.g. a checkpoint check);
            anything it raises fails the download.
        progress: write a progress line to stderr.
        timeout: overall deadline in seconds (default ``$SWIN_DOWNLOAD_TIMEOUT``, else an hour).
        max_bytes: size cap (default ``$SWIN_MAX_DOWNLOAD_BYTES``, else 8 GiB).
        read_timeout: seconds without a byte before the connection counts as dead.

    Raises:
        DestinationError: ``dest``'s directory cannot be created or written (then nothing was downloaded),
            or writing the file there failed (a full disk, a quota, a file-size limit).
        DownloadError: HTTP error, network error, refused redirect, deadline, cap, cut-off transfer, wrong
            size or digest; ``check``'s own exception propagates. In every case the temporary file is gone,
            ``dest`` untouched, and directories this call created removed.
        ValueError: a ``timeout`` or ``max_bytes`` (argument or environment variable) that is not positive.
    """
    shown = redact(url)
    timeout = download_timeout(timeout)
    max_bytes = max_download_bytes(max_bytes)
    dest = Path(dest)
    created, fd, tmp = _open_part(dest, shown)
    sweep_stale_parts(dest.parent, keep=tmp)
    done = False
    try:
        try:
            with os.fdopen(fd, "wb") as out:
                hexdigest, received = _transfer(
                    url,
                    shown,
                    out,
                    dest,
                    headers,
                    timeout=timeout,
                    max_bytes=max_bytes,
                    read_timeout=read_timeout,
                    progress=progress,
                )
                out.flush()
                # on disk before it has its name: after a power loss the name holds the whole file or nothing,
                # never zeroed pages that a recorded digest would vouch for
                os.fsync(out.fileno())
        except DownloadError:
            raise
        except OSError as error:  # from flush, fsync or close: the last buffered bytes meet the full disk there
            raise _unwritable(shown, dest, error) from None
        if size is not None and received != size:
            raise DownloadError(f"{shown}: received {received} bytes, the manifest expects {size}")
        check_digest(shown, hexdigest, sha256=sha256, sha256_prefix=sha256_prefix)
        if check is not None:
            check(tmp)
        try:
            os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600: cached files get a new file's mode
            os.replace(tmp, dest)
        except OSError as error:
            raise _unwritable(shown, dest, error) from None
        done = True
        return dest
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if not done:  # leave no empty directories behind either
            _remove_empty(created)
