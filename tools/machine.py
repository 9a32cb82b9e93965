"""What a timing was measured on: printed with every ``swin bench`` table (a figure without its machine is
not comparable with another)."""

from __future__ import annotations

import datetime
import importlib.metadata
from typing import Any

import torch

__all__ = ["describe", "machine_info"]


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def machine_info(device: str = "cpu") -> dict[str, Any]:
    """CPU (name, instruction sets, bf16 hardware), threads, the GPU when ``device`` is CUDA, library versions,
    and the UTC date and time."""
    from swin.optimized import cpu_features

    info: dict[str, Any] = {
        "cpu": cpu_features(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "timm": _version("timm"),
        "torchvision": _version("torchvision"),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info


def describe(info: dict[str, Any]) -> str:
    """One line: ``AMD EPYC (AVX2; AVX-512 no, AVX512-BF16 no, AMX-BF16 no), 2 threads, torch ..., date``."""
    cpu = info["cpu"]

    def yes(flag: str) -> str:
        return "yes" if cpu[flag] else "no"

    line = (
        f"{cpu['name']} (kernels {cpu['isa']}; AVX-512 {yes('avx512')}, AVX512-BF16 {yes('avx512_bf16')}, "
        f"AMX-BF16 {yes('amx_bf16')}), {info['threads']} threads"
    )
    if "gpu" in info:
        line += f", GPU {info['gpu']}"
    return f"{line}; torch {info['torch']}, timm {info['timm']}, torchvision {info['torchvision']}; {info['date']}"
