"""What another library's Swin cannot hold, or would compute otherwise, refused by name before an export: timm
has no absolute position embedding, torchvision's takes one window for every stage and no per-stage norms,
transformers always norms the patch embedding; given the model, a pooling, semantics or input size the library
would run otherwise."""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch
from torch import nn

from .export_windows import Windows, block_windows

__all__ = ["refuse_what_target_lacks", "refuse_what_the_model_runs_otherwise", "stage_size_problem"]


def refuse_what_target_lacks(
    sd: Mapping[str, torch.Tensor], target: str, windows: Windows | None, model: nn.Module | None = None
) -> None:
    """A ValueError naming what the state dict ``sd`` (our layout) holds and ``target``'s Swin has no place
    for, and where to export it instead; ``windows`` and ``model``: the model's, where it was given (the
    targets named instead are those that take it)."""
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
    instead = "; export to " + " or ".join(repr(t) for t in _taking(sd, windows, model, "transformers")) + " instead"
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
    distinct = sorted({window for window, _ in block_windows(sd, windows).values()})
    if len(distinct) > 1:
        shown = ", ".join(f"{h}x{w}" for h, w in distinct)
        raise ValueError(
            f"torchvision's Swin takes one window for every stage, and this model's stages have windows {shown} (a "
            "window shrunk to a smaller map, or per-stage windows)"
            + "; export to "
            + " or ".join(repr(t) for t in _taking(sd, windows, model, "timm"))
            + " instead"
        )


def _taking(sd: Mapping[str, torch.Tensor], windows: Windows | None, model: nn.Module | None, other: str) -> list[str]:
    """'official' and ``other`` where that library takes the model too (its checks pass)."""
    try:
        refuse_what_target_lacks(sd, other, windows)
        if model is not None:
            refuse_what_the_model_runs_otherwise(model, other)
    except ValueError:
        return ["official"]
    return ["official", other]


def _swin_model(model: nn.Module) -> nn.Module | None:
    """Our model inside ``model`` (itself, or under a wrapper: DDP, swin.optimize); None for a module that holds
    our layers without one (its weights are checked as a state dict's)."""
    return next((m for m in model.modules() if hasattr(m, "config") and hasattr(m, "semantics")), None)


def refuse_what_the_model_runs_otherwise(model: nn.Module, target: str) -> None:
    """Given the model, not only its weights: what timm's, torchvision's or transformers' model would compute
    otherwise although every weight loads (a pooling of ours, other rules for small or padded maps at the model's
    size)."""
    ours = _swin_model(model)
    if ours is None:
        return
    if target == "timm":  # whose pooling options are ours; its rules for small and padded maps are classification's
        if ours.semantics != "classification":
            raise ValueError(
                f"the model runs with {ours.semantics} semantics and timm's Swin (classifier and features_only) with "
                "the classification rules (windows shrunk to small maps, no shift there): it would compute other "
                "outputs; export to 'official' (the official detection code's and mmdetection's layout), or the "
                "state dict alone"
            )
    if target not in ("torchvision", "transformers"):
        return
    library = "torchvision's Swin" if target == "torchvision" else "transformers' Swin"
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
    if ours.semantics != "classification":
        raise ValueError(
            f"the model runs with {ours.semantics} semantics and the {library} classifier with the classification "
            "rules (windows shrunk to small maps, no shift there); export one built with the default semantics"
        )
    if target == "transformers" and not isinstance(ours.config.window_size, int):
        raise ValueError(
            f"window_size={ours.config.window_size!r}: transformers' Swin takes one square window for every stage; "
            "export to 'official' or 'timm'"
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
