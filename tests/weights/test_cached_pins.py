"""A cached manifest file is served only while it matches its source's pins (size, sha256, sha256 prefix).

An entry re-registered with another file (a new URL and sha256, the same file name) must not be answered
with the old file. Hashing a checkpoint on every load is what the digest record beside the file avoids: it
is trusted while the file's size, modification time and inode are those it was recorded for.
"""

from __future__ import annotations

import hashlib
import os

import pytest

from swin.weights import manifest
from swin.weights.download import sweep_stale_parts
from swin.weights.pretrained import WeightsNotFoundError, fetch
from tests.weights.conftest import hub_headers, safetensors_bytes, tiny_swin_state, torch_bytes


@pytest.fixture(scope="module")
def bodies() -> tuple[bytes, bytes]:
    """Two checkpoints of the same trunk, in two formats: the old and the new file of one entry."""
    state = tiny_swin_state()
    return torch_bytes(state), safetensors_bytes(state)


def sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def reregister(tag: str, source: dict) -> manifest.PretrainedEntry:
    """What a project does when its checkpoint changes: the same entry, overwritten with the new source."""
    manifest.register_pretrained({f"swin_t.{tag}": {"sources": [source]}}, overwrite=True)
    return manifest.get_entry("swin_t", tag)


def records(directory) -> list[str]:
    """The names of the digest records (``.NAME.sha256``) in ``directory``."""
    return sorted(name for name in os.listdir(directory) if name.startswith(".") and name.endswith(".sha256"))


def rewrite_in_place(path, body: bytes) -> None:
    """Change the file's bytes, keeping its size, inode and modification time (what no download does)."""
    stat = os.stat(path)
    assert len(body) == stat.st_size
    with open(path, "r+b") as handle:
        handle.write(body)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert os.stat(path).st_ino == stat.st_ino


def test_reregistered_entry_is_not_answered_with_the_old_file(server, entries, monkeypatch, swin_home, bodies):
    old, new = bodies
    path = fetch(entries("mine", {"url": server.serve("/v1/model.bin", old)}), progress=False)
    assert path.read_bytes() == old

    entry = reregister("mine", {"url": server.serve("/v2/model.bin", new), "sha256": sha256(new)})
    assert entry.cached_file() is None
    monkeypatch.setenv("SWIN_OFFLINE", "1")
    with pytest.raises(WeightsNotFoundError) as error:
        fetch(entry, progress=False)
    message = str(error.value)
    assert "swin_t.mine has only a stale file in the cache" in message and "is not in the cache" not in message
    assert f"The cached file at {path} does not match the manifest's sha256" in message
    assert sha256(old) in message and sha256(new) in message
    assert server.requests == ["/v1/model.bin"]

    monkeypatch.delenv("SWIN_OFFLINE")
    assert fetch(entry, progress=False) == path and path.read_bytes() == new  # downloaded anew, replacing it
    assert server.requests == ["/v1/model.bin", "/v2/model.bin"]
    assert fetch(entry, progress=False) == path and len(server.requests) == 2  # and now served from the cache


def test_a_cached_file_of_another_size_is_not_served(server, entries, monkeypatch, swin_home, bodies):
    old, new = bodies
    path = fetch(entries("sized", {"url": server.serve("/v1/model.bin", old)}), progress=False)
    entry = reregister("sized", {"url": server.serve("/v2/model.bin", new), "size": len(new)})
    monkeypatch.setenv("SWIN_OFFLINE", "1")
    with pytest.raises(WeightsNotFoundError, match=f"The cached file at {path} does not match the manifest's size"):
        fetch(entry, progress=False)


def test_a_cached_file_without_the_pinned_prefix_is_not_served(server, entries, monkeypatch, swin_home, bodies):
    old, new = bodies
    path = fetch(entries("prefixed", {"url": server.serve("/v1/model.bin", old)}), progress=False)
    entry = reregister("prefixed", {"url": server.serve("/v2/model.bin", new), "sha256_prefix": sha256(new)[:8]})
    assert entry.cached_file() is None
    assert fetch(entry, progress=False) == path and path.read_bytes() == new


def test_a_file_placed_by_hand_is_hashed_once(entries, monkeypatch, swin_home, bodies):
    """The first use hashes it and records the digest; later uses trust the record while the file is unchanged
    (shown here by changing its bytes behind the record's back), and hash again once it has changed."""
    old, new = bodies
    entry = entries("by_hand", {"url": "http://127.0.0.1:9/model.safetensors", "sha256": sha256(new)})
    path = swin_home / "weights" / "swin_t.by_hand" / "model.safetensors"
    path.parent.mkdir(parents=True)
    path.write_bytes(new)
    monkeypatch.setenv("SWIN_OFFLINE", "1")
    assert fetch(entry) == path
    assert records(path.parent) == [".model.safetensors.sha256"]

    spoiled = bytearray(new)
    spoiled[-1] ^= 1
    rewrite_in_place(path, bytes(spoiled))
    assert fetch(entry) == path  # the record still stands for the file: not hashed again

    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 10**9))  # now it has changed
    with pytest.raises(WeightsNotFoundError, match=f"The cached file at {path} does not match the manifest's sha256"):
        fetch(entry)


def test_a_download_records_its_digest(server, entries, monkeypatch, swin_home, bodies):
    """A file the download verified against its sha256 is not hashed again on its first use."""
    _, new = bodies
    entry = entries("recorded", {"url": server.serve("/model.safetensors", new), "sha256": sha256(new)})
    path = fetch(entry, progress=False)
    assert records(path.parent) == [".model.safetensors.sha256"]
    spoiled = bytearray(new)
    spoiled[-1] ^= 1
    rewrite_in_place(path, bytes(spoiled))
    monkeypatch.setenv("SWIN_OFFLINE", "1")
    assert fetch(entry) == path


def test_a_hub_link_records_its_digest(server, entries, monkeypatch, swin_home, bodies):
    _, new = bodies
    monkeypatch.setenv("HF_ENDPOINT", server.base)
    server.serve("/someone/swin/resolve/main/model.safetensors", new, headers=hub_headers(new))
    source = {"hf_hub": "someone/swin", "filename": "model.safetensors", "sha256": sha256(new)}
    path = fetch(entries("hub_pinned", source), progress=False)
    assert path.is_symlink() and records(path.parent) == [".model.safetensors.sha256"]


def test_digest_records_are_neither_checkpoints_nor_parts(server, entries, swin_home, bodies):
    """A record is never served as the checkpoint, nor swept as a dead download's temporary file."""
    _, new = bodies
    entry = entries("kept", {"url": server.serve("/model.safetensors", new), "sha256": sha256(new)})
    path = fetch(entry, progress=False)
    (record,) = records(path.parent)
    two_days_ago = os.stat(path).st_mtime - 2 * 24 * 3600
    os.utime(path.parent / record, (two_days_ago, two_days_ago))
    assert sweep_stale_parts(path.parent) == [] and (path.parent / record).is_file()
    assert entry.cached_file() == path
    assert sorted(os.listdir(path.parent)) == sorted([record, "model.safetensors"])
