"""Manifest entries cannot place files outside the weights cache: tags and hub file names are checked when an
entry is registered, and ``storage.entry_path`` refuses a path that leaves the entry's directory."""

from __future__ import annotations

import os

import pytest

from swin.weights import manifest, storage

URL = {"url": "http://127.0.0.1:9/ok.pth"}


def _under(path: os.PathLike, root: os.PathLike) -> bool:
    path, root = os.path.normpath(os.path.abspath(path)), os.path.normpath(os.path.abspath(root))
    return os.path.commonpath([path, root]) == root and path != root


@pytest.mark.parametrize(
    "tag",
    [
        "mirror/../../../../escape",
        "../../escape",
        "..",
        "a..b",
        "a/b",
        "a\\b",
        "/tmp/escape",
        ".hidden",
        "-x",
        "with space",
        "tab\tx",
    ],
)
def test_unsafe_tags_are_refused(entries, tag):
    with pytest.raises(ValueError, match=r"entry 'swin_t\..*'.*letters, digits, '_', '\.' and '-'") as info:
        entries(tag, URL)
    assert repr(f"swin_t.{tag}") in str(info.value)  # the message names the entry
    assert f"swin_t.{tag}" not in manifest.list_pretrained()


@pytest.mark.parametrize("tag", ["my_in1k", "ms_in22k_ft_in1k_mirror", "my-mirror", "v2.1", "_private", "9x"])
def test_safe_tags_are_cached_under_the_cache(entries, swin_home, tag):
    entry = entries(tag, URL)
    path = entry.cache_path(entry.sources[0])
    assert _under(path, swin_home / "weights" / f"swin_t.{tag}")


def test_every_bundled_tag_and_file_name_is_accepted(swin_home):
    """The bundled manifest loads (it is parsed with the same checks) and all its files lie in the cache."""
    names = manifest.list_pretrained()
    assert names
    for name in names:
        entry = manifest.get_entry(name)
        for source in entry.sources:
            assert _under(entry.cache_path(source), swin_home / "weights" / entry.name)


@pytest.mark.parametrize(
    "filename",
    [
        "../../../../escape2.safetensors",
        "../model.safetensors",
        "sub/../../model.safetensors",
        "/tmp/escape.safetensors",
        "./model.safetensors",
        "sub//model.safetensors",
        "sub/",
        "..\\..\\escape.safetensors",
        "C:/escape.safetensors",
    ],
)
def test_unsafe_hub_file_names_are_refused(entries, filename):
    with pytest.raises(ValueError, match=r"entry 'swin_t\.hub'.*filename .* relative to the repository root"):
        entries("hub", {"hf_hub": "timm/x", "filename": filename})


@pytest.mark.parametrize("filename", ["model.safetensors", "onnx/model.safetensors", "a.b/c-d_e.pth"])
def test_hub_file_names_in_subfolders_stay_in_the_entry_directory(entries, swin_home, filename):
    entry = entries("hub", {"hf_hub": "timm/x", "filename": filename})
    path = entry.cache_path(entry.sources[0])
    assert _under(path, swin_home / "weights" / "swin_t.hub")
    assert str(path).endswith(filename)


@pytest.mark.parametrize(
    ("entry_name", "filename"),
    [
        ("swin_t.x", "../../../../escape"),
        ("swin_t.x", "/tmp/escape"),
        ("swin_t.x", ""),
        ("swin_t.x/../../..", "escape"),
        ("..", "escape"),
        ("", "escape"),
        ("a/b", "escape"),
    ],
)
def test_entry_path_refuses_to_leave_the_entry_directory(swin_home, entry_name, filename):
    """Defence in depth: ``entry_path`` itself, called with names the manifest would never let through."""
    with pytest.raises(ValueError, match="outside its directory"):
        storage.entry_path(entry_name, filename)


def test_entry_path_of_a_plain_entry(swin_home):
    assert storage.entry_path("swin_t.ms_in1k", "model.safetensors") == (
        swin_home / "weights" / "swin_t.ms_in1k" / "model.safetensors"
    )
