"""Our weights in another library's layout: the official code's, timm's, torchvision's or transformers'.

A state dict says how each layout names the weights; what it cannot say is refused by name
(:mod:`swin.weights.export_checks`) rather than written into a file that loads into another model. torchvision
saves its derived buffers (the position index, Swin V2's coordinates table), so they are written too, from the
windows (:mod:`swin.weights.export_windows`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch
from torch import nn

from ..layers.attention_v2 import log_spaced_coords
from ..layers.position_bias import relative_position_index
from .convert import _apply, _layout, unwrap
from .export_checks import refuse_what_target_lacks, refuse_what_the_model_runs_otherwise
from .export_windows import Windows, block_windows, model_windows
from .layouts import LAYOUTS

__all__ = ["export"]


def export(state_dict: Mapping | nn.Module, target: str = "official") -> dict[str, torch.Tensor]:
    """Our weights rewritten for ``target``: "official" (ours, the Microsoft layout), "timm", "torchvision"
    (its ``swin_t`` / ``swin_v2_t`` module tree, buffers included: ``load_state_dict`` strict) or "transformers"
    (the names ``save_pretrained`` writes, which ``from_pretrained`` reads: ``SwinForImageClassification``,
    ``Swinv2ForImageClassification``, ``SwinModel`` without a head, ``SwinBackbone`` for a ``features_only``
    model's per-stage norms).

    ``state_dict`` is a state dict in our layout or one of our models. torchvision needs the windows: a Swin V2
    state dict does not record them (pass the model), a V1 state dict does in its bias tables (square windows).

    Raises:
        ValueError: a model the target library cannot build (the message names what and where to export it
            instead); an unknown target.
    """
    model = state_dict if isinstance(state_dict, nn.Module) else None
    windows = None if model is None else model_windows(model)
    if model is not None:
        state_dict = model.state_dict()
    layout = _layout(target)
    if target != "official" and not layout.from_ours:
        exportable = [name for name, lay in LAYOUTS.items() if name == "official" or lay.from_ours]
        raise ValueError(f"export to {target!r} is not supported; export targets: {', '.join(exportable)}")
    sd = unwrap(state_dict)
    passthrough = {k: v for k, v in sd.items() if k in sd.passthrough}
    trunk = {k: v for k, v in sd.items() if k not in sd.passthrough}
    refuse_what_target_lacks(trunk, target, windows, model)
    if model is not None:
        refuse_what_the_model_runs_otherwise(model, target)
    for transform in layout.from_ours_before:
        trunk = transform(trunk)
    out = _apply(trunk, layout.from_ours, layout.drop)
    for transform in layout.from_ours_after:
        out = transform(out)
    if target == "torchvision":
        out |= _torchvision_buffers(sd, windows)
    return out | {k: v for k, v in passthrough.items() if k not in out}


def _torchvision_buffers(sd: Mapping[str, torch.Tensor], windows: Windows | None) -> dict[str, torch.Tensor]:
    """torchvision's persistent buffers of each block: the flat position index, and for Swin V2 the (1, 2wh-1,
    2ww-1, 2) coordinates table (scaled by the pretrained window where the model has one, which torchvision's
    own constructor does not do: the saved table carries it)."""
    out = {}
    for name, (window, pretrained) in block_windows(sd, windows).items():
        stage, block = re.match(r"^layers\.(\d+)\.blocks\.(\d+)\.attn$", name).groups()
        prefix = f"features.{2 * int(stage) + 1}.{block}.attn."
        out[prefix + "relative_position_index"] = relative_position_index(window).flatten()
        if f"{name}.logit_scale" in sd:
            coords = log_spaced_coords(window, pretrained)
            out[prefix + "relative_coords_table"] = coords.reshape(1, 2 * window[0] - 1, 2 * window[1] - 1, 2)
    return out
