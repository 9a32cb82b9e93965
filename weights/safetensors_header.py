"""Validating a safetensors header completely, so that a file that passes loads with ``safetensors``.

A safetensors file is an 8-byte little-endian header length, a JSON header, then the tensor data. The
header maps each tensor name to ``{"dtype", "shape", "data_offsets": [start, end]}`` (offsets into the
data section) and may hold ``"__metadata__"``, a map of strings to strings. The reader (Rust) refuses a
header that does not add up; checking the same rules here, from the header alone, lets a download be
judged complete without reading the tensors, and turns every malformed header into one clear error
instead of a ``KeyError`` or ``TypeError`` from half-parsed JSON.
"""

from __future__ import annotations

import json
import struct
from typing import Any, BinaryIO

__all__ = ["DTYPE_SIZES", "MAX_HEADER_BYTES", "InvalidHeader", "read_header", "validate"]

# The safetensors reader's own limit (decimal, not 100 MiB): a larger header never loads.
MAX_HEADER_BYTES = 100_000_000
# Bytes per element of each dtype that safetensors reads into torch. The sub-byte formats (F4, F6_*) pack
# several elements per byte and have no torch dtype of their own; no Swin checkpoint uses them.
DTYPE_SIZES: dict[str, int] = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "F8_E8M0": 1,
    "F8_E4M3FNUZ": 1,
    "F8_E5M2FNUZ": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "C64": 8,
    "F64": 8,
    "I64": 8,
    "U64": 8,
}
_ENTRY_FIELDS = {"dtype", "shape", "data_offsets"}
_MAX_OFFSET = 2**64 - 1  # offsets are unsigned 64-bit in the format
_MAX_ELEMENTS = 2**63 - 1  # torch sizes are signed 64-bit


class InvalidHeader(ValueError):
    """The header is malformed or does not describe the file; the message says what is wrong."""


def read_header(handle: BinaryIO, file_size: int) -> tuple[int, dict[str, Any]]:
    """The header length and the parsed header of the safetensors file open in ``handle``, at its start.

    Reads only the header. Its length is checked against the file and the reader's limit before it is
    read, so a corrupt length cannot make this allocate gigabytes.
    """
    length_field = handle.read(8)
    if len(length_field) < 8:
        raise InvalidHeader(f"the file has {file_size} bytes, fewer than the 8-byte header length")
    (header_size,) = struct.unpack("<Q", length_field)
    if header_size > MAX_HEADER_BYTES:
        raise InvalidHeader(
            f"the header length field says {header_size} bytes, more than the {MAX_HEADER_BYTES} safetensors reads"
        )
    if header_size > file_size - 8:
        raise InvalidHeader(
            f"safetensors header of {header_size} bytes exceeds the file ({file_size} bytes; truncated download?)"
        )
    return header_size, _parse(handle.read(header_size))


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except RecursionError:
        raise InvalidHeader("unreadable safetensors header (JSON nested too deeply)") from None
    except ValueError as error:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise InvalidHeader(f"unreadable safetensors header ({error})") from None
    if not isinstance(header, dict):
        raise InvalidHeader(f"the safetensors header is a JSON {_json_type(header)}, not an object")
    return header


def _json_type(value: Any) -> str:
    """The JSON name of a parsed value's type, for messages about a header (written in JSON, not Python)."""
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object as a dict, refusing a repeated key: which of the two a reader keeps is up to the reader."""
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"the key {key!r} appears twice")
        result[key] = value
    return result


def validate(header: dict[str, Any], data_size: int) -> None:
    """Check that ``header`` is well formed and its tensors exactly cover the ``data_size`` bytes after it.

    The format requires the tensors to be contiguous: sorted by offset, each starts where the previous one
    ends, the first at 0 and the last at the end of the file. A gap or an overlap is a corrupt (or
    deliberately confusing) file; a shortfall at the end is a truncated download.
    """
    spans = []
    for name, info in header.items():
        _check_text(name, "a tensor name")
        if name == "__metadata__":
            _check_metadata(info)
        else:
            spans.append((*_entry_span(name, info), name))
    _check_coverage(sorted(spans), data_size)


def _check_text(text: str, what: str) -> None:
    """JSON allows lone surrogates (``"\\ud800"``) that the Rust reader refuses as not UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidHeader(f"{what} {text!r} is not valid UTF-8") from None


def _check_metadata(metadata: Any) -> None:
    if metadata is None:  # the reader treats null as absent
        return
    if not isinstance(metadata, dict):
        raise InvalidHeader(f"__metadata__ is a JSON {_json_type(metadata)}, not an object of strings")
    for key, value in metadata.items():
        if not isinstance(value, str):
            raise InvalidHeader(f"__metadata__[{key!r}] is a JSON {_json_type(value)}, not a string")
        _check_text(key, "a __metadata__ key")
        _check_text(value, f"__metadata__[{key!r}]")


def _entry_span(name: str, info: Any) -> tuple[int, int]:
    """The ``(start, end)`` of tensor ``name``'s data, after checking its entry against itself."""
    if not isinstance(info, dict):
        raise InvalidHeader(f"the entry of tensor {name!r} is a JSON {_json_type(info)}, not an object")
    missing, extra = _ENTRY_FIELDS - info.keys(), info.keys() - _ENTRY_FIELDS
    if missing or extra:
        problem = f"lacks {', '.join(sorted(missing))}" if missing else f"has unknown fields {sorted(extra)}"
        raise InvalidHeader(f"the entry of tensor {name!r} {problem}")
    itemsize = _itemsize(name, info["dtype"])
    elements = _elements(name, info["shape"])
    start, end = _offsets(name, info["data_offsets"])
    if end - start != elements * itemsize:
        raise InvalidHeader(
            f"tensor {name!r} ({info['dtype']}, shape {info['shape']}) needs {elements * itemsize} bytes but its "
            f"data_offsets {[start, end]} span {end - start}"
        )
    return start, end


def _itemsize(name: str, dtype: Any) -> int:
    if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
        raise InvalidHeader(
            f"tensor {name!r} has dtype {dtype!r}, not one of the safetensors dtypes this reads "
            f"({', '.join(DTYPE_SIZES)})"
        )
    return DTYPE_SIZES[dtype]


def _elements(name: str, shape: Any) -> int:
    """The element count; every running product must fit torch's 64-bit sizes, as the reader checks too."""
    if not isinstance(shape, list) or not all(_is_count(dim, _MAX_ELEMENTS) for dim in shape):
        raise InvalidHeader(f"tensor {name!r} has shape {shape!r}, not a list of non-negative integers")
    count = 1
    for dim in shape:
        count *= dim
        if count > _MAX_ELEMENTS:
            raise InvalidHeader(f"tensor {name!r} has shape {shape!r}, more elements than a tensor can hold")
    return count


def _offsets(name: str, offsets: Any) -> tuple[int, int]:
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o, _MAX_OFFSET) for o in offsets)):
        raise InvalidHeader(f"tensor {name!r} has data_offsets {offsets!r}, not two non-negative integers")
    start, end = offsets
    if end < start:
        raise InvalidHeader(f"tensor {name!r} has data_offsets {offsets!r}, which end before they start")
    return start, end


def _is_count(value: Any, largest: int) -> bool:
    # bool is an int in Python but not a number in JSON; 1.0 is a float in JSON, which the reader refuses.
    return type(value) is int and 0 <= value <= largest


def _check_coverage(spans: list[tuple[int, int, str]], data_size: int) -> None:
    covered = 0
    for start, end, name in spans:
        if start < covered:
            raise InvalidHeader(f"tensor {name!r} (bytes {start}-{end}) overlaps the tensor before it")
        if start > covered:
            raise InvalidHeader(f"bytes {covered}-{start} before tensor {name!r} belong to no tensor")
        covered = end
    if covered != data_size:
        raise InvalidHeader(
            f"the safetensors header describes {covered} bytes of tensor data but the file holds {data_size} "
            "after the header (truncated download?)"
        )
