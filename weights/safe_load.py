"""Read a checkpoint file without running code from it: safetensors, or pickles with ``weights_only=True``.

A pickle can name any Python callable and have it called while loading (``__reduce__``); ``torch.load``
with ``weights_only=True`` refuses every global outside a small allow-list of tensor and container types.
Published training checkpoints also hold a few plain data objects beside the weights (the official Swin
code saves its yacs config; others save ``argparse.Namespace`` args or numpy scalars such as the best
accuracy). Those, and only those, are allow-listed here as inert placeholders that drop their contents:
nothing from them is imported or called. Anything else is refused before a single byte is unpickled.
"""

from __future__ import annotations

import collections
import os
import pickle
import struct
import zipfile
from typing import Any

import torch

__all__ = [
    "AS_DICT_GLOBALS",
    "CorruptCheckpointError",
    "DROPPED_GLOBALS",
    "UnsafeCheckpointError",
    "check_file",
    "load_file",
]


class UnsafeCheckpointError(pickle.UnpicklingError):
    """The checkpoint asks to import or call something while loading; it was not loaded."""


class CorruptCheckpointError(ValueError):
    """The file is not a complete checkpoint (truncated, corrupt, or not a checkpoint at all)."""


class _Dropped:
    """Inert stand-in for a data-only object in a checkpoint; constructing or filling it keeps nothing."""

    def __new__(cls, *args: Any, **kwargs: Any) -> _Dropped:
        return object.__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass

    def __repr__(self) -> str:
        return "<dropped non-tensor object>"


# Globals found in published checkpoints that carry only metadata. The official Swin training code saves
# its yacs config (a dict subclass of plain values): read as an OrderedDict. The others become _Dropped.
AS_DICT_GLOBALS: tuple[str, ...] = ("yacs.config.CfgNode",)
DROPPED_GLOBALS: tuple[str, ...] = (
    "argparse.Namespace",  # command-line args (DeiT/timm-style training scripts)
    "numpy.core.multiarray.scalar",  # numpy scalars, e.g. a best-accuracy float
    "numpy._core.multiarray.scalar",
    "numpy.core.multiarray._reconstruct",  # small numpy arrays in metadata
    "numpy._core.multiarray._reconstruct",
    "numpy.ndarray",
    "numpy.dtype",
    "numpy.dtypes.Float64DType",
    "numpy.dtypes.Float32DType",
    "numpy.dtypes.Int64DType",
)

_SAFETENSORS_MAX_HEADER = 100 * 1024 * 1024


def _kind(path: str) -> str:
    """ "safetensors", "zip" (torch.save) or "pickle", from the first bytes."""
    with open(path, "rb") as handle:
        head = handle.read(9)
    if head.startswith(b"PK\x03\x04"):
        return "zip"
    if len(head) == 9 and head[8:9] == b"{":
        return "safetensors"
    if head[:1] == b"\x80":  # pickle PROTO opcode: torch.save's old format or a plain pickle
        return "pickle"
    shown = repr(head[:9]) if head else "nothing (empty file)"
    raise CorruptCheckpointError(
        f"{path} is not a checkpoint (safetensors, torch.save zip or pickle): it starts with {shown}; "
        "an HTML error page or an interrupted copy?"
    )


def _check_safetensors(path: str) -> None:
    import json

    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        (header_size,) = struct.unpack("<Q", handle.read(8))
        if header_size > min(size - 8, _SAFETENSORS_MAX_HEADER):
            raise CorruptCheckpointError(f"{path}: safetensors header of {header_size} bytes exceeds the file")
        try:
            header = json.loads(handle.read(header_size))
        except ValueError as error:
            raise CorruptCheckpointError(f"{path}: unreadable safetensors header ({error})") from None
    end = max((info["data_offsets"][1] for k, info in header.items() if k != "__metadata__"), default=0)
    if 8 + header_size + end != size:
        raise CorruptCheckpointError(
            f"{path}: the safetensors header describes {8 + header_size + end} bytes but the file has {size} "
            "(truncated download?)"
        )


def _unsafe_globals(path: str) -> list[str]:
    try:
        return list(torch.serialization.get_unsafe_globals_in_checkpoint(path))
    except (RuntimeError, OSError, zipfile.BadZipFile, EOFError, ValueError, pickle.UnpicklingError) as error:
        raise CorruptCheckpointError(f"{path}: not a readable checkpoint, truncated or corrupt ({error})") from None


def _refuse(path: str, names: list[str]) -> UnsafeCheckpointError:
    return UnsafeCheckpointError(
        f"refusing to load {path}: unpickling it would import or call {', '.join(sorted(names))}, which could "
        "run arbitrary code. Only tensors, plain containers and known metadata objects are read "
        "(torch.load(weights_only=True)). If this is your own checkpoint, save just the weights "
        "(torch.save(model.state_dict(), path)) or convert them to safetensors in a trusted environment."
    )


def check_file(path: str | os.PathLike) -> str:
    """Check that ``path`` is a complete checkpoint that loads without running code; return its format.

    Cheap for safetensors and zip pickles (``torch.save``'s format): reads the header, or the zip directory
    and the pickle's opcodes, not the tensors. An old-style (non-zip) pickle cannot be scanned without
    reading it, so it is read with the weights-only unpickler. Raises :class:`CorruptCheckpointError` or
    :class:`UnsafeCheckpointError`.
    """
    path = os.fspath(path)
    kind = _kind(path)
    if kind == "safetensors":
        _check_safetensors(path)
    elif kind == "zip":
        unsafe = [name for name in _unsafe_globals(path) if name not in DROPPED_GLOBALS + AS_DICT_GLOBALS]
        if unsafe:
            raise _refuse(path, unsafe)
    else:
        _load_pickle(path)
    return kind


def load_file(path: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint at ``path`` as a mapping (safetensors, or a weights-only pickle), on the CPU.

    Raises :class:`UnsafeCheckpointError` for a pickle that would import or call anything but tensor and
    container types (nothing from it runs), :class:`CorruptCheckpointError` for a truncated or unreadable file.
    """
    path = os.fspath(path)
    if _kind(path) == "pickle":
        return _load_pickle(path)  # read once: the weights-only unpickler is the check
    if check_file(path) == "safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file as load_safetensors

        try:
            return load_safetensors(path, device="cpu")
        except SafetensorError as error:
            raise CorruptCheckpointError(f"{path}: unreadable safetensors file ({error})") from None
    return _load_pickle(path)


def _load_pickle(path: str) -> dict[str, Any]:
    placeholders = [(_Dropped, name) for name in DROPPED_GLOBALS]
    placeholders += [(collections.OrderedDict, name) for name in AS_DICT_GLOBALS]
    try:
        with torch.serialization.safe_globals(placeholders):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        # Old (non-zip) pickles, which cannot be scanned before loading, or a zip pickle whose globals
        # passed the scan but not the unpickler.
        reason = str(error)
        if "WeightsUnpickler error:" in reason:
            reason = reason.split("WeightsUnpickler error:", 1)[1].strip().split("\n\n", 1)[0]
            reason = reason.split(" Please use", 1)[0].rstrip(".")
        raise UnsafeCheckpointError(
            f"refusing to load {path}: the weights-only reader stopped at: {reason}. Only tensors, plain "
            "containers and known metadata objects are read (torch.load(weights_only=True)); nothing from the "
            "file was run. If this is your own checkpoint, save just the weights (torch.save(model.state_dict(), "
            "path)) or convert them to safetensors in a trusted environment."
        ) from None
    except (RuntimeError, OSError, EOFError, zipfile.BadZipFile, struct.error) as error:
        raise CorruptCheckpointError(f"{path}: not a readable checkpoint, truncated or corrupt ({error})") from None
