"""The ways a user runs a model for speed, for ``swin bench --ways``: each wraps a peer (timm, torchvision) the
way its documentation or common practice does it, so that ours is compared with the fastest of them.

- ``eager``: the model as built, float32.
- ``autocast``: eager under ``torch.autocast(device, bfloat16)``, the documented mixed-precision path.
- ``bf16``: weights and inputs cast to bfloat16 (``model.to(torch.bfloat16)``).
- ``compiled``: ``torch.compile`` with inductor's ``freezing`` (constant weights, pre-packed and fused), in
  the dtype that is fastest on the machine (bfloat16 with AMX-BF16 / AVX512-BF16 or on CUDA, float32
  elsewhere): the most a user gets from torch without writing kernels.

Ours runs ``eager`` and ``optimized`` (:func:`swin.optimize`, dtype and compile chosen for the machine).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

__all__ = ["WAYS", "machine_has_bf16", "peer_way", "ways_for_machine"]

WAYS = ("eager", "autocast", "bf16", "compiled")


def machine_has_bf16(device: str) -> bool:
    """Whether bfloat16 arithmetic runs in hardware on ``device`` (else bf16 ways only measure emulation)."""
    from swin.optimized import fastest_dtype

    return fastest_dtype(device) != torch.float32


def ways_for_machine(device: str) -> tuple[str, ...]:
    """The default ways: all of them where bf16 has hardware; without it ``autocast`` and ``bf16`` run ~8x
    slower than float32 for every implementation (emulated), so they cannot be the fastest and are left out."""
    return WAYS if machine_has_bf16(device) else ("eager", "compiled")


class _Autocast(nn.Module):
    def __init__(self, model: nn.Module, device: str):
        super().__init__()
        self.model, self.device_type = model, device.split(":")[0]

    def forward(self, x: torch.Tensor):
        with torch.autocast(self.device_type, dtype=torch.bfloat16):
            return self.model(x)


class _Cast(nn.Module):
    def __init__(self, model: nn.Module, dtype: torch.dtype):
        super().__init__()
        self.model, self.dtype = model.to(dtype), dtype

    def forward(self, x: torch.Tensor):
        return self.model(x.to(self.dtype))


def peer_way(model: nn.Module, way: str, device: str) -> nn.Module:
    """``model`` (left unchanged; a copy where weights are cast) run the way ``way``."""
    from swin.optimized import FrozenCompiled, fastest_dtype

    if way == "eager":
        return model
    if way == "autocast":
        return _Autocast(model, device)
    if way == "bf16":
        return _Cast(copy.deepcopy(model), torch.bfloat16)
    if way == "compiled":
        dtype = fastest_dtype(device)
        inner = _Cast(copy.deepcopy(model), dtype) if dtype != torch.float32 else model
        return FrozenCompiled(inner)
    raise ValueError(f"unknown way {way!r}; choose from {', '.join(WAYS)}")
