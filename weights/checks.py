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
    blocks numbered from 0 in each, every block with all its weights, the patch mergings between the stages
    (of matching widths) and, with a classifier, the final norm. (A stage's last block cannot be told missing
    from the checkpoint alone: loading into an architecture finds it.)"""
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
    if not missing:
        missing += _between_stages(state, len(blocks))
    if missing:
        more = f" and {len(missing) - _SHOWN} more" if len(missing) > _SHOWN else ""
        raise CorruptCheckpointError(
            f"{origin}: an incomplete Swin checkpoint - missing {', '.join(missing[:_SHOWN])}{more}"
        )


def _between_stages(state: Mapping[str, torch.Tensor], stages: int) -> list[str]:
    """What joins the stages, in our layout: a patch merging at the end of every stage but the last (one at the
    end of the last means a stage after it is missing), each taking its stage's width C to the next stage's 2C,
    and, where there is a classifier, the final norm over the last stage's width."""
    missing = []
    widths = [state[f"layers.{i}.blocks.0.norm1.weight"].shape[0] for i in range(stages)]
    for stage in range(stages):
        reduction = state.get(f"layers.{stage}.downsample.reduction.weight")
        if reduction is None:
            if stage < stages - 1:
                missing.append(f"layers.{stage}.downsample.* (the patch merging into stage {stage + 1})")
            continue
        if stage == stages - 1:
            missing.append(f"stage {stages} (layers.{stages}.*, which layers.{stage}.downsample merges into)")
        elif tuple(reduction.shape) != (widths[stage + 1], 4 * widths[stage]):
            missing.append(
                f"a patch merging from stage {stage}'s {widths[stage]} channels to stage {stage + 1}'s "
                f"{widths[stage + 1]} (layers.{stage}.downsample.reduction.weight is {tuple(reduction.shape)})"
            )
    if "head.weight" in state and "norm.weight" not in state:
        missing.append("norm.weight (the final norm before the classifier head)")
    norm = state.get("norm.weight")
    if norm is not None and not missing and norm.shape[0] != widths[-1]:
        missing.append(
            f"the stage(s) after stage {stages - 1} (the final norm has {norm.shape[0]} channels, the last stage here "
            f"{widths[-1]})"
        )
    return missing


def check_state(state: Mapping[str, torch.Tensor], origin: str) -> None:
    """Both checks: a complete Swin trunk with finite weights."""
    require_swin_trunk(state, origin)
    refuse_non_finite(state, origin)
