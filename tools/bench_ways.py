"""The ways a user runs a model for speed, for ``swin bench --ways``: each wraps a peer (timm, torchvision) the
way its documentation or common practice does it, so that ours is compared with the fastest of them.

- ``eager``: the model as built, float32.
- ``autocast``: eager under ``torch.autocast(device, dtype)``, the documented mixed-precision path.
- ``bf16``: weights and inputs cast to that dtype (``model.to(dtype)``).

  ``dtype``: :func:`reduced_dtype`, the one ours optimized runs in: bfloat16, or float16 on CUDA devices
  without bf16 arithmetic (where ``bf16`` keeps its name but casts to float16).
- ``compiled``: ``torch.compile`` with inductor's ``freezing`` (constant weights, pre-packed and fused), in
  the dtype that is fastest on the machine (bfloat16 with AMX-BF16 / AVX512-BF16 or on CUDA, float32
  elsewhere): the most a user gets from torch without writing kernels.

Ours runs ``eager`` and ``optimized`` (:func:`swin.optimize`, dtype and compile chosen for the machine).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

__all__ = ["WAYS", "machine_has_bf16", "peer_way", "reduced_dtype", "ways_for_machine"]

WAYS = ("eager", "autocast", "bf16", "compiled")


def machine_has_bf16(device: str) -> bool:
    """Whether bfloat16 arithmetic runs in hardware on ``device`` (else bf16 ways only measure emulation)."""
    from swin.optimized import fastest_dtype

    return fastest_dtype(device) != torch.float32


def ways_for_machine(device: str) -> tuple[str, ...]:
    """The default ways: all of them where bf16 has hardware; without it ``autocast`` and ``bf16`` run ~8x
    slower than float32 for every implementation (emulated), so they cannot be the fastest and are left out."""
    return WAYS if machine_has_bf16(device) else ("eager", "compiled")


def reduced_dtype(device: str) -> torch.dtype:
    """The dtype of the ``autocast`` and ``bf16`` ways: :func:`swin.optimized.fastest_dtype`, as ours optimized,
    or bfloat16 where that is float32 (those ways then measure emulation, and ``auto`` leaves them out)."""
    from swin.optimized import fastest_dtype

    dtype = fastest_dtype(device)
    return dtype if dtype != torch.float32 else torch.bfloat16


class _Autocast(nn.Module):
    def __init__(self, model: nn.Module, device: str, dtype: torch.dtype):
        super().__init__()
        self.model, self.device_type, self.dtype = model, device.split(":")[0], dtype

    def forward(self, x: torch.Tensor):
        with torch.autocast(self.device_type, dtype=self.dtype):
            return self.model(x)


class _Cast(nn.Module):
    def __init__(self, model: nn.Module, dtype: torch.dtype):
        super().__init__()
        self.model, self.dtype = model.to(dtype), dtype

    def forward(self, x: torch.Tensor):
        return self.model(x.to(self.dtype))


def peer_way(model: nn.Module, way: str, device: str) -> nn.Module:
    """``model`` (left unchanged) run the way ``way``; the ways that cast or compile on a copy of their own, so
    that no cast or compiled state is shared between ways (eager and autocast run the model itself)."""
    from swin.optimized import FrozenCompiled, fastest_dtype

    if way not in WAYS:
        raise ValueError(f"unknown way {way!r}; choose from {', '.join(WAYS)}")
    if way == "eager":
        return model
    if way == "autocast":
        return _Autocast(model, device, reduced_dtype(device))
    own = copy.deepcopy(model)
    if way == "bf16":
        return _Cast(own, reduced_dtype(device))
    dtype = fastest_dtype(device)  # compiled
    return FrozenCompiled(_Cast(own, dtype) if dtype != torch.float32 else own)
