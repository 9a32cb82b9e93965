"""What a timing was measured on: printed with every ``swin bench`` table (a figure without its machine is
not comparable with another)."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
from typing import Any

import torch

from swin.layers.allocator import startup_environment

__all__ = ["allocator", "describe", "machine_info"]


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


# glibc reads these once, when the process starts (setting any of the first four turns off its adjustment of the
# thresholds); GLIBC_TUNABLES can set the same (glibc.malloc.*).
_GLIBC_MALLOC_ENV = (
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
    "MALLOC_ARENA_MAX",
)


def allocator() -> str:
    """The C allocator under torch's CPU tensors and the settings it started with. A timing depends on it: with
    glibc's defaults, memory freed at the end of a call at batch 8 goes back to the OS and the next call takes it
    again, page by page (docs/PERFORMANCE.md, "memory handed back between calls"). jemalloc, tcmalloc or mimalloc
    when one is loaded into the process (preloaded, as is usual)."""
    try:
        with open("/proc/self/maps") as maps:
            loaded = maps.read()
    except OSError:
        loaded = ""
    for name in ("jemalloc", "tcmalloc", "mimalloc"):
        if f"lib{name}" in loaded:
            return name
    libc, version = platform.libc_ver()
    if libc != "glibc":
        return libc or "unknown"
    environment = startup_environment()
    settings = [f"{key}={environment[key]}" for key in _GLIBC_MALLOC_ENV if key in environment]
    # (GLIBC_TUNABLES from os.environ: glibc edits the start-up copy as it parses it)
    tunables = [t for t in os.environ.get("GLIBC_TUNABLES", "").split(":") if t.startswith("glibc.malloc.")]
    return f"glibc {version} malloc ({', '.join(settings + tunables) or 'default thresholds'})"


def machine_info(device: str = "cpu") -> dict[str, Any]:
    """CPU (name, instruction sets, bf16 hardware), threads, the C allocator, whether bf16 window attention runs
    in our fused kernel (built here if it can be), the GPU when ``device`` is CUDA, library versions, and the UTC
    date and time."""
    from swin.layers import window_kernel
    from swin.optimized import cpu_features

    info: dict[str, Any] = {
        "cpu": cpu_features(),
        "threads": torch.get_num_threads(),
        "allocator": allocator(),
        "fused_attention": window_kernel.available(),
        "torch": torch.__version__,
        "timm": _version("timm"),
        "torchvision": _version("torchvision"),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    if info["cpu"]["amx_bf16"]:  # the CPU has it; oneDNN uses it only where the kernel lets this process
        info["amx_usable"] = _amx_usable()
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info


def _amx_usable() -> bool | None:
    """Whether the kernel lets this process use AMX tiles (Linux asks each process to request them), as torch
    requests them for oneDNN; None where this torch cannot say."""
    request = getattr(getattr(torch._C, "_cpu", None), "_init_amx", None)
    try:
        return bool(request()) if request is not None else None
    except RuntimeError:
        return None


def _amx_note(info: dict[str, Any]) -> str:
    notes = {True: " (usable)", False: " (not enabled by the kernel)", None: " (usability unknown)"}
    return notes[info["amx_usable"]] if "amx_usable" in info else ""


def describe(info: dict[str, Any]) -> str:
    """One line: ``AMD EPYC (AVX2; AVX-512 no, AVX512-BF16 no, AMX-BF16 no), 2 threads, glibc 2.36 malloc
    (default thresholds), fused bf16 attention no; torch ..., date``."""
    cpu = info["cpu"]

    def yes(flag: str) -> str:
        return "yes" if cpu[flag] else "no"

    line = (
        f"{cpu['name']} (kernels {cpu['isa']}; AVX-512 {yes('avx512')}, AVX512-BF16 {yes('avx512_bf16')}, "
        f"AMX-BF16 {yes('amx_bf16')}{_amx_note(info)}), {info['threads']} threads, {info['allocator']}, "
        f"fused bf16 attention {'yes' if info['fused_attention'] else 'no'}"
    )
    if "gpu" in info:
        line += f", GPU {info['gpu']}"
    return f"{line}; torch {info['torch']}, timm {info['timm']}, torchvision {info['torchvision']}; {info['date']}"
