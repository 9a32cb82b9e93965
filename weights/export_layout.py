"""Our weights in another library's layout: the official code's, timm's, torchvision's or transformers'.

A state dict says how each layout names the weights; what it cannot say is refused by name rather than
written into a file that loads into another model: timm has no absolute position embedding, torchvision's Swin
takes one window for every stage and no per-stage norms, transformers always norms the patch embedding.
torchvision saves its derived buffers (the position index, Swin V2's coordinates table), so they are written
too, from the windows: those of the model when a model is given, else read from V1's bias tables.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import torch
from torch import nn

from ..layers.attention_v2 import log_spaced_coords
from ..layers.position_bias import relative_position_index
from .convert import _apply, _layout, unwrap
from .layouts import LAYOUTS

__all__ = ["export"]

Windows = dict[str, tuple[tuple[int, int], tuple[int, int]]]  # attention prefix -> (window, pretrained window)


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
    windows = _windows(state_dict) if isinstance(state_dict, nn.Module) else None
    if isinstance(state_dict, nn.Module):
        state_dict = state_dict.state_dict()
    layout = _layout(target)
    if target != "official" and not layout.from_ours:
        exportable = [name for name, lay in LAYOUTS.items() if name == "official" or lay.from_ours]
        raise ValueError(f"export to {target!r} is not supported; export targets: {', '.join(exportable)}")
    sd = unwrap(state_dict)
    passthrough = {k: v for k, v in sd.items() if k in sd.passthrough}
    trunk = {k: v for k, v in sd.items() if k not in sd.passthrough}
    _refuse_what_target_lacks(trunk, target, windows)
    for transform in layout.from_ours_before:
        trunk = transform(trunk)
    out = _apply(trunk, layout.from_ours, layout.drop)
    for transform in layout.from_ours_after:
        out = transform(out)
    if target == "torchvision":
        out |= _torchvision_buffers(sd, windows)
    return out | {k: v for k, v in passthrough.items() if k not in out}


def _windows(model: nn.Module) -> Windows:
    """Each window attention of ``model`` (ours) by its prefix in the state dict: its window and the window its
    position coordinates are scaled by (Swin V2's pretrained window; V1: (0, 0))."""
    found = {
        # by the name the state dict has once unwrapped (a wrapper's module. or model. prefix goes)
        m.group(1): (tuple(module.window), tuple(getattr(module, "pretrained_window", (0, 0))))
        for name, module in model.named_modules()
        if hasattr(module, "derived_buffers")
        and hasattr(module, "window")
        and (m := re.search(r"(layers\.\d+\.blocks\.\d+\.attn)$", name))
    }
    if not found:
        raise ValueError(
            f"export: {type(model).__name__} holds none of swin's window attentions; pass one of swin's models "
            "(for a wrapper, the model inside it: ddp.module, ema.module) or its state_dict()"
        )
    return found


def _table_window(key: str, table: torch.Tensor) -> tuple[int, int]:
    """The square window whose (2w-1)^2-row bias table ``table`` is; a ValueError where it is none."""
    side = math.isqrt(table.shape[0])
    if side * side != table.shape[0] or side % 2 == 0:
        raise ValueError(
            f"export: {key} has {table.shape[0]} rows, the table of a window that is not square: its windows are "
            "not in the state dict alone; pass the model itself, export(model, ...)"
        )
    return (side + 1) // 2, (side + 1) // 2


def _block_windows(sd: Mapping[str, torch.Tensor], windows: Windows | None) -> Windows:
    """Each attention's (window, pretrained window): the model's where given, else read from V1's bias tables."""
    attentions = sorted({m.group(1) for k in sd if (m := re.match(r"^(layers\.\d+\.blocks\.\d+\.attn)\.", k))})
    if windows is not None:
        missing = [name for name in attentions if name not in windows]
        if missing:
            raise ValueError(f"export: the model given has no window attention at {missing[0]}, which its weights have")
        return {name: windows[name] for name in attentions}
    out = {}
    for name in attentions:
        table = sd.get(f"{name}.relative_position_bias_table")
        if table is None:  # Swin V2: a continuous position bias, from coordinates the window alone decides
            raise ValueError(
                "export: a Swin V2 state dict does not record its windows, which torchvision's saved coordinates "
                "table needs; pass the model itself: swin.weights.export(swin.create_model(ARCH, pretrained=FILE), "
                "'torchvision')"
            )
        out[name] = (_table_window(f"{name}.relative_position_bias_table", table), (0, 0))
    return out


def _refuse_what_target_lacks(sd: Mapping[str, torch.Tensor], target: str, windows: Windows | None) -> None:
    if target == "timm" and "absolute_pos_embed" in sd:
        raise ValueError(
            "timm's Swin has no absolute position embedding (ape): its strict load refuses absolute_pos_embed and a "
            "lenient one drops it; export this model to 'official' instead"
        )
    if target == "transformers" and "patch_embed.proj.weight" in sd and "patch_embed.norm.weight" not in sd:
        raise ValueError(
            "transformers' Swin always norms the patch embedding (embeddings.norm) and this model has no patch norm "
            "(patch_norm=False): from_pretrained would start that norm from its initial values; export to "
            "'official' instead"
        )
    if target != "torchvision":
        return
    instead = "; export to 'official' or 'transformers' instead"
    if "absolute_pos_embed" in sd:
        raise ValueError("torchvision's Swin has no absolute position embedding (ape)" + instead)
    if "patch_embed.proj.weight" in sd and "patch_embed.norm.weight" not in sd:
        raise ValueError("torchvision's Swin always norms the patch embedding (features.0.2), this model not" + instead)
    stage_norms = sorted({k.split(".")[0] for k in sd if re.match(r"norm\d+\.", k)})
    if stage_norms:
        raise ValueError(
            f"torchvision's Swin is a classifier with one final norm: the per-stage norms "
            f"{', '.join(stage_norms)} of a features_only backbone have no place in it" + instead
        )
    distinct = sorted({window for window, _ in _block_windows(sd, windows).values()})
    if len(distinct) > 1:
        shown = ", ".join(f"{h}x{w}" for h, w in distinct)
        raise ValueError(
            f"torchvision's Swin takes one window for every stage, and this model's stages have windows {shown} (a "
            "window shrunk to a smaller map, or per-stage windows)" + instead.replace("'transformers'", "'timm'")
        )


def _torchvision_buffers(sd: Mapping[str, torch.Tensor], windows: Windows | None) -> dict[str, torch.Tensor]:
    """torchvision's persistent buffers of each block: the flat position index, and for Swin V2 the (1, 2wh-1,
    2ww-1, 2) coordinates table (scaled by the pretrained window where the model has one, which torchvision's
    own constructor does not do: the saved table carries it)."""
    out = {}
    for name, (window, pretrained) in _block_windows(sd, windows).items():
        stage, block = re.match(r"^layers\.(\d+)\.blocks\.(\d+)\.attn$", name).groups()
        prefix = f"features.{2 * int(stage) + 1}.{block}.attn."
        out[prefix + "relative_position_index"] = relative_position_index(window).flatten()
        if f"{name}.logit_scale" in sd:
            coords = log_spaced_coords(window, pretrained)
            out[prefix + "relative_coords_table"] = coords.reshape(1, 2 * window[0] - 1, 2 * window[1] - 1, 2)
    return out
