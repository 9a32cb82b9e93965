"""Read a checkpoint file without running code from it: safetensors, or pickles with ``weights_only=True``.

A pickle can name any Python callable and have it called while loading (``__reduce__``); ``torch.load``
with ``weights_only=True`` refuses every global outside a small allow-list of tensor and container types.
Published training checkpoints also hold a few plain data objects beside the weights (the official Swin
code saves its yacs config; others save ``argparse.Namespace`` args or numpy scalars such as the best
accuracy). Those, and only those, are allow-listed here as inert placeholders that drop their contents:
nothing from them is imported or called. Anything else is refused before a single byte is unpickled.

A file can be hostile without running code, too, and every such file is refused the same way, with a
:class:`CorruptCheckpointError` that names it, before the expensive or dangerous step: a safetensors
header that does not add up (:mod:`.safetensors_header`), a file, zip or loaded pickle that would take more
memory than ``SWIN_MAX_CHECKPOINT_BYTES``, inflates like a bomb or holds a tensor view that repeats its data
(:mod:`.size_limits`), and pickled objects that
contain themselves or nest absurdly deep (:mod:`.pickle_shape`), which hang or crash whoever walks them.
"""

from __future__ import annotations

import collections
import contextlib
import io
import os
import pickle
import zipfile
from typing import IO, Any

import torch

from . import legacy_pickle, pickle_shape, safetensors_header, size_limits

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


def _reason(error: BaseException) -> str:
    """An exception as one short line for a message (torch's C++ errors carry a stack trace)."""
    lines = str(error).strip().splitlines()
    text = lines[0] if lines else type(error).__name__
    return text if len(text) <= 300 else text[:300] + "..."


def _unreadable(path: str, error: BaseException) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"{path}: not a readable checkpoint, truncated or corrupt ({_reason(error)})")


def _check_size(path: str) -> int:
    """The size of a file that is read whole (safetensors, old-style pickle), refused beyond the bound."""
    size = os.path.getsize(path)
    try:
        size_limits.check_size(size, "the file holds")
    except size_limits.Refused as error:
        raise CorruptCheckpointError(f"{path}: {error}") from None
    return size


def _check_safetensors(path: str) -> None:
    """The whole header, not a byte of tensor data: a file that passes loads with ``safetensors``."""
    size = _check_size(path)
    try:
        with open(path, "rb") as handle:
            header_size, header = safetensors_header.read_header(handle, size)
        safetensors_header.validate(header, size - 8 - header_size)
    except safetensors_header.InvalidHeader as error:
        raise CorruptCheckpointError(f"{path}: {error}") from None


def _check_zip(path: str) -> None:
    """The zip directory (sizes), the pickle's globals and its object graph; no tensor data is read.

    The directory comes first: every later step inflates ``data.pkl``, which could itself be a bomb.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
    except Exception as error:  # BadZipFile, or whatever a crafted directory makes zipfile trip over
        raise _unreadable(path, error) from None
    try:
        size_limits.check_zip_directory(members)
    except size_limits.Refused as error:
        raise CorruptCheckpointError(f"{path}: {error}") from None
    unsafe = [name for name in _unsafe_globals(path) if name not in DROPPED_GLOBALS + AS_DICT_GLOBALS]
    if unsafe:
        raise _refuse(path, unsafe)
    _scan_shape(path, io.BytesIO(_zip_record(path, "data.pkl")))


def _zip_record(path: str, name: str) -> bytes:
    """``name`` as torch.load reads it: through torch's own zip reader, so that the bytes checked here are
    the bytes unpickled there (zip readers can disagree about a crafted archive)."""
    try:
        with torch.serialization._open_zipfile_reader(path) as reader:
            return reader.get_record(name)
    except Exception as error:
        raise _unreadable(path, error) from None


def _check_old_pickle(path: str) -> None:
    """Size, and the object graph of each pickle in torch's old format (magic number, protocol, system
    info, the object, storage keys; tensor data follows), or of a plain pickle; then the storages the
    object claims against the data that follows (torch.load allocates a claim before reading its data)."""
    size = _check_size(path)
    with open(path, "rb") as handle:
        for _ in range(5):
            if not _scan_shape(path, handle):
                break
    with open(path, "rb") as handle:
        try:
            claims = legacy_pickle.read_claims(handle)
        except (IndexError, KeyError) as error:  # the shape scan has refused those already
            raise _unreadable(path, error) from None
    if claims is not None:
        _check_claims(path, claims, size)


def _check_claims(path: str, claims: legacy_pickle.Claims, size: int) -> None:
    claimed = sum(claims.storages.values())
    follows = size - claims.data_offset
    if claimed > follows:
        raise CorruptCheckpointError(
            f"{path}: its pickle claims {size_limits.format_bytes(claimed)} of tensor data, but only "
            f"{size_limits.format_bytes(follows)} follow it (an old-format torch.save file, truncated or made "
            "to exhaust memory). Nothing was allocated for it."
        )
    if claims.stored_keys is None:
        return  # torch.load refuses a key list that is not a list, before reading data
    stored = set()
    for key in claims.stored_keys:
        with contextlib.suppress(TypeError):  # an unhashable key names no storage (torch fails on it too)
            stored.add(key)
    unstored = [key for key in claims.storages if key not in stored]
    if unstored:
        raise CorruptCheckpointError(
            f"{path}: its pickle names {len(unstored)} storage(s) whose data the file does not hold (first: "
            f"{unstored[0]!r}); torch.load would hand them out as uninitialized memory. The file is corrupt."
        )


def _scan_shape(path: str, stream: IO[bytes]) -> bool:
    try:
        return pickle_shape.scan(stream)
    except pickle_shape.BadShape as error:
        raise _bad_shape(path, error) from None


def _bad_shape(path: str, error: pickle_shape.BadShape) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        f"{path}: the pickled checkpoint {error}. A checkpoint is a shallow tree of dicts, lists and tensors; "
        "this file is corrupt or was made to break loaders. Nothing from it was kept."
    )


def _unsafe_globals(path: str) -> list[str]:
    try:
        return list(torch.serialization.get_unsafe_globals_in_checkpoint(path))
    except Exception as error:
        raise _unreadable(path, error) from None


def _refuse(path: str, names: list[str]) -> UnsafeCheckpointError:
    return UnsafeCheckpointError(
        f"refusing to load {path}: unpickling it would import or call {', '.join(sorted(names))}, which could "
        "run arbitrary code. Only tensors, plain containers and known metadata objects are read "
        "(torch.load(weights_only=True)). If this is your own checkpoint, save just the weights "
        "(torch.save(model.state_dict(), path)) or convert them to safetensors in a trusted environment."
    )


_CHECKS = {"safetensors": _check_safetensors, "zip": _check_zip, "pickle": _check_old_pickle}


def check_file(path: str | os.PathLike) -> str:
    """Check that ``path`` is a complete checkpoint that loads without running code; return its format.

    Cheap for safetensors and zip pickles (``torch.save``'s format): reads the header, or the zip directory
    and the pickle's opcodes, not the tensors. An old-style (non-zip) pickle cannot be checked for globals
    without unpickling it, so it is read with the weights-only unpickler. Raises
    :class:`CorruptCheckpointError` (malformed, truncated, too large to load, or objects that contain
    themselves or nest absurdly deep) or :class:`UnsafeCheckpointError`; ``ValueError`` if
    ``SWIN_MAX_CHECKPOINT_BYTES`` is set to something that is not a size.
    """
    path = os.fspath(path)
    kind = _kind(path)
    _CHECKS[kind](path)
    if kind == "pickle":
        _load_pickle(path)
    return kind


def load_file(path: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint at ``path`` as a mapping (safetensors, or a weights-only pickle), on the CPU.

    Runs the checks of :func:`check_file` first, then loads. Raises :class:`UnsafeCheckpointError` for a
    pickle that would import or call anything but tensor and container types (nothing from it runs),
    :class:`CorruptCheckpointError` for a truncated, unreadable, oversized or absurdly shaped file.
    """
    path = os.fspath(path)
    kind = _kind(path)
    _CHECKS[kind](path)
    return _load_safetensors(path) if kind == "safetensors" else _load_pickle(path)


def _load_safetensors(path: str) -> dict[str, Any]:
    from safetensors.torch import load_file as load_safetensors

    try:  # no size_limits.check_tensors: safetensors has no strides, and _check_safetensors made each
        # tensor's bytes exactly its shape's, side by side, so nothing loads larger than the file
        return load_safetensors(path, device="cpu")
    except Exception as error:  # SafetensorError, or anything else the reader raises on a file it refuses
        raise CorruptCheckpointError(f"{path}: unreadable safetensors file ({_reason(error)})") from None


def _load_pickle(path: str) -> dict[str, Any]:
    placeholders = [(_Dropped, name) for name in DROPPED_GLOBALS]
    placeholders += [(collections.OrderedDict, name) for name in AS_DICT_GLOBALS]
    try:
        with torch.serialization.safe_globals(placeholders):
            checkpoint = torch.load(path, map_location="cpu", weights_only=True)
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
    except Exception as error:  # RuntimeError, EOFError, MemoryError, RecursionError, a malformed pickle's
        raise _unreadable(path, error) from None  # IndexError or KeyError: all mean the file is unreadable
    try:
        pickle_shape.check_loaded(checkpoint)
    except pickle_shape.BadShape as error:
        raise _bad_shape(path, error) from None
    try:  # the file's size bounded what was stored, not the views of it that were unpickled
        size_limits.check_tensors(checkpoint)
    except size_limits.Refused as error:
        raise CorruptCheckpointError(f"{path}: {error}") from None
    return checkpoint
