"""What a converted state dict must be before anything trusts it: finite, and a complete Swin trunk.

Both checks run on our (official) layout, after ``convert``: a checkpoint is cached, written by
``swin convert`` or loaded only once they pass. Failures are :class:`CorruptCheckpointError` naming the
file and the offending tensors, never a tensor printout.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from .safe_load import CorruptCheckpointError

__all__ = ["refuse_non_finite", "require_swin_trunk", "check_state"]

# Per block, the weights every Swin block (V1 or V2) has in our layout.
_BLOCK_PARTS = (
    "norm1.weight",
    "attn.qkv.weight",
    "attn.proj.weight",
    "norm2.weight",
    "mlp.fc1.weight",
    "mlp.fc2.weight",
)
_BLOCK = re.compile(r"^layers\.(\d+)\.blocks\.(\d+)\.")
_SHOWN = 5


def refuse_non_finite(state: Mapping[str, torch.Tensor], origin: str) -> None:
    """Raise if any floating tensor holds NaN or infinity, naming (up to five of) them."""
    bad = [
        name
        for name, value in state.items()
        if isinstance(value, torch.Tensor)
        and (value.is_floating_point() or value.is_complex())
        and value.numel()
        and not bool(torch.isfinite(value).all())
    ]
    if bad:
        more = f" and {len(bad) - _SHOWN} more" if len(bad) > _SHOWN else ""
        raise CorruptCheckpointError(
            f"{origin}: non-finite weights (NaN or infinity) in {', '.join(bad[:_SHOWN])}{more}; "
            "a diverged training run or a damaged file - use another checkpoint"
        )


def require_swin_trunk(state: Mapping[str, torch.Tensor], origin: str) -> None:
    """Raise unless ``state`` (our layout) is a complete Swin trunk: patch embedding, stages numbered from 0,
    blocks numbered from 0 in each, and every block with all its weights."""
    if "patch_embed.proj.weight" not in state:
        shown = ", ".join(sorted(map(str, state))[:8]) or "none"
        raise CorruptCheckpointError(
            f"{origin}: not a Swin checkpoint - no patch embedding (patch_embed.proj.weight) after conversion; "
            f"its first keys are {shown}. Pass --from / source= if the layout was detected wrongly"
        )
    blocks: dict[int, set[int]] = {}
    for key in state:
        match = _BLOCK.match(key)
        if match:
            blocks.setdefault(int(match.group(1)), set()).add(int(match.group(2)))
    if not blocks:
        raise CorruptCheckpointError(f"{origin}: not a Swin checkpoint - no transformer blocks (layers.N.blocks.M.*)")
    missing = []
    if sorted(blocks) != list(range(len(blocks))):
        missing.append(f"stages {sorted(set(range(max(blocks) + 1)) - set(blocks))}")
    for stage, indices in sorted(blocks.items()):
        if sorted(indices) != list(range(len(indices))):
            missing.append(f"layers.{stage} blocks {sorted(set(range(max(indices) + 1)) - indices)}")
        for index in sorted(indices):
            prefix = f"layers.{stage}.blocks.{index}."
            missing += [prefix + part for part in _BLOCK_PARTS if prefix + part not in state]
    if missing:
        more = f" and {len(missing) - _SHOWN} more" if len(missing) > _SHOWN else ""
        raise CorruptCheckpointError(
            f"{origin}: an incomplete Swin checkpoint - missing {', '.join(missing[:_SHOWN])}{more}"
        )


def check_state(state: Mapping[str, torch.Tensor], origin: str) -> None:
    """Both checks: a complete Swin trunk with finite weights."""
    require_swin_trunk(state, origin)
    refuse_non_finite(state, origin)
