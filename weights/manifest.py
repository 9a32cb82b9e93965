"""The pretrained-weights manifest: ``ARCH.TAG`` entries read from ``manifest.yaml``, and their lookup."""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import os
import re
import threading
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import yaml

from ..registry import get_config, resolve_name
from . import hub, storage
from .download import redact

__all__ = [
    "Source",
    "PretrainedEntry",
    "UnknownPretrainedError",
    "entries",
    "get_entry",
    "has_tag",
    "list_pretrained",
    "register_pretrained",
    "tags",
]

HF_DEFAULT_ENDPOINT = hub.DEFAULT_ENDPOINT
_HEX = re.compile(r"[0-9a-fA-F]+")
# A tag names a directory of the weights cache (weights/ARCH.TAG/): one safe path component.
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_TAG_RULE = "letters, digits, '_', '.' and '-' only, starting with a letter, digit or '_', and no '..'"


def _tag_problem(tag: str) -> str | None:
    """Why ``tag`` cannot name a cache directory, or None when it can."""
    if _TAG.fullmatch(tag) and ".." not in tag:
        return None
    return f"the tag {tag!r} must hold {_TAG_RULE} (it names a directory of the weights cache), e.g. my_mirror"


def _filename_problem(filename: str) -> str | None:
    """Why ``filename`` (a hub file) cannot be placed in the cache, or None when it can: a relative path
    inside the repository, each part a real name (``onnx/model.onnx`` is fine, ``../x`` and ``/x`` are not)."""
    parts = filename.split("/")
    awkward = "\\" in filename or "\0" in filename or re.match(r"^[A-Za-z]:", filename)
    if not awkward and all(part not in ("", ".", "..") for part in parts):  # "" also refuses a leading "/"
        return None
    return (
        f"filename {filename!r} must be a path relative to the repository root, '/'-separated, with no "
        "absolute or drive prefix, no backslash, no empty, '.' or '..' parts (e.g. model.safetensors); "
        "it is also the file's name in the weights cache"
    )


def _is_hex(value: Any, shortest: int, longest: int) -> bool:
    """A string of hex digits of an allowed length (YAML reads an unquoted all-digit hash as a number)."""
    return isinstance(value, str) and shortest <= len(value) <= longest and bool(_HEX.fullmatch(value))


class UnknownPretrainedError(KeyError):
    """No manifest entry of that name; the message lists what there is."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class Source:
    """One place a checkpoint can be fetched from: a Hugging Face hub file (fetched through huggingface_hub,
    its cache shared with timm) or a plain URL (our downloader). ``sha256`` (64 hex digits),
    ``sha256_prefix`` (8 or more) and ``size`` are checked for both kinds when given."""

    layout: str = "auto"
    url: str | None = None
    hf_hub: str | None = None
    filename: str | None = None
    revision: str = "main"
    sha256: str | None = None
    sha256_prefix: str | None = None
    size: int | None = None

    def __post_init__(self) -> None:
        if (self.url is None) == (self.hf_hub is None):
            raise ValueError(f"a source needs exactly one of url or hf_hub, got {self}")
        if self.hf_hub is not None and not self.filename:
            raise ValueError(f"hf_hub source {self.hf_hub!r} needs a filename (e.g. model.safetensors)")
        if self.hf_hub is not None and (problem := _filename_problem(str(self.filename))):
            raise ValueError(f"hf_hub source {self.hf_hub!r}: {problem}")
        if self.sha256 is not None and not _is_hex(self.sha256, 64, 64):
            raise ValueError(f"sha256 must be 64 hex digits (the file's full SHA-256) in quotes, got {self.sha256!r}")
        if self.sha256_prefix is not None and not _is_hex(self.sha256_prefix, 8, 64):
            raise ValueError(f"sha256_prefix must be 8 to 64 hex digits in quotes, got {self.sha256_prefix!r}")
        if self.size is not None and (isinstance(self.size, bool) or not isinstance(self.size, int) or self.size <= 0):
            raise ValueError(f"size must be a positive number of bytes, got {self.size!r}")

    @property
    def basename(self) -> str:
        return self.filename if self.hf_hub else storage.url_filename(self.url)

    def resolve_url(self) -> str:
        """The URL to fetch now; hub files honour ``$HF_ENDPOINT`` (a mirror, or a test server)."""
        if self.url is not None:
            return self.url
        return hub.hub_url(self.hf_hub, self.filename, self.revision)

    def describe(self) -> str:
        """For messages: the URL with any credentials hidden, and the layout."""
        return f"{redact(self.resolve_url())} ({self.layout} layout)"


@dataclass(frozen=True)
class PretrainedEntry:
    """A pretrained checkpoint of a registered architecture: where to get it and how to feed it."""

    name: str
    arch: str
    tag: str
    sources: tuple[Source, ...]
    num_classes: int = 1000
    input_size: tuple[int, int, int] = (3, 224, 224)
    crop_pct: float = 0.9
    crop_mode: str = "center"
    interpolation: str = "bicubic"
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)
    resize_size: int | None = None
    labels: str | None = None
    license: str | None = None
    default: bool = False
    metrics: dict[str, Any] = field(default_factory=dict, compare=False)
    note: str | None = None

    def cache_path(self, source: Source) -> os.PathLike:
        return storage.entry_path(self.name, source.basename)

    def cached_file(self) -> os.PathLike | None:
        """The first source's file in the cache that matches that source's pins (size, sha256), if any: a file
        cached for an earlier version of the entry is not served (see ``storage.pin_mismatch``)."""
        for source in self.sources:
            path = self.cache_path(source)
            if os.path.isfile(path) and _pin_mismatch(path, source) is None:
                return path
        return None

    def stale_files(self) -> list[str]:
        """Where :meth:`cached_file` found nothing to serve: each cached file there is, as "PATH does not match
        the manifest's sha256 (...)", so that a message can say which file to remove."""
        stale: dict[os.PathLike, str] = {}
        for source in self.sources:
            path = self.cache_path(source)
            if path not in stale and os.path.isfile(path):
                stale[path] = f"{path} does not match the manifest's {_pin_mismatch(path, source)}"
        return list(stale.values())

    def provenance(self) -> dict[str, Any]:
        """Where the weights come from, in timm's ``pretrained_cfg`` keys: ``hf_hub_id`` and ``url`` (the first
        source of each kind, None without one) and ``license``."""
        hub = next((s.hf_hub for s in self.sources if s.hf_hub is not None), None)
        url = next((s.url for s in self.sources if s.url is not None), None)
        return {"hf_hub_id": hub, "url": url, "license": self.license}

    def data_config(self) -> dict[str, Any]:
        """Evaluation preprocessing, with timm's key names plus ``resize_size`` (the shorter side before crop)."""
        size = self.input_size[-1]
        resize = self.resize_size or int(size / self.crop_pct)  # floor, as timm's transforms_factory
        return {
            "input_size": tuple(self.input_size),
            "interpolation": self.interpolation,
            "mean": tuple(self.mean),
            "std": tuple(self.std),
            "crop_pct": self.crop_pct,
            "crop_mode": self.crop_mode,
            "resize_size": resize,
            "num_classes": self.num_classes,
            "labels": self.labels,
        }


def _pin_mismatch(path: os.PathLike, source: Source) -> str | None:
    return storage.pin_mismatch(path, sha256=source.sha256, sha256_prefix=source.sha256_prefix, size=source.size)


_lock = threading.Lock()
_entries: dict[str, PretrainedEntry] = {}
_loaded = False


def _parse(name: str, fields: Any, origin: str) -> PretrainedEntry:
    if not isinstance(fields, dict):
        raise ValueError(f"{origin}: entry {name!r} must be a mapping of fields")
    arch_part, sep, tag = name.partition(".")
    if not sep or not tag:
        raise ValueError(f"{origin}: entry names are ARCH.TAG (e.g. swin_t.ms_in1k), got {name!r}")
    if problem := _tag_problem(tag):
        raise ValueError(f"{origin}: entry {name!r}: {problem}")
    arch = resolve_name(arch_part)
    fields = dict(fields)
    try:
        sources = tuple(Source(**s) for s in fields.pop("sources", ()))
        if not sources:
            raise ValueError("no sources")
        for key in ("input_size", "mean", "std"):
            if key in fields:
                fields[key] = tuple(fields[key])
        return PretrainedEntry(name=f"{arch}.{tag}", arch=arch, tag=tag, sources=sources, **fields)
    except (TypeError, ValueError) as error:
        raise type(error)(f"{origin}: entry {name!r}: {error}") from None


def _add(entries: dict, origin: str, overwrite: bool) -> list[str]:
    if not isinstance(entries, dict):
        raise ValueError(f"{origin}: expected a mapping of ARCH.TAG -> fields, got {type(entries).__name__}")
    for name in entries:
        if not isinstance(name, str):  # YAML reads an unquoted 123: or 1.5: as a number
            raise ValueError(
                f"{origin}: entry names are strings ARCH.TAG (e.g. swin_t.ms_in1k), got {name!r} "
                f"({type(name).__name__}); in YAML, quote a name that reads as a number"
            )
    parsed = [_parse(n, f, origin) for n, f in entries.items() if not n.startswith("_")]
    for entry in parsed:
        if entry.name in _entries and not overwrite:
            raise ValueError(f"pretrained entry {entry.name!r} already exists; pass overwrite=True to replace it")
    for entry in parsed:
        if entry.default:  # one default per architecture
            for other in [e for e in _entries.values() if e.arch == entry.arch and e.default]:
                _entries[other.name] = _replace(other, default=False)
        _entries[entry.name] = entry
    return [entry.name for entry in parsed]


def _replace(entry: PretrainedEntry, **changes: Any) -> PretrainedEntry:
    return dataclasses.replace(entry, **changes)


def _ensure_loaded() -> None:
    global _loaded
    if _loaded:
        return
    with _lock:
        if not _loaded:
            text = resources.files(__package__).joinpath("manifest.yaml").read_text()
            _add(yaml.safe_load(text), "the bundled manifest", overwrite=False)
            _loaded = True


def register_pretrained(entries: dict[str, dict] | str | os.PathLike, *, overwrite: bool = False) -> list[str]:
    """Add manifest entries (a mapping like ``manifest.yaml``, or the path of such a YAML file).

    Lets a project serve its own checkpoints (or a mirror) through ``create_model(name, pretrained=tag)``.
    Returns the names added.
    """
    _ensure_loaded()
    with _lock:
        if isinstance(entries, (str, os.PathLike)):
            with open(entries) as handle:
                return _add(yaml.safe_load(handle), os.fspath(entries), overwrite)
        return _add(entries, "register_pretrained", overwrite)


def _split(name: str) -> tuple[str, str | None]:
    arch, sep, tag = name.partition(".")
    return resolve_name(arch), (tag if sep else None)


def tags(arch: str) -> list[str]:
    """Tags of the registered architecture ``arch`` (an alias works), default first."""
    _ensure_loaded()
    arch = resolve_name(arch)
    found = [e for e in _entries.values() if e.arch == arch]
    return [e.tag for e in sorted(found, key=lambda e: not e.default)]


def get_entry(name: str, tag: str | None = None) -> PretrainedEntry:
    """The entry ``ARCH.TAG``, or ``ARCH`` with ``tag`` (its default tag when both are absent).

    ``ARCH`` may be a timm alias (``swin_tiny_patch4_window7_224.ms_in1k``). Raises
    :class:`UnknownPretrainedError` naming the tags that exist.
    """
    _ensure_loaded()
    arch, own_tag = _split(name)
    tag = tag or own_tag
    available = tags(arch)
    if not available:
        raise UnknownPretrainedError(f"{arch} has no pretrained weights in the manifest; pass a checkpoint path or URL")
    if tag is None:
        return next(e for e in _entries.values() if e.arch == arch and e.tag == available[0])
    key = f"{arch}.{tag}"
    if key not in _entries:
        close = difflib.get_close_matches(tag, available, n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else "."
        raise UnknownPretrainedError(f"no pretrained tag {tag!r} for {arch}{hint} Tags: {', '.join(available)}")
    return _entries[key]


def has_tag(arch: str, tag: str) -> bool:
    _ensure_loaded()
    return f"{resolve_name(arch)}.{tag}" in _entries


def list_pretrained(pattern: str | list[str] | tuple[str, ...] | None = None) -> list[str]:
    """``ARCH.TAG`` names, sorted, filtered by a shell-style ``pattern`` (``swin_t`` alone means ``swin_t.*``) on
    the name or on the same name with a timm alias of the architecture (``'swin_tiny*'`` finds ``swin_t.*``); as
    timm's filter, a list of patterns matches any of them and ``""`` filters nothing."""
    _ensure_loaded()
    names = sorted(_entries)
    if not pattern:
        return names
    if not isinstance(pattern, str):
        if not isinstance(pattern, (list, tuple)) or not all(isinstance(p, str) for p in pattern):
            raise TypeError(f"list_pretrained takes a pattern or a list of patterns (str), got {pattern!r}")
        chosen = set().union(*(list_pretrained(p) for p in pattern))
        return [n for n in names if n in chosen]

    def spellings(name: str) -> list[str]:
        entry = _entries[name]
        return [name, *(f"{alias}.{entry.tag}" for alias in get_config(entry.arch).aliases)]

    return [
        n for n in names if any(fnmatch.fnmatch(s, pattern) or fnmatch.fnmatch(s, pattern + ".*") for s in spellings(n))
    ]


def entries() -> list[PretrainedEntry]:
    _ensure_loaded()
    return list(_entries.values())
