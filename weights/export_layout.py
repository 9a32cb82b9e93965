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

__all__ = ["export", "stage_size_problem"]

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
    model = state_dict if isinstance(state_dict, nn.Module) else None
    windows = None if model is None else _windows(model)
    if model is not None:
        state_dict = model.state_dict()
    layout = _layout(target)
    if target != "official" and not layout.from_ours:
        exportable = [name for name, lay in LAYOUTS.items() if name == "official" or lay.from_ours]
        raise ValueError(f"export to {target!r} is not supported; export targets: {', '.join(exportable)}")
    sd = unwrap(state_dict)
    passthrough = {k: v for k, v in sd.items() if k in sd.passthrough}
    trunk = {k: v for k, v in sd.items() if k not in sd.passthrough}
    _refuse_what_target_lacks(trunk, target, windows)
    if model is not None:
        _refuse_what_the_model_runs_otherwise(model, target)
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


def _coords_windows(key: str, coords: torch.Tensor) -> tuple[tuple[int, int], tuple[int, int]]:
    """The window and pretrained window of a saved Swin V2 coordinates table (official and torchvision: (1,
    2wh-1, 2ww-1, 2)): the window from its shape, the pretrained window as the one whose scaling gives its values
    (each axis on its own); a ValueError where none does."""
    if coords.ndim != 4 or coords.shape[-1] != 2 or coords.shape[1] % 2 == 0 or coords.shape[2] % 2 == 0:
        raise ValueError(f"export: {key} of shape {tuple(coords.shape)} is no coordinates table (1, 2h-1, 2w-1, 2)")
    window = ((coords.shape[1] + 1) // 2, (coords.shape[2] + 1) // 2)
    found = []
    for axis in range(2):
        saved = coords[0, :, 0, 0] if axis == 0 else coords[0, 0, :, 1]
        for pretrained in (0, *range(2, 4 * max(window) + 1)):
            made = log_spaced_coords(window, (pretrained, pretrained)).reshape(*coords.shape[1:])
            ours = made[:, 0, 0] if axis == 0 else made[0, :, 1]
            if torch.allclose(saved.float(), ours, atol=1e-5):
                found.append(pretrained)
                break
        else:
            raise ValueError(f"export: {key} holds coordinates no window scaling gives; pass the model itself")
    pretrained = (0, 0) if tuple(found) in ((0, 0), window) else tuple(found)
    return window, pretrained


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
        coords = sd.get(f"{name}.relative_coords_table")
        if table is None and coords is not None:  # Swin V2 weights read with their saved coordinates table
            out[name] = _coords_windows(f"{name}.relative_coords_table", coords)
            continue
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
    if target == "transformers" and "absolute_pos_embed" in sd and any(k.endswith(".logit_scale") for k in sd):
        raise ValueError(
            "transformers' Swin V2 keeps one position more in its absolute position embedding than patches, and its "
            "own model cannot run with it: a Swin V2 with ape has no transformers model; export to 'official'"
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
    conv = sd.get("patch_embed.proj.weight")
    if conv is not None and conv.shape[1] != 3:
        raise ValueError(f"torchvision's Swin takes 3 input channels and this model {conv.shape[1]}" + instead)
    if "norm.weight" in sd and "head.weight" not in sd:
        raise ValueError(
            "torchvision's Swin always has a classifier (head) and this model none (num_classes=0): its strict load "
            "would miss head.weight; export a model with a head, or load the file with strict=False" + instead
        )
    if "absolute_pos_embed" in sd:
        raise ValueError("torchvision's Swin has no absolute position embedding (ape)" + instead)
    if "patch_embed.proj.weight" in sd and "patch_embed.norm.weight" not in sd:
        raise ValueError("torchvision's Swin always norms the patch embedding (features.0.2), this model not" + instead)
    stage_norms = sorted({k.split(".")[0] for k in sd if re.match(r"norm\d+\.", k)})
    if stage_norms:
        raise ValueError(
            f"torchvision's Swin is a classifier with one final norm: the per-stage norms "
            f"{', '.join(stage_norms)} of a features_only backbone (or a detector's) have no place in it" + instead
        )
    distinct = sorted({window for window, _ in _block_windows(sd, windows).values()})
    if len(distinct) > 1:
        shown = ", ".join(f"{h}x{w}" for h, w in distinct)
        raise ValueError(
            f"torchvision's Swin takes one window for every stage, and this model's stages have windows {shown} (a "
            "window shrunk to a smaller map, or per-stage windows)" + instead.replace("'transformers'", "'timm'")
        )


def _swin_model(model: nn.Module) -> nn.Module:
    """Our model inside ``model`` (itself, or under a wrapper: DDP, swin.optimize)."""
    return next(m for m in model.modules() if hasattr(m, "config") and hasattr(m, "semantics"))


def _refuse_what_the_model_runs_otherwise(model: nn.Module, target: str) -> None:
    """Given the model, not only its weights: what torchvision's or transformers' model would compute otherwise
    although every weight loads (a pooling of ours, other rules for small or padded maps at the model's size)."""
    if target not in ("torchvision", "transformers"):
        return
    library = "torchvision's Swin" if target == "torchvision" else "transformers' Swin"
    ours = _swin_model(model)
    backbone = hasattr(ours, "out_indices")
    pool = getattr(ours, "global_pool", "avg")
    if not backbone and getattr(ours, "num_classes", 0) and pool != "avg":
        raise ValueError(
            f"global_pool={pool!r}: {library} averages the tokens before its classifier; export a model with "
            "global_pool='avg', or to 'official' or 'timm'"
        )
    if backbone:  # torchvision refuses backbones by their per-stage norms; transformers' SwinBackbone
        if target == "transformers" and (ours.semantics != "detection" or ours.config.version == 2):
            raise ValueError(
                "transformers' SwinBackbone runs the detection rules (pad before the shift, windows never shrunk) and "
                "its Swinv2Backbone shrinks windows as its classifier does: this backbone "
                f"({'Swin V2' if ours.config.version == 2 else ours.semantics + ' semantics'}) would give other "
                "features; export to 'official'"
            )
        return
    if target == "transformers" and not isinstance(ours.config.window_size, int):
        raise ValueError(
            f"window_size={ours.config.window_size!r}: transformers' Swin takes one square window for every stage; "
            "export to 'official' or 'timm'"
        )
    if ours.semantics != "classification":
        raise ValueError(
            f"the model runs with {ours.semantics} semantics and the {library} classifier with the classification "
            "rules (windows shrunk to small maps, no shift there); export one built with the default semantics"
        )
    problem = stage_size_problem(ours.config, target)
    if problem:
        raise ValueError(f"{problem}: {library} would compute other outputs" + _SIZES_HINT)


_SIZES_HINT = (
    "; export a model whose img_size gives window multiples at every stage, even before each patch merging (224 "
    "at window 7, 256 at 8, 384 at 12)"
)


def stage_size_problem(config, target: str) -> str | None:
    """Where the library ``target`` would run a classifier of ``config`` otherwise at its own input size
    (``img_size``), or None: a stage's map that needs padding (torchvision and transformers pad before the
    cyclic shift, the classification rules here after it, as timm and the official code); for transformers also
    a map odd before patch merging (it rounds the next map down, the rules here up) and a non-square map not
    larger than the window (it shrinks both axes to the map, the rules here each axis on its own)."""
    sizes = config.stage_sizes()
    for stage, ((h, w), (wh, ww)) in enumerate(zip(sizes, config.stage_windows(), strict=True)):
        where = f"at its input size {config.img_size[0]}x{config.img_size[1]}, stage {stage + 1}'s {h}x{w} map"
        if target == "torchvision":  # one window everywhere (checked before): a map it needs padding to
            if h % wh or w % ww:
                return f"{where} is no multiple of the {wh}x{ww} window (padded before the shift there, after here)"
            continue
        window = config.window_size  # transformers: one square window (checked before)
        if min(h, w) <= window and h != w:
            return (
                f"{where} is not square and not larger than the {window}x{window} window (transformers shrinks "
                "both axes to the map, the rules here each axis on its own)"
            )
        if min(h, w) > window and (h % window or w % window):
            return (
                f"{where} is no multiple of the {window}x{window} window (transformers pads it before the cyclic "
                "shift, the classification rules here after it)"
            )
        if stage < len(sizes) - 1 and (h % 2 or w % 2):
            return f"{where} is odd before patch merging (transformers rounds the next map down, the rules here up)"
    return None


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
