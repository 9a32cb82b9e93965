"""Optimizer parameter groups for fine-tuning: no weight decay where Swin's recipes skip it, and layer-wise
learning-rate decay by block depth (BEiT; the SimMIM / Swin-V2 fine-tuning recipe).

>>> groups = swin.param_groups(model, weight_decay=0.05, layer_decay=0.9, lr=5e-4)
>>> optimizer = torch.optim.AdamW(groups)
"""

from __future__ import annotations

import fnmatch
import warnings
from collections.abc import Iterable

from torch import nn

from .trunk import SwinTrunk

__all__ = ["layer_ids", "num_layer_ids", "param_groups"]


def _find_trunks(model: nn.Module) -> list[tuple[str, SwinTrunk]]:
    """Every Swin trunk inside ``model`` (the model itself, or under DDP's ``module.``, torch.compile's
    ``_orig_mod.``, a detector's ``backbone.``/``body.``, a distillation's ``student.``/``teacher.``) with its
    name prefix ("" for the model itself)."""
    return [(name, module) for name, module in model.named_modules() if isinstance(module, SwinTrunk)]


def _find_trunk(model: nn.Module) -> tuple[str, SwinTrunk]:
    """The one Swin trunk inside ``model`` that layer decay numbers the layers of; see :func:`_find_trunks`."""
    found = _find_trunks(model)
    if not found:
        kind = type(model)
        hint = ""
        if kind.__module__.startswith("timm."):
            hint = "; for timm's models use timm.optim.create_optimizer_v2(model, 'adamw', layer_decay=...)"
        raise ValueError(
            f"layer ids need a Swin model of this package (swin.SwinTransformer, swin.SwinBackbone, or a module "
            f"containing one); got {kind.__module__}.{kind.__qualname__} without one{hint}"
        )
    if len(found) > 1:
        names = ", ".join(repr(name) for name, _ in found)
        raise ValueError(
            f"layer_decay needs one Swin per param_groups call, got {len(found)} ({names}): call param_groups on "
            f"each (e.g. param_groups(model.student, ...) + param_groups(model.teacher, ...)) and pass the joined "
            f"list to the optimizer"
        )
    return found[0]


def num_layer_ids(trunk: SwinTrunk) -> int:
    """Number of layer ids of ``trunk``: the patch embedding, one per block built, one for what sits on top."""
    return sum(stage.depth for stage in trunk.layers) + 2


def _trunk_layer_id(name: str, trunk: SwinTrunk) -> int:
    """Layer id of the trunk parameter ``name`` (relative to the trunk); see :func:`layer_ids`."""
    top = num_layer_ids(trunk) - 1
    parts = name.split(".")
    if parts[0] in ("patch_embed", "absolute_pos_embed"):
        return 0
    starts = [0]
    for stage in trunk.layers:
        starts.append(starts[-1] + stage.depth)
    if parts[0] == "layers" and len(parts) > 2:
        stage = int(parts[1])
        if parts[2] == "blocks" and len(parts) > 3:
            return starts[stage] + int(parts[3]) + 1
        return starts[stage + 1]  # patch merging (and anything else of the stage) ends the stage
    if parts[0].startswith("norm") and parts[0][4:].isdigit():  # a backbone's per-level norm of stage i
        stage = int(parts[0][4:])
        if stage < len(trunk.layers):
            return starts[stage + 1]
    return top


def layer_ids(model: nn.Module) -> dict[str, int]:
    """Layer id of every parameter of ``model`` (a Swin model, or any module containing one), for layer decay.

    Ids follow the official SimMIM / Swin-V2 fine-tuning code (``get_swin_layer``), over the blocks of the whole
    network in order:

    - 0: the patch embedding, and the absolute position embedding (as BEiT's ``pos_embed``; the official
      code gives it the top id only because it does not list it);
    - 1 .. num_blocks: block ``j`` of stage ``i`` is ``sum(depths[:i]) + j + 1``;
    - a stage's patch merging (``layers.i.downsample``, which ends the stage in the official layout) and a
      backbone's per-level norm ``norm{i}`` (which reads the stage's output) share the id of the stage's last
      block;
    - num_blocks + 1: everything else: the classifier's final norm and head, and any module outside the trunk
      (a neck, a detection head, a new classifier).

    Raises:
        ValueError: ``model`` holds no Swin trunk, or more than one.
    """
    prefix, trunk = _find_trunk(model)
    top = num_layer_ids(trunk) - 1
    lead = f"{prefix}." if prefix else ""
    ids = {}
    for name, _ in model.named_parameters():
        ids[name] = _trunk_layer_id(name[len(lead) :], trunk) if name.startswith(lead) else top
    return ids


def _matches(name: str, entry: str) -> bool:
    if any(c in entry for c in "*?["):  # a pattern over the full name, as timm's no_weight_decay_list
        return fnmatch.fnmatchcase(name, entry)
    # Whole dotted components: "relative_position_bias_table" or "cpb_mlp" match inside any block, a full name
    # matches itself under any wrapper prefix ("module.", "_orig_mod."), and "norm" does not match "norm1".
    return f".{entry}." in f".{name}."


def _default_no_weight_decay(model: nn.Module) -> set[str]:
    names: set[str] = set()
    if callable(getattr(model, "no_weight_decay", None)):
        names |= set(model.no_weight_decay())
    for prefix, trunk in _find_trunks(model):
        if trunk is not model:
            names |= {f"{prefix}.{name}" for name in trunk.no_weight_decay()}
    return names


def param_groups(
    model: nn.Module,
    weight_decay: float = 0.05,
    layer_decay: float | None = None,
    lr: float | None = None,
    no_weight_decay: Iterable[str] | None = None,
) -> list[dict]:
    """Parameter groups for ``torch.optim.AdamW`` (or any torch optimizer) as Swin's fine-tuning recipes use.

    Every trainable parameter lands in exactly one group; frozen ones (``requires_grad=False``, e.g. a
    backbone's ``frozen_stages``) in none. A parameter trains without weight decay if it is 1-D (norms, biases)
    or is named by ``no_weight_decay``.

    Args:
        model: a Swin model, or any module containing one (DDP, ``torch.compile``, a detector around a
            backbone). Without ``layer_decay`` any module works.
        weight_decay: decay of the other parameters.
        layer_decay: layer-wise learning-rate decay: a parameter of layer id ``i`` (see :func:`layer_ids`)
            gets ``lr_scale = layer_decay ** (num_blocks + 1 - i)``, so the classifier head (and anything
            outside the trunk) trains at the full rate, the deepest block at ``layer_decay`` times it and the
            patch embedding at ``layer_decay ** (num_blocks + 1)``. ``None``: no layer decay (scale 1).
        lr: base learning rate; each group gets ``lr`` times its layer's scale (and no ``lr_scale``, which
            timm's schedulers would apply a second time: they take each group's ``lr`` as its base). Without it
            the groups carry only ``lr_scale``, which timm's schedulers apply but ``torch.optim`` ignores (every
            group then trains at the optimizer's ``lr``): pass ``lr`` when the optimizer is torch's.
        no_weight_decay: names (or whole dotted parts of names, e.g. ``"relative_position_bias_table"``), or
            fnmatch patterns over the full name (entries with ``*``, ``?`` or ``[``, e.g. ``"head.*"``, as timm's
            ``no_weight_decay_list``), without weight decay; one that matches nothing is warned about. ``None``
            takes the model's own ``no_weight_decay()`` (and that of every Swin trunk in it). 1-D parameters never
            decay.

    Returns:
        A list of dicts with ``params``, ``weight_decay``, ``lr`` (when given, else ``lr_scale``) and, with
        ``layer_decay``, ``layer_id``; ordered by layer id, decayed group first; empty groups left out.

    Raises:
        ValueError: a negative ``weight_decay`` or ``lr``, a ``layer_decay`` outside (0, 1], ``layer_decay``
            for a model without a Swin trunk or with more than one. A ``no_weight_decay`` entry that matches no
            parameter is a ``UserWarning`` (a misspelt name would otherwise leave that parameter decayed unnoticed).
    """
    if weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
    if lr is not None and lr < 0:
        raise ValueError(f"lr must be >= 0, got {lr}")
    if layer_decay is not None and not 0 < layer_decay <= 1:
        raise ValueError(f"layer_decay must be in (0, 1] (e.g. 0.9; 1 disables it), got {layer_decay}")
    if isinstance(no_weight_decay, str):
        no_weight_decay = [no_weight_decay]
    skip = _default_no_weight_decay(model) if no_weight_decay is None else set(no_weight_decay)
    if no_weight_decay is not None:
        names = [name for name, _ in model.named_parameters()]
        unmatched = sorted(entry for entry in skip if not any(_matches(name, entry) for name in names))
        if unmatched:  # a warning, not an error: the official lists name absolute_pos_embed, absent without ape
            warnings.warn(
                f"no_weight_decay entries {unmatched} match no parameter of {type(model).__name__} (they change "
                f"nothing); an entry is a whole dotted part of a name (e.g. 'relative_position_bias_table') or an "
                f"fnmatch pattern over the full name (e.g. '*.attn.*'); the names look like {names[:3]}",
                stacklevel=2,
            )

    ids: dict[str, int] = {}
    top = 0
    if layer_decay is not None:
        ids = layer_ids(model)  # raises without a trunk, or with more than one
        top = num_layer_ids(_find_trunk(model)[1]) - 1

    groups: dict[tuple[int, bool], dict] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        decay = param.ndim > 1 and not any(_matches(name, entry) for entry in skip)
        layer = ids.get(name, top)
        group = groups.get((layer, decay))
        if group is None:
            scale = 1.0 if layer_decay is None else layer_decay ** (top - layer)
            group = {"params": [], "weight_decay": weight_decay if decay else 0.0}
            # the scale once: in lr when given (timm's schedulers take each group's lr as its base and would
            # multiply an lr_scale in again), else as lr_scale for timm's schedulers to apply
            if lr is not None:
                group["lr"] = lr * scale
            else:
                group["lr_scale"] = scale
            if layer_decay is not None:
                group["layer_id"] = layer
            groups[(layer, decay)] = group
        group["params"].append(param)
    return [groups[key] for key in sorted(groups, key=lambda key: (key[0], not key[1]))]
