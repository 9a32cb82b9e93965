"""Fused window attention for bfloat16 inference on CPUs with AVX512-BF16 (``window_attention.cpp``).

What it replaces: ATen's fused SDPA kernel is slow per (window, head) pair at Swin's 49-token windows in
bfloat16, and two batched matmuls around a softmax write and read the (windows, heads, N, N) scores through
memory four times. This kernel computes each (image, window, head)'s scores, softmax and weighted sum of
values in the core's cache, with the scores and the softmax in float32 (closer to float32 attention than the
bf16-rounded scores of the matmul path). What it gains: docs/PERFORMANCE.md; ``SWIN_FUSED_ATTENTION=0`` turns
it off (for comparison, or to rule it out).

How it is built: on first use, with the C++ compiler ``torch.compile`` uses on CPU (``$CXX``, else ``c++``),
into torch's extension cache (``$TORCH_EXTENSIONS_DIR``, else ``$XDG_CACHE_HOME/torch_extensions``, else
``~/.cache/torch_extensions``; a ``swin`` folder there), named by a hash of the source, the flags and the
compiler's version; written under a temporary name and renamed, so that a killed build or two processes building
at once never leave a half-written library (a killed build's folder is removed by a later build; a cache that
cannot be written, or whose libraries do not load, as on a noexec mount: a private directory for the process,
removed at exit). It has no torch headers
(a few seconds to build) and is loaded with ctypes; its OpenMP threads are torch's own pool (the libgomp
torch loaded). Where it cannot be built (no compiler, one too old for AVX512-BF16) a warning says so once,
and attention keeps the matmul path.

It is called through the custom op ``swin::window_attention``, so that ``torch.compile`` (``swin.optimize``)
keeps it as one call in the graph, and only where the answer needs no autograd (no grad wanted, or nothing
requiring it), on plain CPU tensors, under no ``TorchDispatchMode`` (FLOP counters and fake tensors see the
aten ops of the other path), and for what the kernel covers (:func:`supports`).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import glob
import hashlib
import logging
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
import warnings
from importlib import resources

import torch

__all__ = ["ENABLED", "available", "supports", "window_attention"]

# False: never used (SWIN_FUSED_ATTENTION=0, or false / off / no, in the environment sets it).
ENABLED: bool = os.environ.get("SWIN_FUSED_ATTENTION", "").strip().lower() not in ("0", "false", "off", "no")

_FLAGS = (
    "-O3",
    "-std=c++17",
    "-mavx512f",
    "-mavx512bw",
    "-mavx512vl",
    "-mavx512dq",
    "-mavx512bf16",
    "-mfma",
    "-fopenmp",
    "-fPIC",
    "-shared",
)
_SYMBOL = "swin_window_attention_bf16"
_COMPILE_TIMEOUT_S = 600
_ABANDONED_S = 2 * _COMPILE_TIMEOUT_S  # a .build- folder older than this was left by a killed process
_MAX_TOKENS = 256
_LOG = logging.getLogger("swin")

_LOCK = threading.Lock()
# The loaded library's entry point once built; READY mirrors it as a plain bool that code traced by
# torch.compile can read (it never builds there).
_function = None
_failed: str | None = None
READY = False


def _cpu_has_bf16_dot() -> bool:
    capabilities = getattr(torch.cpu, "get_capabilities", None)
    return bool(capabilities and capabilities().get("avx512_bf16"))


def _cache_dir() -> str:
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(base, "torch_extensions")
    return os.path.join(root, "swin")


def _compiler() -> list[str]:
    """``$CXX`` as a command (``ccache g++`` is two words), else ``c++``."""
    return shlex.split(os.environ.get("CXX", "")) or ["c++"]


def _build(private: bool = False) -> str:
    """The library's path, built if this source, flags and compiler have not built it before; ``private``: built
    into a directory of this process's own (removed at exit), also where the cache cannot be written."""
    source = resources.files(__package__).joinpath("window_attention.cpp").read_bytes()
    compiler = _compiler()
    try:
        version = subprocess.run([*compiler, "--version"], capture_output=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as error:
        raise RuntimeError(f"no working C++ compiler {' '.join(compiler)!r} ({error}); set CXX to one") from error
    key = hashlib.sha256(source + " ".join(_FLAGS).encode() + version).hexdigest()[:16]
    name = f"window_attention_{key}.so"
    if not private:
        path = os.path.join(_cache_dir(), name)
        if os.path.isfile(path) and _intact(path):
            return path
        try:
            return _compile(compiler, source, path)
        except OSError as error:  # the cache cannot be written: a private directory, for this process
            _LOG.warning("swin: cannot write the kernel cache (%s); building into a private directory", error)
    scratch = tempfile.mkdtemp(prefix="swin-kernel-")
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)
    return _compile(compiler, source, os.path.join(scratch, name))


def _compile(compiler: list[str], source: bytes, path: str) -> str:
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=directory, prefix=".build-") as work:
        src = os.path.join(work, "window_attention.cpp")
        with open(src, "wb") as f:
            f.write(source)
        out = os.path.join(work, "window_attention.so")
        run = subprocess.run(
            [*compiler, *_FLAGS, src, "-o", out], capture_output=True, text=True, timeout=_COMPILE_TIMEOUT_S
        )
        if run.returncode:
            tail = " ".join(run.stderr.strip().splitlines()[-3:])
            raise RuntimeError(f"{' '.join(compiler)} failed: {tail}")
        if not os.path.isfile(out):
            raise RuntimeError(f"{' '.join(compiler)} exited without error but wrote no library")
        with open(out, "rb") as f:
            os.fsync(f.fileno())  # on disk before it has its name: a crash cannot leave a named, truncated file
        digest = os.path.join(work, "digest")
        with open(digest, "w") as f:
            f.write(_sha256(out))
            f.flush()
            os.fsync(f.fileno())
        os.replace(out, path)  # the finished library appears at once, or not at all
        os.replace(digest, path + _DIGEST)  # and then what it must hash to (see _intact)
    stale = glob.glob(os.path.join(directory, "window_attention_*.so"))  # other sources' or compilers'
    for old in [*stale, *(name + _DIGEST for name in stale)]:
        if old not in (path, path + _DIGEST):
            with contextlib.suppress(OSError):
                os.remove(old)  # a process that has it loaded keeps its mapping
    # build folders of processes killed while building (a live build is younger than its compiler's timeout)
    for work in glob.glob(os.path.join(directory, ".build-*")):
        with contextlib.suppress(OSError):
            if time.time() - os.path.getmtime(work) > _ABANDONED_S:
                shutil.rmtree(work)
    _LOG.info("swin: built the fused window-attention kernel in %.1f s: %s", time.perf_counter() - start, path)
    return path


# Beside each library: the sha256 it was written with. A library cut short by a copy or a full disk maps pages
# past the end of its file, and the first call into it kills the process (SIGBUS): it is checked before loading.
_DIGEST = ".sha256"


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _intact(path: str) -> bool:
    """Whether the cached library is the file its build wrote (its recorded sha256; none recorded: not known)."""
    try:
        with open(path + _DIGEST) as f:
            return f.read().strip() == _sha256(path)
    except OSError:
        return False


def _load() -> ctypes._CFuncPtr:
    """The kernel's function, built if needed. A library from the cache that does not load (its directory
    mounted noexec, a file placed at its name) is built again into a private directory for this process; one
    that does not load there either is a RuntimeError."""
    path = _build()
    try:
        return getattr(ctypes.CDLL(path), _SYMBOL)
    except (OSError, AttributeError) as error:
        _LOG.warning("swin: the fused-attention kernel %s does not load (%s); building a private copy", path, error)
    path = _build(private=True)
    try:
        return getattr(ctypes.CDLL(path), _SYMBOL)
    except (OSError, AttributeError) as error:
        raise RuntimeError(f"it was built but does not load ({error})") from error


def available() -> bool:
    """Whether the kernel can run here (CPU with AVX512-BF16, enabled), building and loading it on the first
    call. A build that fails warns once and is not tried again in this process."""
    global _function, _failed, READY
    if not ENABLED or not _cpu_has_bf16_dot():
        return False
    if _function is not None or _failed is not None:
        return _function is not None
    with _LOCK:
        if _function is None and _failed is None:
            try:
                function = _load()
            except (OSError, RuntimeError, AttributeError, subprocess.SubprocessError) as error:
                _failed = str(error)
                warnings.warn(
                    f"swin: the fused bf16 window-attention kernel could not be built or loaded ({_failed}); attention "
                    "runs as two matmuls and a softmax instead (slower). Set SWIN_FUSED_ATTENTION=0 to silence "
                    "this.",
                    stacklevel=3,
                )
                return False
            pointer, integer = ctypes.c_void_p, ctypes.c_int
            function.argtypes = [pointer] * 6 + [integer] * 5 + [pointer, pointer, integer, ctypes.c_float]
            function.argtypes += [pointer, integer]
            function.restype = integer
            _function = function
            READY = True
    return True


def supports(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float) -> bool:
    """Whether this call is one the kernel computes: bfloat16 (B, nW, heads, N, d) q, k, v on CPU, d a
    multiple of 32 up to 128, N up to 256, no dropout; not a negated view (``torch._neg_view``: the kernel reads
    the memory, which holds the values before negation)."""
    head_dim, tokens = q.shape[-1], q.shape[-2]
    return (
        not dropout
        and q.device.type == "cpu"
        and all(t.dtype == torch.bfloat16 for t in (q, k, v))
        # (traced tensors are never such views, and asking would break the graph)
        and (torch.compiler.is_compiling() or not any(t.is_neg() or t.is_conj() for t in (q, k, v)))
        and head_dim % 32 == 0
        and 32 <= head_dim <= 128
        and 1 <= tokens <= _MAX_TOKENS
    )


def window_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """softmax(q k^T * scale + bias + mask) v for bfloat16 (B, nW, heads, N, d) q, k, v, a float32 (heads, N, N)
    position bias and a float32 (nW or 1, N, N) shift mask or None; (B, nW, N, heads*d) bfloat16, the heads'
    outputs side by side. No autograd: call it where none is needed. Traced (``torch.compile``), the custom op
    ``swin::window_attention``; eager, the kernel directly (the op's dispatch costs more than a small call)."""
    if torch.compiler.is_compiling():
        return torch.ops.swin.window_attention(q, k, v, bias, mask, scale)
    if torch.autograd._profiler_enabled():  # named in a profile, as the op would be
        with torch.autograd.profiler.record_function("swin::window_attention"):
            return _run(q, k, v, bias, mask, scale)
    return _run(q, k, v, bias, mask, scale)


@torch.library.custom_op("swin::window_attention", mutates_args=(), device_types="cpu")
def _window_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    return _run(q, k, v, bias, mask, scale)


@_window_attention.register_fake
def _(q, k, v, bias, mask, scale):
    _check(q, k, v, bias, mask)
    batch, windows, heads, n, head_dim = q.shape
    return q.new_empty(batch, windows, n, heads * head_dim)


def _run(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    _check(q, k, v, bias, mask)
    if not available():
        raise RuntimeError(
            "swin::window_attention: the fused kernel is not available here (it needs a CPU with AVX512-BF16 "
            f"and a C++ compiler{'; ' + _failed if _failed else ''})"
        )
    batch, windows, heads, n, head_dim = q.shape
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    bias = bias.contiguous()
    mask = mask.contiguous() if mask is not None else None
    out = torch.empty(batch, windows, n, heads * head_dim, dtype=q.dtype, device=q.device)
    strides = [(ctypes.c_int64 * 4)(*t.stride()[:4]) for t in (q, k, v)]
    status = _function(
        q.data_ptr(),
        k.data_ptr(),
        v.data_ptr(),
        *strides,
        batch,
        windows,
        heads,
        n,
        head_dim,
        bias.data_ptr(),
        mask.data_ptr() if mask is not None else None,
        mask.shape[0] if mask is not None else 1,
        scale,
        out.data_ptr(),
        torch.get_num_threads(),
    )
    if status:
        raise RuntimeError(f"swin::window_attention: the kernel refused q {tuple(q.shape)} (status {status})")
    return out


def _check(q, k, v, bias, mask) -> None:
    if q.dim() != 5 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(
            f"swin::window_attention: q, k, v must be (B, nW, heads, N, d) of one shape, got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    batch, windows, heads, n, head_dim = q.shape
    devices = {t.device.type for t in (q, k, v, bias, mask) if t is not None}
    if devices != {"cpu"}:
        raise ValueError(f"swin::window_attention: runs on CPU tensors, got tensors on {sorted(devices)}")
    if not supports(q, k, v, 0.0):
        raise ValueError(
            f"swin::window_attention: takes bfloat16 CPU q, k, v with head_dim a multiple of 32 up to 128 and up "
            f"to {_MAX_TOKENS} tokens, got {q.dtype} on {q.device}, head_dim {head_dim}, {n} tokens"
        )
    if bias.shape != (heads, n, n) or bias.dtype != torch.float32:
        raise ValueError(
            f"swin::window_attention: bias must be float32 ({heads}, {n}, {n}), got {bias.dtype} {tuple(bias.shape)}"
        )
    if mask is not None and (
        mask.dim() != 3 or mask.shape[0] not in (1, windows) or mask.shape[1:] != (n, n) or mask.dtype != torch.float32
    ):
        raise ValueError(
            f"swin::window_attention: mask must be float32 (1 or {windows}, {n}, {n}), got "
            f"{mask.dtype} {tuple(mask.shape)}"
        )
