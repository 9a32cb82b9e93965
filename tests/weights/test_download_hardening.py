"""Plain-URL downloads under hostile or broken conditions, against loopback servers, each bounded (a deadline,
a size cap).

Credentials never reach another origin, a dripping or endless server is cut off by the deadline or the size
cap, dead ``.part`` files are swept, passwords never appear in messages, an unusable ``$SWIN_HOME`` is one
clear error, pins are strict and re-checked, and a file that does not load as a Swin trunk is never cached.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import os
import select
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch

from swin.weights import storage
from swin.weights.download import (
    DestinationError,
    DownloadError,
    download,
    download_timeout,
    max_download_bytes,
    probe_destination,
    redact,
    redirect_keeps_credentials,
    sweep_stale_parts,
)
from swin.weights.pretrained import WeightsNotFoundError, fetch, fetch_url, resolve, split_pin
from swin.weights.safe_load import CorruptCheckpointError
from swin.weights.storage import CacheDirError
from tests.weights.conftest import cache_files, hub_headers, safetensors_bytes, tiny_swin_state, torch_bytes

SECRET_HEADERS = {"Authorization": "Bearer t0ken", "Cookie": "session=abc", "X-Api-Key": "k3y"}


@pytest.fixture(scope="module")
def swin_body() -> bytes:
    return safetensors_bytes(tiny_swin_state())


# -- credentials and redirects ------------------------------------------------------------------------------


def test_cross_origin_redirect_drops_every_credential(server, other_server, tmp_path):
    """Another port is another origin (a CDN, a foreign host): no Authorization, Cookie or custom header."""
    other_server.serve("/b/file.bin", b"payload")
    url = server.serve("/a/file.bin", status=302, location=other_server.url("/b/file.bin"))
    path = download(url, tmp_path / "file.bin", headers=SECRET_HEADERS)
    assert path.read_bytes() == b"payload"
    (first,) = server.log
    assert all(first.headers[name.lower()] == value for name, value in SECRET_HEADERS.items())
    (second,) = other_server.log
    assert second.path == "/b/file.bin"
    assert not any(second.has(name) for name in SECRET_HEADERS)


def test_url_password_is_basic_auth_for_its_own_origin_only(server, other_server, tmp_path):
    other_server.serve("/b/file.bin", b"payload")
    server.serve("/a/file.bin", status=307, location=other_server.url("/b/file.bin"))
    url = f"http://user:s3cret@127.0.0.1:{server.port}/a/file.bin"
    download(url, tmp_path / "file.bin")
    expected = "Basic " + base64.b64encode(b"user:s3cret").decode()
    assert server.log[0].headers["authorization"] == expected
    assert not other_server.log[0].has("Authorization")


def test_same_origin_redirect_keeps_credentials(server, tmp_path):
    """As huggingface_hub does on the hub: a move within the same origin is the same server's own answer."""
    server.serve("/b/file.bin", b"payload")
    url = server.serve("/a/file.bin", status=301, location="/b/file.bin")
    download(url, tmp_path / "file.bin", headers=SECRET_HEADERS)
    assert [r.path for r in server.log] == ["/a/file.bin", "/b/file.bin"]
    assert all(r.headers["authorization"] == "Bearer t0ken" for r in server.log)


def test_redirect_policy():
    """https -> http cannot be served from loopback without TLS: the policy function itself."""
    assert redirect_keeps_credentials("https://h/x", "https://h/x", "https://h/y") is True
    assert redirect_keeps_credentials("https://h/x", "https://h/x", "https://H:443/y") is True
    assert redirect_keeps_credentials("https://h/x", "https://h/x", "https://h:8443/y") is False  # another port
    assert redirect_keeps_credentials("https://h/x", "https://h/x", "https://cdn.h/y") is False  # another host
    assert redirect_keeps_credentials("http://h/x", "http://h/x", "https://h/y") is False  # another scheme
    with pytest.raises(DownloadError, match="downgrade from https to plain http"):
        redirect_keeps_credentials("https://h/x", "https://h/x", "http://h/y")
    with pytest.raises(DownloadError, match="downgrade"):  # even to another host
        redirect_keeps_credentials("https://user:pw@h/x", "https://h/x", "http://other/y")
    # a download that started on plain http may come back to it (it was never protected)
    assert redirect_keeps_credentials("http://h/x", "https://h/y", "http://h/z") is True
    with pytest.raises(DownloadError, match="not an http"):
        redirect_keeps_credentials("https://h/x", "https://h/x", "file:///etc/passwd")


def test_redirect_to_another_scheme_is_refused(server, tmp_path):
    url = server.serve("/a/file.bin", status=302, location="file:///etc/passwd")
    with pytest.raises(DownloadError, match="not an http"):
        download(url, tmp_path / "dl" / "file.bin")
    assert not (tmp_path / "dl").exists()


def test_redirect_loop_ends(server, tmp_path):
    url = server.serve("/loop", status=302, location="/loop")
    with pytest.raises(DownloadError, match="more than 10 redirects"):
        download(url, tmp_path / "file.bin")


# -- deadline and size cap ----------------------------------------------------------------------------------


class DrippingServer:
    """Serves one response on 127.0.0.1, its first ``at_once`` bytes at once and then one byte every ``drip``
    seconds, and records what the client did: ``sent`` (bytes that left before it hung up) and ``hung_up``
    (it closed the connection before the response ended)."""

    def __init__(self, response: bytes, drip: float, at_once: int = 0) -> None:
        self.response, self.drip, self.at_once = response, drip, at_once
        self.sent = 0
        self.hung_up = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(60)  # no client at all: the thread ends, the test fails on hung_up
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}/drip/model.pth"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with self._listener, self._listener.accept()[0] as connection:
            connection.recv(65536)  # the request
            connection.sendall(self.response[: self.at_once])
            self.sent = self.at_once
            for index in range(self.at_once, len(self.response)):
                # the drip's pause doubles as a watch for the client's end of the connection (EOF or reset)
                if select.select([connection], [], [], self.drip)[0] and not self._alive(connection):
                    break
                try:
                    connection.sendall(self.response[index : index + 1])
                except OSError:
                    break
                self.sent += 1
            else:
                return
            self.hung_up.set()

    @staticmethod
    def _alive(connection: socket.socket) -> bool:
        try:
            return connection.recv(1) != b""
        except OSError:
            return False


def dripping(drip_headers: bool) -> tuple[DrippingServer, int]:
    """A 2000-byte file, dripped at a pace no 1 s deadline can wait out: from the status line on (headers and
    body at 0.05 s a byte, 100 s), or after the status line and headers (the body at 0.005 s a byte, 10 s).
    Returns the server and the length of the status line and headers."""
    body = b"x" * 2000
    head = f"HTTP/1.0 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    if drip_headers:
        return DrippingServer(head + body, drip=0.05), len(head)
    return DrippingServer(head + body, drip=0.005, at_once=len(head)), len(head)


def assert_cut_off(server: DrippingServer, head: int, drip_headers: bool) -> None:
    """The download ended the transfer itself, within the headers or the body as dripped: the server saw the
    client hang up, and not all of the response had left (a download that waited for the whole response
    and only then compared the clock with its deadline would have read every byte)."""
    assert server.hung_up.wait(60), "the client never hung up"
    assert server.sent < (head if drip_headers else len(server.response)), f"{server.sent} bytes sent"
    assert server.sent >= (0 if drip_headers else head)


@pytest.mark.parametrize("drip_headers", [True, False], ids=["headers", "body"])
def test_dripping_server_hits_the_deadline(tmp_path, drip_headers):
    """One byte at a time: within the status line and headers or within the body."""
    server, head = dripping(drip_headers)
    with pytest.raises(DownloadError, match=r"not finished after 1 s .*SWIN_DOWNLOAD_TIMEOUT"):
        download(server.url, tmp_path / "dl" / "file.bin", timeout=1)
    assert_cut_off(server, head, drip_headers)
    assert not (tmp_path / "dl").exists()


def test_deadline_from_the_environment(monkeypatch, swin_home):
    server, head = dripping(drip_headers=False)
    monkeypatch.setenv("SWIN_DOWNLOAD_TIMEOUT", "1")
    with pytest.raises(WeightsNotFoundError, match="not finished after 1 s"):
        fetch_url(server.url, progress=False)
    assert_cut_off(server, head, drip_headers=False)
    assert cache_files(swin_home) == []


def test_endless_body_hits_the_cap(server, tmp_path):
    url = server.serve("/endless/file.bin", endless=True)
    with pytest.raises(DownloadError, match=r"stopped after more than the limit of 1000000 bytes .*did not end"):
        download(url, tmp_path / "dl" / "file.bin", max_bytes=1_000_000)
    assert not (tmp_path / "dl").exists()


def test_cap_from_the_environment_and_announced_size(server, monkeypatch, swin_home):
    url = server.serve("/big/model.pth", b"x" * 5000)
    monkeypatch.setenv("SWIN_MAX_DOWNLOAD_BYTES", "4096")
    with pytest.raises(WeightsNotFoundError, match="announces 5000 bytes, more than the limit of 4096"):
        fetch_url(url, progress=False)
    assert cache_files(swin_home) == []


@pytest.mark.parametrize(
    ("variable", "value"),
    [("SWIN_DOWNLOAD_TIMEOUT", "soon"), ("SWIN_DOWNLOAD_TIMEOUT", "-5"), ("SWIN_DOWNLOAD_TIMEOUT", "nan")]
    + [("SWIN_MAX_DOWNLOAD_BYTES", "lots"), ("SWIN_MAX_DOWNLOAD_BYTES", "0"), ("SWIN_MAX_DOWNLOAD_BYTES", "1.5")],
)
def test_bad_limit_in_the_environment(server, monkeypatch, variable, value):
    url = server.serve("/x/model.pth", b"x")
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=f"{variable}='{value}' is not a (positive|size)"):
        fetch_url(url)
    assert server.log == []


def test_limits_defaults_and_arguments(monkeypatch):
    assert download_timeout() == 3600 and max_download_bytes() == 8 * 2**30
    monkeypatch.setenv("SWIN_MAX_DOWNLOAD_BYTES", "16G")  # the same spelling as SWIN_MAX_CHECKPOINT_BYTES
    assert max_download_bytes() == 16 * 2**30
    monkeypatch.delenv("SWIN_MAX_DOWNLOAD_BYTES")
    monkeypatch.setenv("SWIN_DOWNLOAD_TIMEOUT", "2.5")
    monkeypatch.setenv("SWIN_MAX_DOWNLOAD_BYTES", "1024")
    assert download_timeout() == 2.5 and max_download_bytes() == 1024
    assert download_timeout(7) == 7 and max_download_bytes(10) == 10  # an argument wins
    with pytest.raises(ValueError, match="timeout=0 is not a positive number"):
        download_timeout(0)


# -- leftovers, redaction -----------------------------------------------------------------------------------


def test_stale_part_files_are_swept(server, tmp_path):
    directory = tmp_path / "dl"
    directory.mkdir()
    stale, fresh, other = directory / ".file.bin.k1lled.part", directory / ".file.bin.al1ve.part", directory / "keep"
    for path in (stale, fresh, other):
        path.write_bytes(b"partial")
    two_days_ago = time.time() - 2 * 24 * 3600
    os.utime(stale, (two_days_ago, two_days_ago))
    os.utime(other, (two_days_ago, two_days_ago))
    download(server.serve("/file.bin", b"payload"), directory / "file.bin")
    assert sorted(p.name for p in directory.iterdir()) == sorted([fresh.name, other.name, "file.bin"])
    assert sweep_stale_parts(directory) == []


def test_password_and_tokens_are_redacted(server, swin_home):
    url = f"http://user:s3cret@127.0.0.1:{server.port}/missing/model.pth?token=abc123&v=2"
    with pytest.raises(WeightsNotFoundError) as error:
        fetch_url(url, progress=False)
    message = str(error.value)
    assert "HTTP 404" in message and "//***@127.0.0.1" in message and "token=***&v=2" in message
    assert "s3cret" not in message and "abc123" not in message
    with pytest.raises(ValueError) as error:
        fetch_url(url + "#sha256=nothex")
    assert "s3cret" not in str(error.value) and "//***@" in str(error.value)
    assert redact("https://ghp_abc@host/x?X-Amz-Signature=f00&a=b") == "https://***@host/x?X-Amz-Signature=***&a=b"


@pytest.mark.parametrize(
    "userinfo",
    ["ghp_SECRETTOKEN:x-oauth-basic", "ghp_SECRETTOKEN:", "user:s3cret", "ghp_SECRETTOKEN", "us%40er:p%3Aw"],
)
def test_the_whole_userinfo_is_hidden(userinfo):
    """GitHub's documented form puts the token in the user name (``https://TOKEN:x-oauth-basic@github.com``,
    or ``TOKEN@``): no part of the userinfo is shown."""
    assert redact(f"https://{userinfo}@github.com/x.pth") == "https://***@github.com/x.pth"


# -- the cache directory ------------------------------------------------------------------------------------


def test_swin_home_is_a_file(server, monkeypatch, tmp_path, entries, swin_body):
    home = tmp_path / "not_a_dir"
    home.write_text("a file")
    monkeypatch.setenv("SWIN_HOME", str(home))
    url = server.serve("/x/model.safetensors", swin_body)
    with pytest.raises(CacheDirError, match=rf"SWIN_HOME={home} is a file, not a directory; point SWIN_HOME at a"):
        fetch_url(url)
    entry = entries("home_file", {"url": url})
    with pytest.raises(CacheDirError, match="is a file"):  # one clear error, not one per source
        fetch(entry, progress=False)
    assert server.requests == [] and home.read_text() == "a file"
    assert isinstance(CacheDirError("x", home, OSError()), (OSError, DownloadError))
    # offline too: it said the file was not in the cache and where to place a copy, under the file
    monkeypatch.setenv("SWIN_OFFLINE", "1")
    with pytest.raises(CacheDirError, match="is a file, not a directory"):
        fetch(entry, progress=False)


def test_swin_home_is_checked_before_the_hub_is_asked(server, monkeypatch, tmp_path, entries, swin_body):
    """An entry whose first source is on the Hugging Face hub: a $SWIN_HOME that cannot be written is still
    the one error before any request (the hub's retries would otherwise come first)."""
    home = tmp_path / "not_a_dir"
    home.write_text("a file")
    monkeypatch.setenv("SWIN_HOME", str(home))
    monkeypatch.setenv("HF_ENDPOINT", server.base)
    entry = entries(
        "hub_first",
        {"hf_hub": "someone/swin", "filename": "model.safetensors"},
        {"url": server.serve("/x/model.safetensors", swin_body)},
    )
    with pytest.raises(CacheDirError, match="is a file"):
        fetch(entry, progress=False)
    assert server.log == []  # not even the hub's HEAD


def test_a_file_in_the_hub_cache_needs_no_writable_swin_home(server, monkeypatch, tmp_path, entries, swin_body):
    """Weights already in the Hugging Face cache (timm downloaded them, or an earlier run) are used without a
    request even when $SWIN_HOME cannot be written: only a download needs it."""
    monkeypatch.setenv("HF_ENDPOINT", server.base)
    server.serve("/someone/swin/resolve/main/model.safetensors", swin_body, headers=hub_headers(swin_body))
    entry = entries("hub_cached", {"hf_hub": "someone/swin", "filename": "model.safetensors"})
    fetch(entry, progress=False)  # into the hub cache (and linked from ours)
    server.log.clear()
    home = tmp_path / "not_a_dir"
    home.write_text("a file")
    monkeypatch.setenv("SWIN_HOME", str(home))
    path = fetch(entry, progress=False)
    assert path.read_bytes() == swin_body and server.log == []


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes to read-only directories")
def test_swin_home_read_only(server, monkeypatch, tmp_path, swin_body):
    home = tmp_path / "ro"
    home.mkdir()
    home.chmod(0o555)
    monkeypatch.setenv("SWIN_HOME", str(home))
    try:
        with pytest.raises(CacheDirError, match=f"SWIN_HOME={home} is not writable"):
            fetch_url(server.serve("/x/model.safetensors", swin_body))
        assert list(home.iterdir()) == []
    finally:
        home.chmod(0o755)


def test_unwritable_cache_message(monkeypatch, tmp_path):
    """The read-only case's message, also where the tests run as root."""
    monkeypatch.delenv("SWIN_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cause = PermissionError(13, "Permission denied", str(tmp_path / "swin" / "urls"))
    error = storage.cache_dir_error(DestinationError("x", tmp_path / "swin" / "urls" / "a" / "m.pth", cause))
    assert str(error).startswith(f"the weights cache {tmp_path / 'swin'} (set SWIN_HOME to put it elsewhere) is not")
    assert "make it writable, or point SWIN_HOME at a writable directory" in str(error)


def test_long_file_names(server, swin_home, swin_body):
    """250 characters fit (the temporary name is kept short); more than the file system allows is one clear
    error, before any transfer, and no directory is left."""
    name = "w" * (250 - len(".safetensors")) + ".safetensors"
    assert fetch_url(server.serve(f"/{name}", swin_body), progress=False).name == name
    too_long = "w" * 300 + ".pth"
    swin_home.rename(swin_home.with_name("old_home"))
    with pytest.raises(CacheDirError, match=r"cannot hold a file named w{40}\.\.\. \(304 characters\): too long"):
        fetch_url(server.serve(f"/{too_long}", swin_body))
    assert not swin_home.exists()
    assert server.requests == [f"/{name}"]


def _another_process_cleans_up(monkeypatch, when: str) -> list:
    """Make a second process's cleanup (the rmdir of the directories its probe made) land, once, where it
    hurts: between our ``mkdir`` and ``mkstemp``, or during our ``mkdir`` (after it found the directory
    there, before it checked that it is one). Returns the list of directories removed that way."""
    removed = []
    if when == "before mkstemp":
        real_mkstemp = tempfile.mkstemp

        def mkstemp(*args, dir, **kwargs):
            if not removed:
                os.rmdir(dir)
                removed.append(Path(dir))
            return real_mkstemp(*args, dir=dir, **kwargs)

        monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    else:
        real_mkdir = os.mkdir

        def mkdir(path, *args, **kwargs):
            if not removed and Path(path).name == "swin_t.x":  # the other made it first, and is removing it
                removed.append(Path(path))
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fspath(path))
            return real_mkdir(path, *args, **kwargs)

        monkeypatch.setattr(os, "mkdir", mkdir)
    return removed


@pytest.mark.parametrize("when", ["before mkstemp", "during mkdir"])
def test_directory_removed_by_another_process_is_made_again(server, monkeypatch, tmp_path, when):
    """Two processes filling one cache entry (every rank of a distributed job): the first one's probe removes
    the directories it made while the second is creating them or its temporary file. The second makes them
    again; it is not told that the cache cannot be written."""
    removed = _another_process_cleans_up(monkeypatch, when)
    dest = tmp_path / "home" / "weights" / "swin_t.x" / "model.bin"
    probe_destination(dest, "the probe")
    assert removed == [dest.parent] and not (tmp_path / "home").exists()  # the probe leaves nothing behind

    removed.clear()
    assert download(server.serve("/x/model.bin", b"payload"), dest).read_bytes() == b"payload"
    assert removed == [dest.parent]


def test_a_file_in_the_way_is_still_reported_after_the_retries(tmp_path):
    (tmp_path / "weights").write_text("a file where a directory belongs")
    with pytest.raises(DestinationError, match="File exists") as error:
        probe_destination(tmp_path / "weights" / "model.bin", "the probe")
    assert error.value.cause.errno == errno.EEXIST


class _FullDisk:
    """The temporary file of a download on a disk that fills up: ``write`` or the flush on ``close`` fails."""

    def __init__(self, file, fail_on: str, code: int) -> None:
        self.file, self.fail_on, self.code = file, fail_on, code

    def _fail(self) -> None:
        raise OSError(self.code, os.strerror(self.code))

    def write(self, data: bytes) -> int:
        if self.fail_on == "write":
            self._fail()
        return self.file.write(data)

    def __enter__(self) -> _FullDisk:
        return self

    def __exit__(self, *exc) -> None:
        self.file.close()
        if self.fail_on == "close":
            self._fail()


@pytest.mark.parametrize("fail_on", ["write", "close"])
def test_full_disk_stops_at_the_first_source(server, monkeypatch, entries, swin_home, swin_body, fail_on):
    """A local write that fails is the cache's problem, not the source's: no other source is downloaded (each
    would fail the same way), the error is the cache's, and no temporary file is left."""
    real_fdopen = os.fdopen
    monkeypatch.setattr(os, "fdopen", lambda fd, *a, **k: _FullDisk(real_fdopen(fd, *a, **k), fail_on, errno.ENOSPC))
    first = server.serve("/first/model.safetensors", swin_body)
    entry = entries("full_disk", {"url": first}, {"url": server.serve("/second/model.safetensors", swin_body)})
    with pytest.raises(CacheDirError, match=f"SWIN_HOME={swin_home} is on a full disk; free some space") as error:
        fetch(entry, progress=False)
    assert error.value.cause.errno == errno.ENOSPC
    assert server.requests == ["/first/model.safetensors"]
    assert cache_files(swin_home) == []


@pytest.mark.parametrize(
    ("code", "said"),
    [
        (errno.ENOSPC, "is on a full disk"),
        (errno.EDQUOT, "is on a full disk (the disk quota is used up)"),
        (errno.EFBIG, "has no room for a file this large"),
    ],
    ids=["ENOSPC", "EDQUOT", "EFBIG"],
)
def test_no_room_messages(swin_home, code, said):
    cause = OSError(code, os.strerror(code))
    error = storage.cache_dir_error(DestinationError("x", swin_home / "weights" / "a.b" / "m.pth", cause))
    assert str(error).startswith(f"SWIN_HOME={swin_home} {said}")


def test_content_length_that_is_not_ascii_digits_is_ignored(server, tmp_path):
    """``"²".isdigit()`` is True but ``int("²")`` fails: a header like that is no length at all, not a crash
    that keeps the next source from being tried."""
    url = server.serve("/odd/model.bin", b"payload", headers={"Content-Length": "\u00b2"})
    assert download(url, tmp_path / "model.bin").read_bytes() == b"payload"


# -- pins -----------------------------------------------------------------------------------------------------

DIGEST = "ab" * 32


@pytest.mark.parametrize(
    "fragment",
    [
        "sha256=" + DIGEST[:7],  # too short a prefix
        "sha256=" + DIGEST + "a",  # 65 digits
        "sha256=" + "g" * 64,  # not hex
        "sha256 =" + DIGEST,
        "sha-256=" + DIGEST,
        "sha256=" + DIGEST + "&x=1",
        "md5=0123456789abcdef0123456789abcdef",
        "section-2",
    ],
)
def test_malformed_pins_are_errors(server, fragment):
    url = server.serve("/p/model.pth", b"x")
    with pytest.raises(ValueError, match=r"expected|only form understood is #sha256=<64 hex digits>"):
        resolve("swin_t", f"{url}#{fragment}")
    assert server.log == []


@pytest.mark.parametrize(
    ("fragment", "digest"),
    [
        ("sha256=" + DIGEST, DIGEST),
        ("SHA256=" + DIGEST.upper(), DIGEST),
        ("sha256:" + DIGEST[:8], DIGEST[:8]),
        ("", None),
    ],
)
def test_well_formed_pins(fragment, digest):
    assert split_pin(f"https://h/m.pth#{fragment}") == ("https://h/m.pth", digest)


def test_cached_file_is_checked_against_a_later_pin(server, monkeypatch, swin_home):
    old, new = torch_bytes(tiny_swin_state()), safetensors_bytes(tiny_swin_state())
    url = server.serve("/v/model.bin", old)
    path = fetch_url(url, progress=False)  # cached without a pin
    server.serve("/v/model.bin", new)  # the server's file changed since
    assert fetch_url(f"{url}#sha256={hashlib.sha256(old).hexdigest()[:8]}") == path  # matches: no request
    assert server.requests == ["/v/model.bin"]

    assert fetch_url(f"{url}#sha256={hashlib.sha256(new).hexdigest()}", progress=False) == path  # downloaded again
    assert path.read_bytes() == new and server.requests == ["/v/model.bin"] * 2

    with pytest.raises(
        WeightsNotFoundError, match=r"does not match the expected .*\nThe cached copy .* does not match"
    ):
        fetch_url(f"{url}#sha256={hashlib.sha256(old).hexdigest()}", progress=False)
    assert path.read_bytes() == new  # the cached file is left as it was

    monkeypatch.setenv("SWIN_OFFLINE", "1")
    with pytest.raises(WeightsNotFoundError, match="offline mode is on.*\nThe cached copy"):
        fetch_url(f"{url}#sha256={'0' * 64}")
    assert len(server.requests) == 3 and cache_files(swin_home) == [path]


# -- only files that load as a Swin trunk are cached ----------------------------------------------------------


def _resnet_like() -> dict[str, torch.Tensor]:
    return {
        "conv1.weight": torch.randn(8, 3, 7, 7),
        "layer1.0.conv1.weight": torch.randn(8, 8, 3, 3),
        "fc.weight": torch.randn(10, 8),
    }


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (lambda: safetensors_bytes(_resnet_like()), "not a Swin checkpoint"),
        (lambda: safetensors_bytes(tiny_swin_state(nan=True)), "non-finite weights"),
        (lambda: torch_bytes({"epoch": 3, "model": {"note": "no tensors"}}), "not convertible to a Swin state dict"),
    ],
    ids=["resnet", "nan", "no-tensors"],
)
def test_file_failing_the_checks_is_not_cached_and_the_next_source_is_used(
    server, entries, swin_home, swin_body, bad, reason
):
    body = bad()
    first = server.serve("/first/model.safetensors", body)
    second = server.serve("/second/model.safetensors", swin_body)
    path = fetch(entries("fallback", {"url": first}, {"url": second}), progress=False)
    assert path.read_bytes() == swin_body and cache_files(swin_home) == [path]
    assert server.requests == ["/first/model.safetensors", "/second/model.safetensors"]

    with pytest.raises(WeightsNotFoundError) as error:  # every source bad: each named with its reason
        fetch(
            entries("all_bad", {"url": first}, {"url": server.serve("/third/model.safetensors", body)}), progress=False
        )
    assert str(error.value).count(reason) == 2 and first in str(error.value)

    with pytest.raises(CorruptCheckpointError, match=reason):  # a URL: the checkpoint error itself
        fetch_url(first, progress=False)
    assert cache_files(swin_home) == [path]


def test_a_malformed_redirect_is_this_sources_failure(server, tmp_path):
    """A Location no URL parser takes: a DownloadError (the next source is tried), not a ValueError that ended
    the whole fetch."""
    server.serve("/bad.pth", status=302, location="http://[::1/x.pth")
    with pytest.raises(DownloadError, match="malformed location"):
        download(server.url("/bad.pth"), tmp_path / "m.pth")
    assert not (tmp_path / "m.pth").exists()


def test_a_secret_in_a_request_the_library_refuses_is_not_shown(server, tmp_path):
    """http.client's refusal quotes the request's path and query: the token there is redacted like the URL's."""
    with pytest.raises(DownloadError) as error:
        download(server.url("/a b.pth?token=SUPERSECRET"), tmp_path / "m.pth")
    assert "SUPERSECRET" not in str(error.value) and "token=***" in str(error.value)


def test_a_cached_file_has_a_new_files_mode(server, tmp_path):
    """mkstemp makes 0600; the cached checkpoint gets what any new file gets (0666 less the umask), so a cache
    shared between users or machines can be read (it could not)."""
    body = safetensors_bytes(tiny_swin_state())
    server.serve("/ok.safetensors", body)
    mask = os.umask(0o022)
    try:
        path = download(server.url("/ok.safetensors"), tmp_path / "ok.safetensors")
    finally:
        os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask


def test_a_killed_downloads_part_is_swept_when_the_file_is_used(server, swin_home):
    """A .part left by a killed download beside a file cached since: swept when the cached file is used (no later
    download into that folder would ever sweep it)."""
    body = safetensors_bytes(tiny_swin_state())
    url = server.serve("/swin.safetensors", body)
    path = fetch_url(url)
    part = path.parent / f".{path.name}.x1y2z3.part"
    part.write_bytes(b"\0" * 1024)
    old = time.time() - 3 * 24 * 3600
    os.utime(part, (old, old))
    assert fetch_url(url) == path and not part.exists()


def test_a_download_is_on_disk_before_it_has_its_name(server, tmp_path, monkeypatch):
    """fsync of the part file before the rename: after a power loss the cached name holds the whole file or
    nothing (it could hold zeroed pages of the right size, which a recorded digest then vouched for)."""
    import swin.weights.download as module

    body = safetensors_bytes(tiny_swin_state())
    server.serve("/ok.safetensors", body)
    events = []
    fsync, replace = os.fsync, os.replace
    monkeypatch.setattr(module.os, "fsync", lambda fd: events.append(("fsync", os.fstat(fd).st_size)) or fsync(fd))
    monkeypatch.setattr(module.os, "replace", lambda a, b: events.append(("replace", Path(b).name)) or replace(a, b))
    download(server.url("/ok.safetensors"), tmp_path / "ok.safetensors")
    assert events == [("fsync", len(body)), ("replace", "ok.safetensors")]
