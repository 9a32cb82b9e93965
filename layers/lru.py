"""A small thread-safe least-recently-used cache, bounded in entries and in bytes."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["BoundedLRU"]


class BoundedLRU:
    """Values (anything with an ``nbytes`` attribute: tensors, window plans) under hashable keys.

    Inference servers call one model from several threads, and a stream of distinct image sizes must not
    grow memory without bound: at most ``max_items`` entries and ``max_bytes`` in all (the newest entry is
    always kept, even alone over the byte budget, since the next call of the same size needs it).
    """

    def __init__(self, max_items: int = 16, max_bytes: int = 64 << 20):
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Hashable, Any] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        # Entries that must stay: never evicted or moved, with a byte budget of their own (see :meth:`pin`).
        self._pinned: dict[Hashable, Any] = {}
        self._pinned_bytes = 0
        # Whether anything is pinned, as a flag of its own: a compiled graph that reads it is guarded on its value,
        # which a later pin leaves as it is (the dict's truth value would guard its length, and every graph
        # compiled before a new size was pinned would compile again).
        self._any_pinned = False

    def pin(self, key: Hashable, value: Any) -> bool:
        """Keep ``value`` under ``key`` until :meth:`unpin_all`, if the pinned entries stay within
        ``max_bytes``; whether it is pinned. For values a compiled graph reads as constants: dynamo guards on
        each entry it read, so an evicted one would make it compile again. The first pinned value for a key
        stays (a dynamo guard holds the object it read)."""
        with self._lock:
            if key in self._pinned:
                return True
            if self._pinned_bytes + value.nbytes > self.max_bytes:
                return False
            self._pinned[key] = value
            self._pinned_bytes += value.nbytes
            self._any_pinned = True
            return True

    def unpin_all(self) -> None:
        """Drop every pinned entry (graphs that read one compile again if called)."""
        with self._lock:
            self._pinned = {}
            self._pinned_bytes = 0
            self._any_pinned = False

    def has_pinned(self) -> bool:
        """Whether anything is pinned (read before :meth:`pinned`, under a trace a lookup by a symbolic size would
        fix that size)."""
        return self._any_pinned

    def pinned(self, key: Hashable) -> Any:
        """The value pinned under ``key``, or None; reads nothing else and changes nothing."""
        return self._pinned.get(key)

    def get(self, key: Hashable) -> Any:
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
            return value

    def put(self, key: Hashable, value: Any) -> None:
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            self._entries[key] = value
            self._bytes += value.nbytes
            while len(self._entries) > 1 and (len(self._entries) > self.max_items or self._bytes > self.max_bytes):
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.nbytes

    def discard(self, stale: Callable[[Hashable], bool]) -> None:
        """Drop the entries whose key ``stale(key)`` says are of no more use; pinned entries stay."""
        with self._lock:
            for key in [key for key in self._entries if stale(key)]:
                self._bytes -= self._entries.pop(key).nbytes

    def clear(self) -> None:
        """Empty the cache; pinned entries stay."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Bytes of the cached entries (pinned ones not included)."""
        return self._bytes

    @property
    def pinned_nbytes(self) -> int:
        return self._pinned_bytes

    # Modules holding a cache are deep-copied and pickled (DDP, EMA copies); the copy starts empty. deepcopy
    # records the new object in its memo, so blocks that shared one cache share one in the copy too.
    def __deepcopy__(self, memo) -> BoundedLRU:
        return BoundedLRU(self.max_items, self.max_bytes)

    def __getstate__(self) -> dict:
        return {"max_items": self.max_items, "max_bytes": self.max_bytes}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["max_items"], state["max_bytes"])
