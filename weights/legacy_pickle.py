"""What an old-format ``torch.save`` file (``_use_new_zipfile_serialization=False``) claims, read from its
opcodes before ``torch.load`` allocates anything.

That format is five pickles in a row (magic number, protocol, system info, the object, the list of storage
keys) and then each storage's bytes. The object pickle names every storage by a persistent id,
``('storage', torch.FloatStorage, key, location, numel, view)``, and ``torch.load`` allocates ``numel``
elements for it as it unpickles, before it reads a byte of the data that follows: a kilobyte file that
claims 6 GiB gets 6 GiB. A storage that the key list leaves out is never read at all, and loads as
whatever memory it was given. Here the pickles are followed with a small stack machine that keeps only
literals (numbers, strings, globals, tuples and lists of them), so that the claims can be set against the
bytes that follow the pickles and the key list. :mod:`.pickle_shape` has bounded the pickles' size and
shape first; nothing here imports or calls anything the file names.
"""

from __future__ import annotations

import pickletools
from dataclasses import dataclass
from typing import IO, Any

import torch

from .pickle_shape import UnpicklerStack

__all__ = ["Claims", "read_claims"]

MAGIC_NUMBER = 0x1950A86A20F9469CFC6C  # the first pickle of torch's old format

_OPAQUE = object()  # a value this reader does not keep (a dict, a rebuilt tensor...)
_LITERALS = {"NONE": None, "NEWFALSE": False, "NEWTRUE": True}
_NUMBERS_AND_STRINGS = frozenset("BININT BININT1 BININT2 BINFLOAT BINUNICODE LONG1".split())
_LARGEST_ELEMENT = 16  # bytes: complex128, the largest element a storage class has
_SMALL_TUPLES = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}


@dataclass(frozen=True)
class _Global:
    module: str
    name: str


@dataclass(eq=False)
class _Bytes:
    """A SHORT_BINSTRING: pickletools reads its bytes as latin-1, torch's unpickler as utf-8, so two of them
    are never taken for the same key here (each counts), unless the memo hands out the same one again."""

    text: str


@dataclass
class Claims:
    """The storages the object pickle names (key: bytes it allocates) and the keys whose data follows."""

    storages: dict[Any, int]
    stored_keys: list[Any] | tuple[Any, ...] | None  # None: not a sequence, or the pickles end early
    data_offset: int  # where the storages' bytes begin


def _element_size(storage_type: Any) -> int:
    """Bytes per element of a legacy storage class (``torch.FloatStorage``, ``torch.cuda.HalfStorage``: the
    weights-only reader takes both, and allocates either on the CPU here); the largest for any other."""
    modules = {"torch": torch, "torch.cuda": torch.cuda}
    if isinstance(storage_type, _Global) and storage_type.module in modules and storage_type.name.endswith("Storage"):
        cls = getattr(modules[storage_type.module], storage_type.name, None)
        dtype = getattr(cls, "_dtype", None)  # the legacy classes name theirs here (.dtype warns)
        if isinstance(dtype, torch.dtype):
            return torch._utils._element_size(dtype)
    return _LARGEST_ELEMENT


class _Machine(UnpicklerStack):
    """The unpickler's stack with literals kept (numbers, strings, globals, tuples and lists of them) and every
    other object opaque; the storage claims met on the way."""

    def __init__(self) -> None:
        super().__init__()
        self.storages: dict[Any, int] = {}

    def step(self, name: str, arg: Any) -> bool:
        """Apply one opcode; False at STOP or at an opcode torch's weights-only reader refuses."""
        if name in _NUMBERS_AND_STRINGS:
            self.stack.append(arg)
        elif name == "SHORT_BINSTRING":
            self.stack.append(_Bytes(arg))
        elif name in _LITERALS:
            self.stack.append(_LITERALS[name])
        elif name == "GLOBAL":
            module, _, attribute = str(arg).partition(" ")
            self.stack.append(_Global(module, attribute))
        elif name in ("EMPTY_TUPLE", "EMPTY_LIST"):
            self.stack.append(() if name == "EMPTY_TUPLE" else [])
        elif name in ("EMPTY_DICT", "EMPTY_SET"):
            self.stack.append(_OPAQUE)
        elif name in _SMALL_TUPLES:
            self.stack.append(tuple(self._pop(_SMALL_TUPLES[name])))
        elif name == "TUPLE":
            items = tuple(self._pop_mark())  # first: popping the mark replaces self.stack
            self.stack.append(items)
        elif name == "MARK":
            self.marks.append(self.stack)
            self.stack = []
        elif name == "APPEND":
            self._extend(self.stack[-2], self._pop(1))
        elif name == "APPENDS":
            items = self._pop_mark()
            self._extend(self.stack[-1], items)
        elif name == "BUILD":
            self._pop(1)
        elif name == "SETITEM":
            self._pop(2)
        elif name == "SETITEMS":
            self._pop_mark()
        elif name in ("REDUCE", "NEWOBJ"):
            self._pop(2)
            self.stack.append(_OPAQUE)
        elif name == "BINPERSID":
            self._claim(self._pop(1)[0])
            self.stack.append(_OPAQUE)
        elif name in ("BINGET", "LONG_BINGET"):
            self.stack.append(self.memo[arg])
        elif name in ("BINPUT", "LONG_BINPUT"):
            self.memo[arg] = self.stack[-1]
        elif name != "PROTO":
            return False  # STOP, or an opcode the weights-only reader refuses (it ends there too)
        return True

    def _claim(self, saved_id: Any) -> None:
        """Count a ``('storage', class, key, location, numel, view)`` id as torch allocates it: once per key
        (Python's dict equality, as torch's), whatever the class; ids torch fails on before allocating (another
        shape, an unhashable key, a numel that is no integer) allocate nothing."""
        if not (isinstance(saved_id, tuple) and len(saved_id) == 6):
            return
        typename, storage_type, key, _, numel, _ = saved_id
        if not (typename == "storage" or isinstance(typename, _Bytes) and typename.text == "storage"):
            return
        if type(numel) not in (int, bool):
            return
        try:
            self.storages.setdefault(key, max(int(numel), 0) * _element_size(storage_type))
        except TypeError:  # an unhashable key: torch's lookup of it fails too
            return

    @staticmethod
    def _extend(target: Any, items: list[Any]) -> None:
        if isinstance(target, list):
            target.extend(items)


def _run(stream: IO[bytes], machine: _Machine) -> tuple[bool, Any]:
    """One pickle from ``stream``'s position: (ended with STOP, the value it left)."""
    opcodes = pickletools.genops(stream)
    while True:
        try:
            opcode, arg, _ = next(opcodes)
        except (StopIteration, ValueError, MemoryError, OverflowError):  # the bytes end, are no opcode, or
            # claim more than there is (pickletools reads an argument whole): torch.load stops there too
            return False, _OPAQUE
        if not machine.step(opcode.name, arg):
            if opcode.name != "STOP":
                return False, _OPAQUE
            return True, machine.stack[-1] if machine.stack else _OPAQUE


def read_claims(stream: IO[bytes]) -> Claims | None:
    """The claims of the old-format file at ``stream`` (from its start); None where it is not one that
    ``torch.load`` reads as far as its storages (it refuses such a file before allocating them).

    Raises ``IndexError`` or ``KeyError`` for opcodes that do not fit together; the caller
    has scanned the same pickles with :mod:`.pickle_shape` and refused those already.
    """
    machine = _Machine()
    values = []
    for index in range(5):
        machine.stack, machine.marks, machine.memo = [], [], {}  # each pickle has its own
        ended, value = _run(stream, machine)
        if index == 0 and (not ended or value != MAGIC_NUMBER):
            return None  # a plain pickle: torch.load stops at the magic number
        if not ended:  # torch.load stops here too, having allocated what the object pickle claimed so far
            return Claims(storages=machine.storages, stored_keys=None, data_offset=stream.seek(0, 2))
        values.append(value)
    stored = values[4] if isinstance(values[4], (list, tuple)) else None
    return Claims(storages=machine.storages, stored_keys=stored, data_offset=stream.tell())
