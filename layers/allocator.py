"""What the process's C allocator was told when it started: the one fact chunked CPU inference depends on.

glibc reads ``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` (or ``GLIBC_TUNABLES=glibc.malloc.
mmap_threshold=N:glibc.malloc.trim_threshold=N``) once, at start-up. With its defaults a block above 32 MiB is
mapped fresh from the kernel on every call and faults in page by page, which chunked inference avoids
(:func:`swin.layers.execution.image_chunks`); with both thresholds raised to at least a block's size, the block
stays in the process's heap between calls and pieces gain nothing (they cost the late stages' matrix products
some efficiency: docs/PERFORMANCE.md, the AVX2 machine of 2026-12-02).
"""

from __future__ import annotations

import functools
import os

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


@functools.cache
def heap_keeps_blocks_up_to() -> int:
    """Bytes up to which glibc keeps a freed block in the heap for the next call, as this process was started
    (:func:`read_heap_threshold`), read once: glibc never reads them again."""
    return read_heap_threshold()


def read_heap_threshold() -> int:
    """The smaller of glibc's mmap and trim thresholds where the process started with both set (environment or
    tunables), else 0 (its defaults, which return large blocks to the kernel)."""
    environment = startup_environment()
    # (GLIBC_TUNABLES from os.environ: glibc edits the start-up copy as it parses it)
    tunables = dict(t.partition("=")[::2] for t in os.environ.get("GLIBC_TUNABLES", "").split(":") if "=" in t)
    values = []
    for variable, tunable in _KEEPING:
        value = _bytes(tunables.get(tunable)) or _bytes(environment.get(variable))
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
