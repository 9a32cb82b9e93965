"""Hub sources through huggingface_hub, against loopback servers standing in for the hub and its CDN.

The token goes to the hub's own origin only, a file timm already put in the Hugging Face cache is used without
any request, and a hub file is checked (manifest sha256, full load, Swin trunk) before it is used.
"""

from __future__ import annotations

import hashlib
import os

import pytest

from swin.weights import hub
from swin.weights.pretrained import WeightsNotFoundError, fetch
from tests.weights.conftest import cache_files, hub_headers, safetensors_bytes, tiny_swin_state

REPO = "someone/tiny-swin"
RESOLVE = f"/{REPO}/resolve/main/model.safetensors"


@pytest.fixture(scope="module")
def swin_body() -> bytes:
    return safetensors_bytes(tiny_swin_state())


@pytest.fixture
def hub_entry(entries):
    def add(tag: str = "hub", *more: dict, **source) -> object:
        return entries(tag, {"hf_hub": REPO, "filename": "model.safetensors", **source}, *more)

    return add


def _methods(server) -> list[tuple[str, str]]:
    return [(r.method, r.path) for r in server.log]


def test_token_goes_to_the_hub_but_not_to_the_cdn(server, other_server, monkeypatch, swin_home, hub_entry, swin_body):
    """The hub redirects large files to a CDN on another host: huggingface_hub drops the token there."""
    other_server.serve("/blob/model", swin_body)
    server.serve(RESOLVE, status=302, location=other_server.url("/blob/model"), headers=hub_headers(swin_body))
    monkeypatch.setenv("HF_ENDPOINT", server.base)
    monkeypatch.setenv("HF_TOKEN", "hf_s3cret")

    path = fetch(hub_entry(), progress=False)
    assert _methods(server) == [("HEAD", RESOLVE)]
    assert server.log[0].headers["authorization"] == "Bearer hf_s3cret"
    assert _methods(other_server) == [("GET", "/blob/model")]
    assert not other_server.log[0].has("Authorization")
    assert path == swin_home / "weights" / "swin_t.hub" / "model.safetensors" and path.read_bytes() == swin_body


def test_same_host_redirect_keeps_the_token(server, monkeypatch, hub_entry, swin_body):
    server.serve("/files/model", swin_body)
    server.serve(RESOLVE, status=302, location="/files/model")
    monkeypatch.setenv("HF_ENDPOINT", server.base)
    monkeypatch.setenv("HF_TOKEN", "hf_s3cret")
    fetch(hub_entry(), progress=False)
    assert _methods(server) == [("HEAD", RESOLVE), ("HEAD", "/files/model"), ("GET", "/files/model")]
    assert all(r.headers.get("authorization") == "Bearer hf_s3cret" for r in server.log)


def test_file_timm_downloaded_is_used_without_any_request(server, monkeypatch, tmp_path, hub_entry, swin_body):
    """timm downloads with hf_hub_download into the shared cache; we find the file there without asking."""
    from huggingface_hub import hf_hub_download

    server.serve(RESOLVE, swin_body)
    timm_path = hf_hub_download(REPO, "model.safetensors", endpoint=server.base, cache_dir=os.environ["HF_HUB_CACHE"])
    asked = len(server.log)
    monkeypatch.setenv("HF_ENDPOINT", server.base)

    entry = hub_entry()
    path = fetch(entry, progress=False)
    assert len(server.log) == asked  # the server is up, and was not asked
    assert os.path.realpath(path) == os.path.realpath(timm_path)

    # offline, server gone, a fresh cache of ours: still found in the hub's
    server.close()
    monkeypatch.setenv("SWIN_HOME", str(tmp_path / "fresh_home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    again = fetch(entry, progress=False)
    assert again == tmp_path / "fresh_home" / "weights" / "swin_t.hub" / "model.safetensors"
    assert os.path.realpath(again) == os.path.realpath(timm_path)


def test_offline_and_not_in_the_hub_cache(server, monkeypatch, hub_entry):
    monkeypatch.setenv("HF_ENDPOINT", server.base)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(WeightsNotFoundError, match=f"offline mode is on.*\n  {server.url(RESOLVE)}"):
        fetch(hub_entry(), progress=False)
    assert server.log == []


def test_hub_file_failing_the_checks_falls_back_to_the_next_source(
    server, monkeypatch, swin_home, hub_entry, swin_body
):
    bad = safetensors_bytes(tiny_swin_state(nan=True))
    server.serve(RESOLVE, bad)
    mirror = server.serve("/mirror/model.safetensors", swin_body)
    monkeypatch.setenv("HF_ENDPOINT", server.base)

    path = fetch(hub_entry("fallback", {"url": mirror}), progress=False)
    assert path.read_bytes() == swin_body and cache_files(swin_home) == [path]  # no link to the bad file
    assert server.requests == [RESOLVE, "/mirror/model.safetensors"]

    # the bad file was not kept in the hub cache: the next call asks the hub again
    with pytest.raises(WeightsNotFoundError) as error:
        fetch(hub_entry("only_hub"), progress=False)
    assert "non-finite weights" in str(error.value)
    assert server.requests == [RESOLVE, "/mirror/model.safetensors", RESOLVE]


def test_manifest_sha256_is_checked_for_hub_files(server, monkeypatch, swin_home, hub_entry, swin_body):
    server.serve(RESOLVE, swin_body)
    monkeypatch.setenv("HF_ENDPOINT", server.base)
    with pytest.raises(WeightsNotFoundError, match="does not match the expected 0000"):
        fetch(hub_entry("pinned_wrong", sha256="0" * 64), progress=False)
    assert cache_files(swin_home) == []
    good = hashlib.sha256(swin_body).hexdigest()
    assert fetch(hub_entry("pinned", sha256=good), progress=False).read_bytes() == swin_body


def test_missing_hub_file_names_the_url(server, monkeypatch, hub_entry):
    monkeypatch.setenv("HF_ENDPOINT", server.base)
    with pytest.raises(WeightsNotFoundError, match=f"{server.url(RESOLVE)}: .*404"):
        fetch(hub_entry("absent"), progress=False)


def test_environment_is_read_at_call_time(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9/")
    monkeypatch.setenv("HF_TOKEN", "hf_x")
    assert hub.hub_url(REPO, "m.safetensors") == f"http://127.0.0.1:9/{REPO}/resolve/main/m.safetensors"
    assert hub.token() == "hf_x" and hub.cache_dir() == str(tmp_path / "hf_hub")
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    assert hub.cache_dir() == str(tmp_path / "hf_home" / "hub")


def test_a_hub_file_that_fails_the_checks_is_not_kept_in_the_hub_cache(server, monkeypatch, entries, swin_home):
    """A hub file that fails the checks (here NaN weights) is removed from huggingface_hub's shared cache, where
    the next call, timm's and transformers' too, took it again without a request; the next call downloads it
    afresh and, the hub fixed, gets the good file."""
    repo, resolve = "someone/tiny-swin", "/someone/tiny-swin/resolve/main/model.safetensors"
    bad, good = safetensors_bytes(tiny_swin_state(nan=True)), safetensors_bytes(tiny_swin_state())
    server.serve(resolve, bad, headers=hub_headers(bad))
    monkeypatch.setenv("HF_ENDPOINT", server.base)
    entry = entries("hub2", {"hf_hub": repo, "filename": "model.safetensors"})
    with pytest.raises(WeightsNotFoundError, match="non-finite"):
        fetch(entry, progress=False)
    hub_cache = swin_home.parent / "hf_hub"
    assert hub_cache.is_dir() and not [p for p in hub_cache.rglob("*") if p.is_file() and p.stat().st_size == len(bad)]
    server.serve(resolve, good, headers=hub_headers(good))
    path = fetch(entry, progress=False)
    assert path.read_bytes() == good


def test_a_signed_cdn_url_is_not_shown(server, other_server, monkeypatch, hub_entry, swin_body):
    """huggingface_hub's error quotes the CDN URL it was sent to, signature and all: redacted in the message."""
    signed = "/blob/model?X-Amz-Signature=CDNSECRET&Expires=1"
    other_server.serve(signed, b"denied", status=403)
    server.serve(RESOLVE, status=302, location=other_server.url(signed), headers=hub_headers(swin_body))
    monkeypatch.setenv("HF_ENDPOINT", server.base)
    with pytest.raises(WeightsNotFoundError) as error:
        fetch(hub_entry("signed"), progress=False)
    assert "CDNSECRET" not in str(error.value)
