"""What the process's C allocator was told when it started: the one fact chunked CPU inference depends on.

glibc reads ``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` (or ``GLIBC_TUNABLES=glibc.malloc.
mmap_threshold=N:glibc.malloc.trim_threshold=N``) once, at start-up. With its defaults a block above 32 MiB is
mapped fresh from the kernel on every call and faults in page by page, which chunked inference avoids
(:func:`swin.layers.execution.image_chunks`); with both thresholds raised to at least a block's size, the block
stays in the process's heap between calls and pieces gain nothing (they cost the late stages' matrix products
some efficiency: docs/PERFORMANCE.md, the AVX2 machine of 2026-12-02). That holds in the main thread, where glibc
took the values (:func:`heap_keeps_blocks_up_to`).
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading

import torch

__all__ = ["heap_keeps_blocks_up_to", "read_heap_threshold", "startup_environment"]

# environment variable, GLIBC_TUNABLES name: the two settings that keep a large freed block in the heap
_KEEPING = (
    ("MALLOC_MMAP_THRESHOLD_", "glibc.malloc.mmap_threshold"),
    ("MALLOC_TRIM_THRESHOLD_", "glibc.malloc.trim_threshold"),
)


def startup_environment() -> dict[str, str]:
    """The environment the process started with (what the C library read), where Linux shows it; else now's."""
    try:
        with open("/proc/self/environ", "rb") as environ:
            entries = environ.read().split(b"\0")
    except OSError:
        return dict(os.environ)
    pairs = (entry.decode(errors="replace").partition("=") for entry in entries if b"=" in entry)
    return {key: value for key, _, value in pairs}


def heap_keeps_blocks_up_to() -> int:
    """Bytes up to which glibc keeps a block freed in this thread for its next call: the thresholds the process
    started with (:func:`read_heap_threshold`) where glibc took them, in the main thread only. glibc serves other
    threads from heaps of their own of at most 64 MiB, which map larger blocks fresh whatever the thresholds
    (found by a review: a 100 MiB block faulted in on every call from a worker thread, never from the main one)."""
    if threading.current_thread() is not threading.main_thread():
        return 0
    return _main_heap_keeps()


@functools.cache  # glibc never reads the settings again
def _main_heap_keeps() -> int:
    threshold = read_heap_threshold()
    return threshold if threshold and (threshold <= _CAPPED or _glibc_kept(threshold)) else 0


def read_heap_threshold() -> int:
    """The smaller of glibc's mmap and trim thresholds where the process started with both set (a tunable in
    ``GLIBC_TUNABLES`` over its environment variable, as glibc reads them), else 0 (its defaults, which return
    large blocks to the kernel)."""
    environment = startup_environment()
    # (GLIBC_TUNABLES from os.environ: glibc edits the start-up copy as it parses it)
    tunables = dict(t.partition("=")[::2] for t in os.environ.get("GLIBC_TUNABLES", "").split(":") if "=" in t)
    values = []
    for variable, tunable in _KEEPING:
        value = _bytes(tunables[tunable]) if tunable in tunables else _bytes(environment.get(variable))
        if not value:
            return 0
        values.append(value)
    return min(values)


def _bytes(text: str | None) -> int:
    """A threshold as glibc parses it (decimal, or 0x hexadecimal); 0 where it is not a number."""
    try:
        return max(0, int(text, 0)) if text else 0
    except ValueError:
        return 0


# glibc's largest default mmap threshold on 64-bit; some glibc releases refuse a setting above it (the variable
# is then ignored; 2.36 here takes it), so a larger one is trusted only once a block of that size stayed in the
# heap (:func:`_glibc_kept`)
_CAPPED = 32 << 20


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")
    ] + [("keepcost", ctypes.c_size_t)]


def _glibc_kept(threshold: int) -> bool:
    """Whether glibc serves a block above its default cap, up to ``threshold``, from the heap (not a fresh
    mapping): ``mallinfo2().hblkhd``, the bytes in mapped blocks, around an untouched allocation. False where the
    C library is not glibc 2.33 or later (no ``mallinfo2``)."""
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return False
    mallinfo2.restype = _Mallinfo2
    size = min(threshold, 2 * _CAPPED)
    before = mallinfo2().hblkhd
    # through the allocator of every CPU tensor, whatever the default device; never written, so never faulted in
    block = torch.empty(size, dtype=torch.uint8, device="cpu")
    mapped = mallinfo2().hblkhd - before
    del block
    return mapped < size
