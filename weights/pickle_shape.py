"""Refusing pickles whose objects contain themselves or nest absurdly deep, before and after unpickling.

A checkpoint is a shallow tree: a dict of a few dicts of tensors. A pickle can describe any graph, though:
``d = {}; d["model"] = d`` pickles to a kilobyte and loads as a dict that contains itself, on which any
recursive walk (printing, converting, comparing) never ends. Deep nesting is worse: ``torch.load`` builds
a tuple nested a million deep without complaint, but hashing it as a dict key recurses in C and crashes
the interpreter (a segmentation fault, not an exception) in the middle of unpickling.

So :func:`scan` reads the pickle's opcodes first and works out the graph they would build (which object
holds which), without building it; a cycle, a depth beyond :data:`MAX_DEPTH` or more than
:data:`MAX_OBJECTS` objects (counting a shared object once per reference, so that a small pickle cannot
fan out into billions of paths) is refused before a single object exists. The model is conservative: an
object built by a call holds its arguments. After loading, :func:`check_loaded` walks the actual
containers once more with the same bounds, iteratively, so that nothing downstream has to.
"""

from __future__ import annotations

import itertools
import pickletools
from collections.abc import Iterator
from typing import IO, Any

__all__ = ["MAX_DEPTH", "MAX_OBJECTS", "BadShape", "UnpicklerStack", "check_loaded", "scan"]

MAX_DEPTH = 32
MAX_OBJECTS = 2_000_000

_LEAF = -1  # a value that holds nothing (number, string, global); graph nodes are numbered from 0
# The opcodes torch's weights-only unpickler accepts, by what they do to the graph. It refuses any other
# opcode when it reaches it, so the scan stops there too: nothing after it is ever built.
_SCALARS = frozenset(
    "GLOBAL NONE NEWFALSE NEWTRUE BININT BININT1 BININT2 BINFLOAT BINUNICODE SHORT_BINSTRING LONG1".split()
)
_EMPTIES = frozenset("EMPTY_TUPLE EMPTY_LIST EMPTY_DICT EMPTY_SET".split())
_SMALL_TUPLES = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}


class BadShape(ValueError):
    """The pickled objects contain themselves, nest too deep or are too many; the message says which."""


def _cycle() -> BadShape:
    return BadShape("contains itself (a container that holds itself, directly or through others)")


def _too_deep() -> BadShape:
    return BadShape(f"is nested deeper than {MAX_DEPTH} levels")


def _too_many() -> BadShape:
    return BadShape(f"holds more than {MAX_OBJECTS:,} objects (counting each reference to a shared one)")


class _Graph:
    """Which object holds which, for the objects that can hold others; heights are lower bounds until
    :meth:`check` computes them exactly (objects can gain members after they were put somewhere)."""

    def __init__(self) -> None:
        self.members: list[list[int]] = []
        self.height: list[int] = []
        self.objects = 0

    def leaf(self) -> int:
        self._count()
        return _LEAF

    def node(self, members: list[int]) -> int:
        self._count()
        self.members.append([])
        self.height.append(1)
        node = len(self.members) - 1
        if members:  # most nodes start empty (EMPTY_DICT, EMPTY_LIST): skip the work
            self.link(node, members)
        return node

    def link(self, node: int, members: list[int]) -> None:
        if node == _LEAF:  # appending to a number: the unpickler refuses it; nothing to record
            return
        if node in members:
            raise _cycle()
        self.members[node].extend(members)
        inner = max((self.height[m] for m in members if m != _LEAF), default=0)
        self.height[node] = max(self.height[node], inner + 1)
        if self.height[node] > MAX_DEPTH:
            raise _too_deep()

    def _count(self) -> None:
        self.objects += 1
        if self.objects > MAX_OBJECTS:
            raise _too_many()

    def check(self) -> None:
        """Exact heights and reference counts of every node, depth first without recursion; refuses cycles."""
        state = bytearray(len(self.members))  # 0: not reached, 1: on the current path, 2: done
        sizes = [0] * len(self.members)
        for start in range(len(self.members)):
            if state[start]:
                continue
            state[start] = 1
            path = [(start, iter(self.members[start]))]
            while path:
                node, pending = path[-1]
                for member in pending:
                    if member != _LEAF and state[member] == 1:
                        raise _cycle()
                    if member != _LEAF and state[member] == 0:
                        state[member] = 1
                        path.append((member, iter(self.members[member])))
                        break
                else:
                    path.pop()
                    state[node] = 2
                    self._finish(node, sizes)

    def _finish(self, node: int, sizes: list[int]) -> None:
        members = [m for m in self.members[node] if m != _LEAF]
        self.height[node] = 1 + max((self.height[m] for m in members), default=0)
        sizes[node] = 1 + len(self.members[node]) - len(members) + sum(sizes[m] for m in members)
        if self.height[node] > MAX_DEPTH:
            raise _too_deep()
        if sizes[node] > MAX_OBJECTS:
            raise _too_many()


class UnpicklerStack:
    """The unpickler's stack, marks and memo, holding whatever stands for its objects: what a reader that
    follows the opcodes without building objects needs (this module's scan, :mod:`.legacy_pickle`)."""

    def __init__(self) -> None:
        self.stack: list[Any] = []
        self.marks: list[list[Any]] = []
        self.memo: dict[int, Any] = {}

    def _pop(self, count: int) -> list[Any]:
        if len(self.stack) < count:
            raise IndexError("the stack is empty")
        items = self.stack[len(self.stack) - count :]
        del self.stack[len(self.stack) - count :]
        return items

    def _pop_mark(self) -> list[Any]:
        items = self.stack
        self.stack = self.marks.pop()
        return items


class _Scanner(UnpicklerStack):
    """Follows the unpickler's stack, memo and marks, with graph nodes in place of objects."""

    def __init__(self) -> None:
        super().__init__()
        self.graph = _Graph()

    def step(self, name: str, arg: Any) -> bool:
        """Apply one opcode; False once the pickle ends or the unpickler would refuse the opcode."""
        graph = self.graph
        if name in _SCALARS:
            self.stack.append(graph.leaf())
        elif name in _EMPTIES:
            self.stack.append(graph.node([]))
        elif name in _SMALL_TUPLES:
            self.stack.append(graph.node(self._pop(_SMALL_TUPLES[name])))
        elif name == "TUPLE":
            node = graph.node(self._pop_mark())  # first: popping the mark replaces self.stack
            self.stack.append(node)
        elif name == "MARK":
            self.marks.append(self.stack)
            self.stack = []
        elif name in ("APPEND", "BUILD"):  # list.append(item); obj.__setstate__(state)
            graph.link(self.stack[-2], self._pop(1))
        elif name == "SETITEM":
            graph.link(self.stack[-3], self._pop(2))
        elif name in ("APPENDS", "SETITEMS"):
            members = self._pop_mark()
            graph.link(self.stack[-1], members)
        elif name in ("REDUCE", "NEWOBJ"):  # func(*args), cls.__new__(cls, *args): the result may keep args
            self.stack.append(graph.node(self._pop(2)))
        elif name == "BINPERSID":  # a storage, from its id
            self.stack.append(graph.node(self._pop(1)))
        elif name in ("BINGET", "LONG_BINGET"):
            self.stack.append(self.memo[arg])
        elif name in ("BINPUT", "LONG_BINPUT"):
            self.memo[arg] = self.stack[-1]
        elif name == "STOP":
            self._pop(1)
            return False
        elif name != "PROTO":
            return False  # the weights-only unpickler refuses this opcode here: nothing after it is built
        return True

    def run(self, stream: IO[bytes]) -> bool:
        """Step through the pickle at ``stream``; True if it ended with STOP."""
        opcodes = pickletools.genops(stream)
        while True:
            try:
                opcode, arg, position = next(opcodes)
            except (StopIteration, ValueError, MemoryError, OverflowError):
                # ValueError: not a pickle opcode, or its argument cut short; MemoryError / OverflowError: an
                # argument claiming more bytes than there is memory (pickletools asks for all of them at once)
                return False
            try:
                if not self.step(opcode.name, arg):
                    return opcode.name == "STOP"
            except (IndexError, KeyError):
                raise BadShape(f"is malformed: {opcode.name} at byte {position} refers to nothing") from None


def scan(stream: IO[bytes]) -> bool:
    """Check the graph that the pickle at ``stream``'s position would build; True if it ended with STOP.

    Reads up to the pickle's STOP opcode and no further, so a file holding several pickles (torch's old
    format) can be scanned one after another. Bytes the unpickler could not read either (an unknown or
    unsupported opcode, a truncated argument) end the scan early, where unpickling would fail too.
    """
    scanner = _Scanner()
    ended = scanner.run(stream)
    scanner.graph.check()
    return ended


def _members(value: Any) -> Iterator[Any] | None:
    """What a container holds (a dict's keys and values), or None for anything else (tensors included)."""
    if isinstance(value, dict):
        return itertools.chain.from_iterable(value.items())
    if isinstance(value, (list, tuple, set, frozenset)):
        return iter(value)
    return None


def check_loaded(root: Any) -> None:
    """Refuse a loaded object whose containers contain themselves, nest deeper than :data:`MAX_DEPTH` or
    hold more than :data:`MAX_OBJECTS` values; depth first with an explicit stack, so never a RecursionError.

    :func:`scan` has already refused such pickles unless an allowed constructor linked objects in a way its
    model does not foresee; this checks the result itself, which is what callers walk.
    """
    pending = _members(root)
    if pending is None:
        return
    path, on_path, seen = [(root, pending)], {id(root)}, 1
    while path:
        for value in path[-1][1]:
            seen += 1
            if seen > MAX_OBJECTS:
                raise _too_many()
            inner = _members(value)
            if inner is None:
                continue
            if id(value) in on_path:
                raise _cycle()
            if len(path) >= MAX_DEPTH:
                raise _too_deep()
            path.append((value, inner))
            on_path.add(id(value))
            break
        else:
            on_path.discard(id(path.pop()[0]))
