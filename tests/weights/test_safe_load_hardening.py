"""Hostile checkpoint files: every one is refused with an error naming the file, never a KeyError,
RecursionError, MemoryError, hang or crash, and before the expensive step (unpickling, reading tensor data)
unless the test says the file can only be judged once loaded. Each file is made by hand in tmp_path."""

from __future__ import annotations

import builtins
import contextlib
import faulthandler
import io
import json
import math
import os
import pickle
import struct
import tempfile
import zipfile

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file as reference_load

from swin.weights import pickle_shape, safe_load
from swin.weights.safe_load import CorruptCheckpointError, UnsafeCheckpointError, check_file, load_file
from tests.weights.conftest import safetensors_bytes, torch_bytes

ENV = "SWIN_MAX_CHECKPOINT_BYTES"
MiB = 1024**2


@pytest.fixture(autouse=True)
def default_bound(monkeypatch):
    """No size bound from the environment of whoever runs the tests."""
    monkeypatch.delenv(ENV, raising=False)


# The running test's calls of the two readers that do the expensive work, unpickling (torch.load) and reading
# tensor data (safetensors' load_file), each with its keyword arguments; kept by the ``reads`` fixture.
_READS: list[tuple[str, dict]] = []


def spy(name, reader):
    """``reader``, its calls recorded in ``_READS``."""

    def reading(*args, **kwargs):
        _READS.append((name, kwargs))
        return reader(*args, **kwargs)

    return reading


@pytest.fixture(autouse=True)
def reads(monkeypatch):
    import safetensors.torch

    _READS.clear()
    monkeypatch.setattr(torch, "load", spy("torch.load", torch.load))
    monkeypatch.setattr(safetensors.torch, "load_file", spy("safetensors", safetensors.torch.load_file))
    return _READS


@contextlib.contextmanager
def hang_guard(seconds: float = 60):
    """A hang guard, not a speed target (pytest-timeout's thread method): should the call not return within
    ``seconds``, every thread's traceback is written and the test process ends."""
    faulthandler.dump_traceback_later(seconds, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def refused(path, error=CorruptCheckpointError, match=None, call=check_file, *, loaded=False):
    """``call(path)`` raises ``error``, with the file named in its message; the message.

    The refusal comes before the expensive step: nothing is unpickled or read by safetensors, or, with
    ``loaded`` (a file only its loaded contents give away), it is read once, weights-only.
    """
    before = len(_READS)
    with hang_guard(), pytest.raises(error, match=match) as caught:
        call(path)
    calls = _READS[before:]
    if loaded:
        assert len(calls) == 1, f"read {len(calls)} times: {calls}"
        assert calls[0][0] == "safetensors" or calls[0][1].get("weights_only") is True
    else:
        assert calls == [], f"refused only after reading it: {calls}"
    assert type(caught.value) is error  # not a bare KeyError/TypeError that happens to subclass nothing
    message = str(caught.value)
    assert str(path) in message
    return message


def both_refuse(path, match=None, error=CorruptCheckpointError, *, loaded=False):
    refused(path, error, match, check_file, loaded=loaded)
    return refused(path, error, match, load_file, loaded=loaded)


# ---------------------------------------------------------------------------------------------------------
# safetensors headers


def safetensors_file(header, data: bytes = b"") -> bytes:
    """A safetensors file from a header (dict, or raw JSON bytes) and the data section, built by hand."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


def f32(shape, start, end):
    return {"dtype": "F32", "shape": shape, "data_offsets": [start, end]}


DEEP_JSON = b'{"w": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"

# (header, data, does the safetensors reader itself refuse it?)
BAD_HEADERS = {
    "entry without data_offsets": ({"w": {"dtype": "F32", "shape": [2]}}, 8, True),
    "string entry": ({"w": "F32"}, 0, True),
    "dtype missing": ({"w": {"shape": [2], "data_offsets": [0, 8]}}, 8, True),
    "dtype not a string": ({"w": {"dtype": 4, "shape": [2], "data_offsets": [0, 8]}}, 8, True),
    "unknown dtype": ({"w": {"dtype": "F128", "shape": [2], "data_offsets": [0, 8]}}, 8, True),
    "lower-case dtype": ({"w": {"dtype": "f32", "shape": [2], "data_offsets": [0, 8]}}, 8, True),
    "shape missing": ({"w": {"dtype": "F32", "data_offsets": [0, 8]}}, 8, True),
    "shape a string": ({"w": f32("2", 0, 8)}, 8, True),
    "negative dim": ({"w": f32([-2], 0, 8)}, 8, True),
    "float dim": ({"w": f32([2.0], 0, 8)}, 8, True),
    "bool dim": ({"w": f32([True], 0, 4)}, 4, True),
    "dims overflow": ({"w": f32([2**40, 2**40, 0], 0, 0)}, 0, True),
    "negative offset": ({"w": f32([2], -8, 0)}, 8, True),
    "float offset": ({"w": f32([2], 0.0, 8)}, 8, True),
    "three offsets": ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8, 8]}}, 8, True),
    "end before start": ({"w": f32([0], 8, 4)}, 8, True),
    "size not shape x itemsize": ({"w": f32([3], 0, 8)}, 8, True),
    "overlapping tensors": ({"a": f32([2], 0, 8), "b": f32([1], 4, 8)}, 8, True),
    "gap between tensors": ({"a": f32([1], 0, 4), "b": f32([1], 8, 12)}, 12, True),
    "gap at the start": ({"w": f32([1], 4, 8)}, 8, True),
    "bytes after the last tensor": ({"w": f32([1], 0, 4)}, 8, True),
    "metadata a list": ({"__metadata__": ["format", "pt"], "w": f32([1], 0, 4)}, 4, True),
    "metadata value a number": ({"__metadata__": {"epoch": 3}, "w": f32([1], 0, 4)}, 4, True),
    "header a list": (b"[]", 0, True),
    "JSON nested 100k deep": (DEEP_JSON, 0, True),
    "not JSON": (b"{not json}", 0, True),
    "lone surrogate in a name": (b'{"\\ud800": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}', 4, True),
    # Accepted by the reader, refused here: which of two entries wins, or what an unknown field means, is
    # up to the reader; no writer produces either.
    "name twice": (b'{"w": ' + json.dumps(f32([1], 0, 4)).encode() + b', "w": {}}', 4, False),
    "unknown field": ({"w": {**f32([1], 0, 4), "quantized": True}}, 4, False),
    "entry a list": ({"w": ["F32", [2], [0, 8]]}, 8, False),  # serde reads a struct from an array, in order
}


@pytest.mark.parametrize("case", BAD_HEADERS, ids=list(BAD_HEADERS))
def test_malformed_safetensors_header_is_refused(tmp_path, case):
    header, data_size, reader_refuses = BAD_HEADERS[case]
    path = tmp_path / "model.safetensors"
    path.write_bytes(safetensors_file(header, b"\0" * data_size))
    both_refuse(path)
    if reader_refuses:  # the rule is the format's, not ours: safetensors refuses the same file
        with pytest.raises(Exception):  # noqa: B017 (SafetensorError, or whatever the reader trips on)
            reference_load(path)


def test_safetensors_header_length_beyond_file_or_reader_limit(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", 50) + b'{"w": {}}')  # 50 bytes of header in a 17-byte file
    assert "exceeds the file" in both_refuse(path)
    path.write_bytes(struct.pack("<Q", 1 << 40) + b'{"w": {}}')  # 1 TiB of it: nothing is allocated
    both_refuse(path)
    # 100,000,001 bytes of header in a (sparse) file large enough to hold it: the reader's own limit
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", 100_000_001) + b"{}")
        handle.truncate(8 + 100_000_001)
    both_refuse(path)
    with pytest.raises(Exception, match="too large"):  # noqa: B017
        reference_load(path)


def test_edge_cases_that_are_valid_pass_and_load_as_the_reader_loads_them(tmp_path):
    """Zero-size tensors (between others), scalars, metadata (or null metadata), space padding, an empty
    file: the header checks must not refuse what safetensors reads."""
    header = {
        "__metadata__": {"format": "pt"},
        "a": f32([2], 0, 8),
        "empty": f32([0, 5], 8, 8),
        "scalar": {"dtype": "BF16", "shape": [], "data_offsets": [8, 10]},
        "flags": {"dtype": "BOOL", "shape": [2, 1], "data_offsets": [10, 12]},
    }
    files = {
        "rich": safetensors_file(json.dumps(header).encode() + b"    ", bytes(range(12))),
        "null metadata": safetensors_file({"__metadata__": None, "w": f32([1], 0, 4)}, b"\0" * 4),
        "no tensors": safetensors_file({}),
        "written by safetensors": safetensors_bytes({"w": torch.arange(6.0).view(2, 3), "e": torch.zeros(0)}),
    }
    for name, body in files.items():
        path = tmp_path / f"{name}.safetensors"
        path.write_bytes(body)
        assert check_file(path) == "safetensors", name
        expected, loaded = reference_load(path), load_file(path)
        assert expected.keys() == loaded.keys() and all(torch.equal(expected[k], loaded[k]) for k in expected)


_ITEMSIZE = {"F32": 4, "F16": 2, "U8": 1, "I64": 8, "BOOL": 1, "F4": 1, "X": 4}


@st.composite
def nearly_valid_files(draw):
    """Tensors laid out back to back, then (mostly) one thing nudged: an offset, a dim, the data size."""
    entries, offset = {}, 0
    for name in draw(st.lists(st.sampled_from("abcd"), unique=True, max_size=3)):
        dtype, shape = draw(st.sampled_from(list(_ITEMSIZE))), draw(st.lists(st.integers(0, 3), max_size=3))
        size = _ITEMSIZE[dtype] * math.prod(shape)
        entries[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    data_size = offset
    nudge = draw(st.integers(-2, 2))
    target = draw(st.sampled_from(["none", "start", "end", "dim", "data"]))
    if entries and target in ("start", "end", "dim"):
        entry = entries[draw(st.sampled_from(sorted(entries)))]
        if target == "dim":
            entry["shape"] = [*entry["shape"], max(0, 1 + nudge)]
        else:
            entry["data_offsets"][target == "end"] += nudge
    elif target == "data":
        data_size = max(0, data_size + nudge)
    return entries, data_size


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=nearly_valid_files())
def test_check_file_passes_exactly_the_headers_that_load(case):
    """Random small headers: whatever passes check_file loads with safetensors, and (F4, whose packing this
    does not read, aside) whatever safetensors loads passes check_file."""
    entries, data_size = case
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "random.safetensors")
        with open(path, "wb") as handle:
            handle.write(safetensors_file(entries, b"\x01" * data_size))
        try:
            reference_load(path)
            reader_loads = True
        except Exception:
            reader_loads = False
        try:
            check_file(path)
            passes = True
        except CorruptCheckpointError as error:
            assert path in str(error)
            passes = False
        assert passes <= reader_loads
        if reader_loads and not any(e["dtype"] == "F4" for e in entries.values()):
            assert passes


def test_safetensors_load_errors_are_corrupt_not_safetensor_error(tmp_path, monkeypatch):
    """Should the reader refuse a file the header checks let through, load_file still says Corrupt."""
    from safetensors import SafetensorError

    path = tmp_path / "model.safetensors"
    path.write_bytes(safetensors_bytes({"w": torch.ones(3)}))

    def failing_reader(*args, **kwargs):
        raise SafetensorError("Error while deserializing header: something new")

    monkeypatch.setattr("safetensors.torch.load_file", spy("safetensors", failing_reader))
    assert "something new" in refused(path, call=load_file, loaded=True)


# ---------------------------------------------------------------------------------------------------------
# sizes: zip bombs and the bound


def rezip(body: bytes, *, deflate=(), replace=None, drop=()) -> bytes:
    """A torch.save zip rewritten member by member: ``deflate`` names (by suffix) to store deflated,
    ``replace`` maps a suffix to new contents, ``drop`` leaves members out."""
    source, out = zipfile.ZipFile(io.BytesIO(body)), io.BytesIO()
    with zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():
            if info.filename.endswith(tuple(drop)):
                continue
            data = source.read(info)
            for suffix, new in (replace or {}).items():
                data = new if info.filename.endswith(suffix) else data
            method = zipfile.ZIP_DEFLATED if info.filename.endswith(tuple(deflate)) else zipfile.ZIP_STORED
            target.writestr(info.filename, data, compress_type=method)
    return out.getvalue()


def deflate_bomb(body: bytes, member_suffix: str, inflated: int) -> bytes:
    """``body`` (a torch.save zip) with one member replaced by ``inflated`` bytes, deflated: its own bytes
    first, then zeros, streamed in 1 MiB chunks so that the test never holds them."""
    source, out = zipfile.ZipFile(io.BytesIO(body)), io.BytesIO()
    with zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():
            data = source.read(info)
            if not info.filename.endswith(member_suffix):
                target.writestr(info.filename, data)
                continue
            deflated = zipfile.ZipInfo(info.filename)
            deflated.compress_type = zipfile.ZIP_DEFLATED
            with target.open(deflated, "w") as member:
                member.write(data)
                for _ in range((inflated - len(data)) // MiB):
                    member.write(bytes(MiB))
    return out.getvalue()


def test_deflated_zip_that_inflates_enormously_is_refused_from_its_directory(tmp_path):
    """32 MiB of zeros deflate to about 32 KiB. torch.load would inflate them; the directory gives it away."""
    tensor = torch.zeros(8 * MiB)  # 32 MiB
    body = torch_bytes({"model": {"w": tensor}})
    bomb = tmp_path / "bomb.pth"
    bomb.write_bytes(rezip(body, deflate=["data/0"]))
    assert bomb.stat().st_size < MiB
    assert torch.load(bomb, weights_only=True)["model"]["w"].numel() == tensor.numel()  # a real bomb
    assert "inflates" in both_refuse(bomb)
    honest = tmp_path / "stored.pth"  # the same checkpoint as torch.save writes it: accepted
    honest.write_bytes(body)
    assert check_file(honest) == "zip"


def test_pickle_member_that_inflates_is_refused_before_it_is_read(tmp_path):
    """data.pkl is read for the checks themselves, so the directory must be judged before it."""
    path = tmp_path / "bomb.pth"
    path.write_bytes(deflate_bomb(torch_bytes({"w": torch.ones(2)}), "data.pkl", 64 * MiB))
    assert "data.pkl" in both_refuse(path, match="inflates")


def _claim_sizes(body: bytes, suffix: str, size: int) -> bytes:
    """``body`` with the central-directory entry of the member ending in ``suffix`` claiming ``size`` bytes,
    stored and inflated (what a crafted directory can say; nothing checks it before the member is read)."""
    data = bytearray(body)
    start = data.index(b"PK\x01\x02")  # the central directory follows all members
    while start != -1:
        name_length = struct.unpack_from("<H", data, start + 28)[0]
        if data[start + 46 : start + 46 + name_length].decode().endswith(suffix):
            struct.pack_into("<II", data, start + 20, size, size)
        start = data.find(b"PK\x01\x02", start + 46)
    return bytes(data)


def test_zip_directory_claiming_more_than_the_bound_is_refused(tmp_path):
    body = torch_bytes({"a": torch.ones(2), "b": torch.ones(2), "c": torch.ones(2)})
    for key in ("data/0", "data/1", "data/2"):  # three stored members of 3.75 GiB each: 11 GiB in all
        body = _claim_sizes(body, key, 0xF0000000)
    path = tmp_path / "claims.pth"
    path.write_bytes(body)
    message = both_refuse(path, match="inflates to")
    assert ENV in message


def test_bound_follows_the_environment(tmp_path, monkeypatch):
    """A 2 MiB checkpoint in each format: refused under a 1 MiB bound, accepted under 3 MiB."""
    weights = {"w": torch.ones(MiB // 2)}  # 2 MiB
    files = {
        "zip.pth": torch_bytes(weights),
        "model.safetensors": safetensors_bytes(weights),
        "old.pth": _old_style_torch_save(weights),
    }
    for name, body in files.items():
        path = tmp_path / name
        path.write_bytes(body)
        monkeypatch.setenv(ENV, "1M")
        assert ENV in both_refuse(path)
        for setting in ("3M", "3MiB", str(3 * MiB), " 3 mb "):
            monkeypatch.setenv(ENV, setting)
            assert torch.equal(load_file(path)["w"], weights["w"])


@pytest.mark.parametrize("setting", ["lots", "0", "-5", "1.5G", "8 parsecs"])
def test_a_bound_that_is_not_a_size_is_a_clear_error(tmp_path, monkeypatch, setting):
    path = tmp_path / "model.pth"
    path.write_bytes(torch_bytes({"w": torch.ones(2)}))
    monkeypatch.setenv(ENV, setting)
    with pytest.raises(ValueError, match=ENV) as caught:
        load_file(path)
    assert not isinstance(caught.value, CorruptCheckpointError)  # the setting is wrong, not the file


class _CountingFile:
    """A file opened by safe_load, every byte read from it added to ``counts``."""

    def __init__(self, handle, counts: list[int]) -> None:
        self._handle, self._counts = handle, counts

    def read(self, size: int = -1) -> bytes:
        data = self._handle.read(size)
        self._counts.append(len(data))
        return data

    def __getattr__(self, name):
        return getattr(self._handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._handle.close()


def test_check_file_reads_no_tensor_data(tmp_path, monkeypatch, reads):
    """check_file judges a zip by its directory and pickle, a safetensors file by its header: a zip whose
    tensor record is missing passes it (loading fails), and of a 2 GiB safetensors file it reads the header."""
    missing = tmp_path / "missing.pth"
    missing.write_bytes(rezip(torch_bytes({"w": torch.ones(4)}), drop=["data/0"]))
    assert check_file(missing) == "zip"
    refused(missing, call=load_file, loaded=True)
    big = tmp_path / "big.safetensors"
    header = json.dumps({"w": f32([512 * MiB], 0, 2048 * MiB)}).encode()
    with open(big, "wb") as handle:  # sparse: no disk, no memory
        handle.write(struct.pack("<Q", len(header)) + header)
        handle.truncate(8 + len(header) + 2048 * MiB)
    counts: list[int] = []
    monkeypatch.setattr(safe_load, "open", lambda *a, **k: _CountingFile(builtins.open(*a, **k), counts), raising=False)
    reads.clear()
    with hang_guard():
        assert check_file(big) == "safetensors"
    assert reads == []  # safetensors' reader never saw it
    assert 0 < sum(counts) <= 9 + 8 + len(header)  # the format sniff, the header length, the header


# ---------------------------------------------------------------------------------------------------------
# object graphs: cycles, depth, fan-out


def torch_zip_with_pickle(data_pkl: bytes) -> bytes:
    """A torch.save zip whose data.pkl is ``data_pkl``, written by hand."""
    return rezip(torch_bytes({}), replace={"data.pkl": data_pkl})


def _old_style_torch_save(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer, _use_new_zipfile_serialization=False)
    return buffer.getvalue()


def old_style_with_pickle(obj_pkl: bytes) -> bytes:
    """torch's old (non-zip) format, built by hand: magic number, protocol, system info, the object, the
    (empty) list of storages."""
    header = [0x1950A86A20F9469CFC6C, 1001, {"protocol_version": 1001, "little_endian": True, "type_sizes": {}}]
    return b"".join(pickle.dumps(part, protocol=2) for part in header) + obj_pkl + pickle.dumps([], protocol=2)


def deep_list(depth: int) -> bytes:
    """A pickle of a list nested ``depth`` deep (pickle.dumps itself would hit the recursion limit)."""
    return b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b"."


def deep_tuple_key(depth: int) -> bytes:
    """A pickle of ``{((...(),...),): 1}``: a dict keyed by a tuple nested ``depth`` deep."""
    return b"\x80\x02}" + b")" + b"\x85" * depth + b"K\x01s."


def test_dict_that_contains_itself_is_refused(tmp_path):
    cyclic = {}
    cyclic["model"] = cyclic
    path = tmp_path / "cycle.pth"
    path.write_bytes(torch_bytes(cyclic))
    assert path.stat().st_size < 2000
    loaded = torch.load(path, weights_only=True)  # torch builds it without complaint
    assert loaded["model"] is loaded
    both_refuse(path, match="contains itself")


def test_indirect_cycle_is_refused_but_shared_objects_are_not(tmp_path):
    outer = {"layers": []}
    outer["layers"].append({"parent": outer})
    path = tmp_path / "cycle.pth"
    path.write_bytes(torch_bytes(outer))
    both_refuse(path, match="contains itself")
    shared = {"w": torch.ones(2)}  # an EMA copy that is the same dict: shared, not cyclic
    path.write_bytes(torch_bytes({"model": shared, "model_ema": shared, "steps": [shared, shared]}))
    loaded = load_file(path)
    assert loaded["model"] is loaded["model_ema"] and torch.equal(loaded["model"]["w"], torch.ones(2))


@pytest.mark.parametrize("container", ["zip", "old-style"])
def test_list_nested_100k_deep_is_refused_not_a_recursion_error(tmp_path, container):
    path = tmp_path / "deep.pth"
    build = torch_zip_with_pickle if container == "zip" else old_style_with_pickle
    path.write_bytes(build(deep_list(100_000)))
    both_refuse(path, match="nested deeper than")


def test_deeply_nested_dict_key_is_refused_before_unpickling(tmp_path):
    """A million-deep tuple used as a dict key: hashing it while unpickling recurses in C and kills the
    interpreter with a segmentation fault (torch 2.14, Python 3.11), so it must never reach torch.load."""
    path = tmp_path / "key.pth"
    path.write_bytes(torch_zip_with_pickle(deep_tuple_key(1_000_000)))
    both_refuse(path, match="nested deeper than")


def test_nesting_that_real_checkpoints_have_is_accepted(tmp_path):
    """Dicts of dicts of lists of tuples, a dozen levels: well within the bound."""
    value = {"w": torch.ones(1)}
    for level in range(12):
        value = {f"level{level}": [(value,)]} if level % 2 else {f"level{level}": value}
    path = tmp_path / "nested.pth"
    path.write_bytes(torch_bytes(value))
    assert check_file(path) == "zip"
    assert torch.equal(_innermost(load_file(path))["w"], torch.ones(1))


def _innermost(value):
    while "w" not in value:
        (value,) = value.values()
        if isinstance(value, list):
            ((value,),) = value
    return value


def test_small_pickle_fanning_out_to_billions_of_paths_is_refused(tmp_path):
    """30 lists, each holding the previous one twice: 30 levels, 2**30 paths through them."""
    fan = []
    for _ in range(30):
        fan = [fan, fan]
    path = tmp_path / "fan.pth"
    path.write_bytes(torch_bytes({"model": fan}))
    assert path.stat().st_size < 4000
    both_refuse(path, match="objects")


@pytest.mark.parametrize(
    "data_pkl, torch_raises",
    [(b"\x80\x02a.", IndexError), (b"\x80\x02h\x05.", KeyError)],
    ids=["append to nothing", "memo entry never stored"],
)
def test_malformed_pickle_is_corrupt_not_an_index_or_key_error(tmp_path, data_pkl, torch_raises):
    path = tmp_path / "broken.pth"
    path.write_bytes(torch_zip_with_pickle(data_pkl))
    with pytest.raises(torch_raises):  # what torch.load itself raises on it
        torch.load(path, weights_only=True)
    both_refuse(path)


def test_loaded_objects_are_checked_too():
    """The walk over what was loaded, for structures the opcode scan never sees."""
    cyclic = [1, 2]
    cyclic.append({"back": (cyclic,)})
    deep = leaf = []
    for _ in range(pickle_shape.MAX_DEPTH):
        leaf.append([])
        leaf = leaf[0]
    with pytest.raises(pickle_shape.BadShape, match="contains itself"):
        pickle_shape.check_loaded(cyclic)
    with pytest.raises(pickle_shape.BadShape, match="nested deeper than"):
        pickle_shape.check_loaded(deep)
    shared = {"w": 1}
    pickle_shape.check_loaded({"a": shared, "b": [shared, (shared, shared)], "t": torch.ones(2)})


def test_unsafe_pickles_are_still_refused_before_unpickling(tmp_path):
    class Payload:
        def __reduce__(self):
            return (exec, ("raise SystemExit('payload ran')",))

    path = tmp_path / "evil.pth"
    path.write_bytes(torch_bytes({"model": {}, "x": Payload()}))
    assert "builtins.exec" in both_refuse(path, error=UnsafeCheckpointError)
    path.write_bytes(pickle.dumps({"model": {}, "x": Payload()}, protocol=2))
    # A plain pickle has no directory of globals: the weights-only unpickler stops at the global, unrun.
    both_refuse(path, error=UnsafeCheckpointError, loaded=True)


# ---------------------------------------------------------------------------------------------------------
# tensors larger in memory than in the file


@pytest.mark.parametrize("elements", [2**30, 2**42], ids=["4GiB", "16TiB"])
def test_view_that_repeats_one_value_is_refused_naming_its_key(tmp_path, elements):
    """``torch.zeros(1).expand(n)`` pickles to a few kilobytes (one stored value, stride 0) and passes every
    size bound on the file; anything that reads it (isfinite, a copy) then needs n values of memory."""
    path = tmp_path / "repeated.pth"
    path.write_bytes(torch_bytes({"model": {"ok": torch.ones(3), "blow_up": torch.zeros(1).expand(elements)}}))
    assert os.path.getsize(path) < 16 * 1024
    message = refused(path, call=load_file, loaded=True)
    assert "model.blow_up" in message and "repeats" in message and ".contiguous()" in message


def test_small_repeating_views_and_ordinary_views_still_load(tmp_path):
    """A few repeated values (a broadcast buffer of a kilobyte) and slices or transposes of a larger tensor
    are what real state dicts may hold; they load as saved."""
    base = torch.arange(12.0).reshape(3, 4)
    saved = {"broadcast": torch.ones(1).expand(256), "slice": base[1:], "transpose": base.t()}
    path = tmp_path / "views.pth"
    path.write_bytes(torch_bytes(saved))
    loaded = load_file(path)
    assert all(torch.equal(loaded[key], value) for key, value in saved.items())


def test_tensors_sharing_storage_count_towards_the_bound(tmp_path, monkeypatch):
    """Ten full views of one 4 MiB storage: a 4 MiB file that holds 40 MiB of tensors once loaded."""
    shared = torch.zeros(MiB)
    path = tmp_path / "shared.pth"
    path.write_bytes(torch_bytes({f"w{index}": shared.view(1024, 1024) for index in range(10)}))
    monkeypatch.setenv(ENV, "16M")
    message = refused(path, call=load_file, loaded=True)
    assert "40.0 MiB" in message and "16.0 MiB" in message and f"{ENV}=" in message
    monkeypatch.setenv(ENV, "64M")
    assert len(load_file(path)) == 10


# ---------------------------------------------------------------------------------------------------------
# torch's old (non-zip) format: storages are allocated as the pickle names them, before their data is read


def old_style_with_storages(claims: dict, stored: dict[str, bytes], storage_class=torch.FloatStorage) -> bytes:
    """An old-format file by hand: its object pickle names storages of ``storage_class`` ``key: numel`` (one
    tensor each), its key list and data hold only ``stored``."""

    class Claiming(pickle.Pickler):
        def persistent_id(self, obj):
            if isinstance(obj, (torch.storage.TypedStorage, torch.UntypedStorage)):
                key = next(pending)
                return ("storage", storage_class, key, "cpu", claims[key], None)
            return None

    pending = iter(claims)
    objects = io.BytesIO()
    # each tensor covers its storage, up to 16 elements (a claim of gigabytes must not be made here)
    Claiming(objects, protocol=2).dump({str(key): torch.zeros(min(numel, 16)) for key, numel in claims.items()})
    header = [0x1950A86A20F9469CFC6C, 1001, {"protocol_version": 1001, "little_endian": True, "type_sizes": {}}]
    parts = [pickle.dumps(part, protocol=2) for part in header] + [objects.getvalue()]
    parts.append(pickle.dumps(list(stored), protocol=2))
    parts += [struct.pack("<q", len(data) // 4) + data for data in stored.values()]
    return b"".join(parts)


def test_old_format_file_claiming_gigabytes_is_refused_before_anything_is_allocated(tmp_path):
    """A 300-byte file whose pickle names a 6 GiB storage: torch.load allocated the 6 GiB as it unpickled,
    before finding no data for it."""
    path = tmp_path / "claims.pth"
    path.write_bytes(old_style_with_storages({"k0": 3 * 2**29}, {}))
    assert os.path.getsize(path) < 1024
    message = both_refuse(path)
    assert "6.0 GiB" in message and "0 bytes follow" in message
    objects_end = len(old_style_with_storages({"k0": 3 * 2**29}, {})) - len(pickle.dumps([], protocol=2))
    path.write_bytes(old_style_with_storages({"k0": 3 * 2**29}, {})[: objects_end - 1])  # cut before its STOP
    assert "6.0 GiB" in both_refuse(path)


def test_old_format_storage_without_data_is_refused_not_loaded_as_uninitialized_memory(tmp_path):
    """torch.load fills only the storages its key list names; one it leaves out came back as whatever memory
    it was given, with no error."""
    data = struct.pack("<3f", 1.0, 2.0, 3.0)
    path = tmp_path / "unstored.pth"
    path.write_bytes(old_style_with_storages({"k0": 3, "k1": 1}, {"k0": data}))
    message = both_refuse(path)
    assert "'k1'" in message and "uninitialized" in message
    path.write_bytes(old_style_with_storages({"k0": 3}, {"k0": data}))  # the same file, complete: it loads
    assert load_file(path)["k0"].tolist() == [1.0, 2.0, 3.0]


def test_old_format_files_torch_writes_load_as_torch_loads_them(tmp_path):
    """Shared storages (counted once), views, several dtypes, an empty tensor: what torch.load itself gives."""
    base = torch.arange(12.0).reshape(3, 4)
    saved = {
        "a": base,
        "slice": base[1:],
        "t": base.t(),
        "half": torch.ones(5, dtype=torch.float16),
        "long": torch.arange(3),
        "empty": torch.zeros(0),
        "nested": {"bf16": torch.full((2, 2), 0.5, dtype=torch.bfloat16)},
    }
    path = tmp_path / "old.pth"
    path.write_bytes(_old_style_torch_save(saved))
    loaded = load_file(path)
    expected = torch.load(path, weights_only=True)
    assert loaded.keys() == expected.keys() == saved.keys()
    for key in ("a", "slice", "t", "half", "long", "empty"):
        assert loaded[key].dtype == expected[key].dtype and torch.equal(loaded[key], expected[key])
    assert torch.equal(loaded["nested"]["bf16"], expected["nested"]["bf16"])


@pytest.mark.parametrize(
    ("storage_class", "key"),
    [
        (torch.cuda.FloatStorage, "k0"),
        (torch.FloatStorage, None),
        (torch.FloatStorage, ("k", 0)),
        (torch.FloatStorage, 0.5),
    ],
    ids=["cuda-class", "None-key", "tuple-key", "float-key"],
)
def test_old_format_claims_are_counted_whatever_their_class_or_key(tmp_path, storage_class, key):
    """The weights-only reader takes torch.cuda storage classes (allocated on the CPU here) and any hashable
    key; each allocated 256 MiB of uninitialized memory and loaded."""
    path = tmp_path / "claims.pth"
    path.write_bytes(old_style_with_storages({key: 64 * MiB}, {}, storage_class))
    assert "256.0 MiB" in both_refuse(path)


def test_old_format_keys_read_one_way_here_and_another_by_torch_count_apart(tmp_path):
    """A SHORT_BINSTRING key is latin-1 to pickletools and utf-8 to torch: 'Ã©' in the pickle and the raw bytes
    c3 a9 are one key here, two storages (one unstored, 256 MiB) to torch."""
    one = struct.pack("<f", 1.0)
    data = old_style_with_storages({"\u00c3\u00a9": 1, "KEYX": 64 * MiB}, {"\u00c3\u00a9": one})
    binunicode = b"X\x04\x00\x00\x00KEYX"
    assert data.count(binunicode) == 1
    path = tmp_path / "keys.pth"
    path.write_bytes(data.replace(binunicode, b"U\x02\xc3\xa9"))
    assert "256.0 MiB" in both_refuse(path)


def test_an_opcode_claiming_more_bytes_than_memory_is_corrupt_not_a_memory_error(tmp_path):
    """BINBYTES8 with a length of 2**62: pickletools asks for all of it at once (a MemoryError escaped)."""
    path = tmp_path / "huge.pth"
    path.write_bytes(b"\x80\x04\x8e" + struct.pack("<Q", 2**62) + b"x" * 64)
    with pytest.raises((CorruptCheckpointError, UnsafeCheckpointError)):  # the weights-only reader refuses it
        load_file(path)
