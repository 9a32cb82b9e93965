"""How large a checkpoint may become in memory, judged from sizes alone, never from a tensor's values.

A checkpoint is downloaded from wherever its manifest points, so its size is whatever the file says. A
safetensors file or an old-style pickle takes about as much memory as its size on disk, but a
``torch.save`` zip may be deflated: a 1 MiB member can inflate to 1 GiB. ``torch.save`` itself stores
every member uncompressed, so a large member that inflates far beyond its stored size is a decompression
bomb (or a re-compressed file), never something torch wrote. The zip directory states every member's
sizes, so this is decided from the directory alone, without inflating anything.

Once a pickle is loaded, its tensors are measured too (:func:`check_tensors`). A tensor is a view of a
storage, and a view may repeat its data: ``torch.zeros(1).expand(2**30)`` pickles as one stored value and a
stride of 0, a few kilobytes that pass every bound above, yet the first thing that reads it (``isfinite``, a
copy, a conversion) needs 4 GiB. ``torch.save`` of a model's weights never writes such a view, so a large one
is refused, and so are tensors whose sizes add up to more than the bound (views sharing one storage).
A safetensors file cannot hold either: it has no strides, and its header check already requires each
tensor's bytes to be exactly its shape's, side by side in the file.

The bound is :data:`MAX_CHECKPOINT_BYTES` (8 GiB: the largest Swin, swin_large 22K in fp32, is about
0.9 GB, and a training checkpoint with optimizer state about three times that), or the environment
variable ``SWIN_MAX_CHECKPOINT_BYTES`` where set.
"""

from __future__ import annotations

import os
import re
import zipfile
from collections.abc import Iterable
from typing import Any

import torch

__all__ = [
    "MAX_CHECKPOINT_BYTES",
    "MAX_CHECKPOINT_BYTES_ENV",
    "MAX_COMPRESSION_RATIO",
    "byte_setting",
    "RATIO_CHECKED_ABOVE",
    "REPEATED_VIEW_ALLOWED",
    "Refused",
    "check_size",
    "check_tensors",
    "check_zip_directory",
    "format_bytes",
    "max_checkpoint_bytes",
]

MAX_CHECKPOINT_BYTES = 8 * 1024**3
MAX_CHECKPOINT_BYTES_ENV = "SWIN_MAX_CHECKPOINT_BYTES"
# A member that inflates to more than this many times its stored size, once it is larger than
# RATIO_CHECKED_ABOVE, is refused. Tensor data compresses by a few percent; only zeros compress 100x.
MAX_COMPRESSION_RATIO = 100
RATIO_CHECKED_ABOVE = 16 * 1024**2
# A view may repeat its stored data up to this size (a small broadcast buffer); beyond it, it is refused.
REPEATED_VIEW_ALLOWED = 16 * 1024**2

_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
_SIZE = re.compile(r"\s*(\d+)\s*([KMGT]?)(?:I?B)?\s*", re.IGNORECASE)


class Refused(ValueError):
    """A size bound or the zip directory refuses the checkpoint; the message says why and what to do."""


def max_checkpoint_bytes() -> int:
    """The bound in bytes: ``SWIN_MAX_CHECKPOINT_BYTES`` where set, else :data:`MAX_CHECKPOINT_BYTES`."""
    return byte_setting(MAX_CHECKPOINT_BYTES_ENV, MAX_CHECKPOINT_BYTES)


def byte_setting(variable: str, default: int) -> int:
    """A size in bytes from the environment variable ``variable`` (``4096``, ``512M``, ``16G``), else ``default``.

    Read on every call so that a setting made after import applies. A value that is not a size is an error
    rather than silently ignored: a typo would otherwise leave the default in force unnoticed.
    """
    raw = os.environ.get(variable, "")
    if not raw.strip():
        return default
    match = _SIZE.fullmatch(raw)
    if match is None or int(match.group(1)) == 0:
        raise ValueError(
            f"{variable}={raw!r} is not a size: give a positive number of bytes, optionally with "
            f"a K, M, G or T suffix (powers of 1024), e.g. {variable}=16G"
        )
    return int(match.group(1)) * _UNITS[match.group(2).upper()]


def format_bytes(count: int) -> str:
    """``count`` bytes for a message: "1.5 GiB", "64.0 MiB", "512 bytes"."""
    for unit, scale in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"


def _too_large(what: str, count: int, limit: int) -> Refused:
    enough = f"{-(-count // 1024**3)}G"  # whole GiB, rounded up
    return Refused(
        f"{what} {format_bytes(count)}, more than the {format_bytes(limit)} allowed. If you trust this file and "
        f"have the memory, raise the bound, e.g. {MAX_CHECKPOINT_BYTES_ENV}={enough}"
    )


def check_size(count: int, what: str = "it holds") -> None:
    """Refuse ``count`` bytes (a file that is read whole) beyond :func:`max_checkpoint_bytes`."""
    limit = max_checkpoint_bytes()
    if count > limit:
        raise _too_large(what, count, limit)


def check_zip_directory(members: Iterable[zipfile.ZipInfo]) -> None:
    """Refuse a zip whose members would inflate beyond the bound, or absurdly beyond their stored size.

    Only the directory is read (``ZipFile.infolist()``): the declared sizes are what the zip reader
    allocates and inflates into, so they bound the memory a load takes. A name listed twice is refused
    too: which of the two a reader picks is up to the reader, so a check could read one and torch the other.
    """
    limit = max_checkpoint_bytes()
    total = 0
    seen: set[str] = set()
    for member in members:
        if member.filename in seen:
            raise Refused(f"its zip directory lists {member.filename} twice, which torch.save never writes")
        seen.add(member.filename)
        _check_ratio(member)
        total += member.file_size
    if total > limit:
        raise _too_large("it inflates to", total, limit)


def _check_ratio(member: zipfile.ZipInfo) -> None:
    if member.file_size <= RATIO_CHECKED_ABOVE:
        return
    if member.file_size > MAX_COMPRESSION_RATIO * max(member.compress_size, 1):
        ratio = member.file_size // max(member.compress_size, 1)
        raise Refused(
            f"its member {member.filename} inflates {ratio}x, from {format_bytes(member.compress_size)} to "
            f"{format_bytes(member.file_size)} (a decompression bomb?). torch.save stores tensors uncompressed; "
            "if this is your own re-compressed checkpoint, re-save it with torch.save"
        )


def check_tensors(root: Any) -> None:
    """Refuse a loaded checkpoint whose tensors would take more memory than their stored data, or than the
    bound: a view that repeats its data beyond :data:`REPEATED_VIEW_ALLOWED`, or a total beyond
    :func:`max_checkpoint_bytes`. The message names the tensor by its key path (``model.layers.0.w``).

    Walks dicts, lists, tuples and sets with an explicit stack; ``root`` must have passed
    ``pickle_shape.check_loaded`` (no cycles, bounded depth and size), which bounds this walk too. Only
    sizes are read, never a tensor's values.
    """
    limit = max_checkpoint_bytes()
    total = 0
    pending: list[tuple[str, Any]] = [("", root)]
    while pending:
        where, value = pending.pop()
        if isinstance(value, torch.Tensor):
            total += _tensor_bytes(where or "(the checkpoint itself)", value)
        elif isinstance(value, dict):
            pending.extend((_key_path(where, key), item) for key, item in value.items())
        elif isinstance(value, (list, tuple, set, frozenset)):
            pending.extend((_key_path(where, index), item) for index, item in enumerate(value))
    if total > limit:
        raise _too_large("its tensors hold", total, limit)


def _key_path(where: str, key: Any) -> str:
    return f"{where}.{key}" if where else str(key)


def _tensor_bytes(where: str, tensor: torch.Tensor) -> int:
    """The bytes ``tensor`` holds as values; refused if far more than its storage holds from its offset."""
    logical = tensor.numel() * tensor.element_size()
    if tensor.layout != torch.strided:  # sparse: no storage of its own; counted at its dense size, which no
        return logical  # Swin checkpoint holds in sparse form
    stored = max(tensor.untyped_storage().nbytes() - tensor.storage_offset() * tensor.element_size(), 0)
    if logical > stored and logical > REPEATED_VIEW_ALLOWED:
        raise Refused(
            f"its tensor {where} is a view that repeats its data: {format_bytes(logical)} of values over "
            f"{format_bytes(stored)} stored (shape {tuple(tensor.shape)}, strides {tensor.stride()}). "
            "torch.save of a model's weights never writes one; if this is your own file, save the tensor "
            "with .contiguous() instead"
        )
    return logical
