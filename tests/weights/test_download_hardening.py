"""Plain-URL downloads under hostile or broken conditions, against loopback servers, each bounded in time.

Credentials never reach another origin, a dripping or endless server is cut off by the deadline or the size
cap, dead ``.part`` files are swept, passwords never appear in messages, an unusable ``$SWIN_HOME`` is one
clear error, pins are strict and re-checked, and a file that does not load as a Swin trunk is never cached.
"""

from __future__ import annotations

import base64
import hashlib
import os
import time

import pytest
import torch

from swin.weights import storage
from swin.weights.download import (
    DestinationError,
    DownloadError,
    download,
    download_timeout,
    max_download_bytes,
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


@pytest.mark.parametrize("drip", [0.05, 0.004], ids=["headers", "body"])
def test_dripping_server_hits_the_deadline(server, tmp_path, drip):
    """One byte at a time: within the status line and headers (0.05 s a byte) or within the body."""
    url = server.serve("/drip/file.bin", b"x" * 2000, drip=drip)
    start = time.monotonic()
    with pytest.raises(DownloadError, match=r"not finished after 1 s .*SWIN_DOWNLOAD_TIMEOUT"):
        download(url, tmp_path / "dl" / "file.bin", timeout=1)
    assert time.monotonic() - start < 3
    assert not (tmp_path / "dl").exists()


def test_deadline_from_the_environment(server, monkeypatch, swin_home):
    url = server.serve("/drip/model.pth", b"x" * 2000, drip=0.01)
    monkeypatch.setenv("SWIN_DOWNLOAD_TIMEOUT", "1")
    start = time.monotonic()
    with pytest.raises(WeightsNotFoundError, match="not finished after 1 s"):
        fetch_url(url, progress=False)
    assert time.monotonic() - start < 3
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
    assert "HTTP 404" in message and "user:***@127.0.0.1" in message and "token=***&v=2" in message
    assert "s3cret" not in message and "abc123" not in message
    with pytest.raises(ValueError) as error:
        fetch_url(url + "#sha256=nothex")
    assert "s3cret" not in str(error.value) and "user:***@" in str(error.value)
    assert redact("https://ghp_abc@host/x?X-Amz-Signature=f00&a=b") == "https://***@host/x?X-Amz-Signature=***&a=b"


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
