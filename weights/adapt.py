"""Fit a converted state dict to a model: window size, input channels, classifier, extra and missing keys.

- A relative position bias table trained for another window is resized bicubically over its
  (2M-1) x (2M-1) grid of offsets, as the official fine-tuning code does (``utils.load_pretrained`` in
  microsoft/Swin-Transformer: ``F.interpolate(..., mode="bicubic")`` with the default ``align_corners``).
- An absolute position embedding (``ape``) in the official detection backbone's (1, C, H, W) layout, or trained
  at another input size, is put in the model's rows and resized bicubically to its patch grid.
- A patch embedding trained on 3 channels is adapted to ``in_chans`` as timm's ``adapt_input_conv`` does:
  summed over RGB for 1 channel, otherwise repeated and scaled by 3 / in_chans.
- A classifier of another size, and keys the model lacks (a detector's neck, the final norm of a
  classifier loaded into a backbone), are dropped; keys the model has but the checkpoint lacks keep their
  initial values. Both are reported in one warning. Where a checkpoint loads whole (``create_model``'s
  ``checkpoint_path=``, strict as timm's ``load_checkpoint``), a classifier that is not the model's (another
  size, or one of the two without one) and any key missing on either side are errors instead: a fine-tuned head
  or a final norm must not be silently left at its initial values.
- Stages a backbone does not build (``out_indices`` ending early) are dropped in the same way.
- Anything else that does not fit (another depth, width or head count) is an error naming the keys.
"""

from __future__ import annotations

import math
import re
import warnings
from collections import defaultdict

import torch
from torch import nn

from ..layers.position_bias import resize_bias_table
from ..layers.position_embedding import position_embedding_rows, resized_position_embedding

__all__ = ["adapt_input_conv", "resize_relative_position_bias_table", "fit_state_dict", "unbuilt"]

# Keys whose absence or surplus means the checkpoint is for another architecture.
_TRUNK = re.compile(r"^(patch_embed|layers)\.")
_TABLE = ".relative_position_bias_table"


def resize_relative_position_bias_table(table: torch.Tensor, window: tuple[int, int]) -> torch.Tensor:
    """(L1, heads) table of a square window -> ((2*wh-1)*(2*ww-1), heads), bicubic over the offset grid."""
    length, heads = table.shape
    side = math.isqrt(length)
    if side * side != length:
        raise ValueError(f"cannot resize a relative position bias table of {length} rows: not a square window's")
    return resize_bias_table(table, ((side + 1) // 2, (side + 1) // 2), window)


def adapt_input_conv(weight: torch.Tensor, in_chans: int) -> torch.Tensor:
    """(out, 3, k, k) conv weight -> (out, in_chans, k, k), as timm's ``adapt_input_conv``."""
    out_channels, channels, kh, kw = weight.shape
    if channels == in_chans:
        return weight
    if channels != 3:
        raise ValueError(f"can only adapt a 3-channel patch embedding, the checkpoint's has {channels} channels")
    dtype = weight.dtype
    weight = weight.float()
    if in_chans == 1:
        adapted = weight.sum(dim=1, keepdim=True)
    else:
        repeat = math.ceil(in_chans / 3)
        adapted = weight.repeat(1, repeat, 1, 1)[:, :in_chans] * (3 / in_chans)
    return adapted.to(dtype)


def _window_of(model: nn.Module, key: str, rows: int) -> tuple[int, int]:
    try:
        window = getattr(model.get_submodule(key[: -len(_TABLE)]), "window", None)
    except AttributeError:
        window = None
    if window is not None:
        return int(window[0]), int(window[1])
    side = (math.isqrt(rows) + 1) // 2
    return side, side


def _fit_position_embedding(value: torch.Tensor, model: nn.Module, target: torch.Size) -> torch.Tensor:
    """An absolute position embedding in the model's (1, grid_h * grid_w, C) rows: from the official detection
    backbone's (1, C, H, W) map too, bicubic-resized from the grid it was trained at to the model's (as the
    official detection backbone does at every forward). Unchanged where it is none of those layouts."""
    rows = position_embedding_rows(value, target[2])
    config = getattr(model, "config", None)
    if rows is None or config is None:
        return value
    grid = tuple(-(-side // config.patch_size) for side in config.img_size)
    if grid[0] * grid[1] != target[1]:
        return value
    table, trained = rows
    return resized_position_embedding(table, trained, grid).flatten(1, 2).to(value.dtype)


def unbuilt(key: str, own: dict[str, torch.Tensor]) -> bool:
    """Whether ``key`` belongs to a part the model does not build: a stage after the last one a backbone
    outputs, or the patch merging after its last stage (as opposed to a deeper or wider architecture)."""
    m = re.match(r"^layers\.(\d+)\.(downsample\.)?", key)
    if m is None:
        return False
    prefix = f"layers.{m.group(1)}."
    if not any(k.startswith(prefix) for k in own):
        return True
    return m.group(2) is not None and not any(k.startswith(prefix + "downsample.") for k in own)


def _summarize(keys: list[str], limit: int = 12) -> str:
    keys = sorted(keys)
    if len(keys) <= limit:
        return ", ".join(keys)
    groups: dict[str, int] = defaultdict(int)
    for key in keys:
        parts = key.split(".")
        depth = 4 if parts[0] == "layers" and len(parts) > 4 else 1
        groups[".".join(parts[:depth]) + ".*"] += 1
    return ", ".join(f"{g} ({n} keys)" if n > 1 else g for g, n in groups.items())


def _swin_version(keys) -> int | None:
    """2 for Swin V2 keys (its continuous position bias), 1 for V1's (a learnt bias table), else None."""
    if any(key.endswith(".attn.cpb_mlp.0.weight") for key in keys):
        return 2
    return 1 if any(key.endswith(_TABLE) for key in keys) else None


def _version_hint(state_dict: dict, own: dict) -> str:
    """What to build when the checkpoint is of the other Swin version than the model."""
    theirs, ours = _swin_version(state_dict), _swin_version(own)
    if theirs is None or ours is None or theirs == ours:
        return ""
    models = "a swinv2_* model (swin list 'swinv2*')" if theirs == 2 else "a Swin V1 model (swin_t, swin_s, ...)"
    return f" It is a Swin V{theirs} checkpoint and the model a Swin V{ours}: build {models}."


def common_prefix_hint(keys: list[str], own: set[str]) -> str:
    """A hint naming the prefix (``encoder.``, ``student.``) that, stripped from ``keys``, would give keys the
    model has; "" when no prefix explains them."""
    counts: dict[str, int] = defaultdict(int)
    for key in keys:
        parts = key.split(".")
        for i in range(1, len(parts)):
            if ".".join(parts[i:]) in own:
                counts[".".join(parts[:i]) + "."] += 1
                break
    if not counts:
        return ""
    prefix, hits = max(counts.items(), key=lambda item: item[1])
    if hits < max(1, len(keys) // 2):
        return ""
    return (
        f" {hits} of its keys carry the prefix {prefix!r}: strip it, e.g. "
        f"{{k.removeprefix({prefix!r}): v for k, v in state_dict.items()}}, or save the submodule's state_dict()."
    )


def _head_misfit(state_dict: dict[str, torch.Tensor], own: dict[str, torch.Tensor], origin: str) -> str | None:
    """Why the checkpoint's classifier is not the model's, with what to do, or None when it is (both
    without one included)."""
    theirs = {key: tuple(value.shape) for key, value in state_dict.items() if key.startswith("head.")}
    ours = {key: tuple(value.shape) for key, value in own.items() if key.startswith("head.")}
    if theirs == ours:
        return None
    new_head = "or load the file with pretrained= instead of checkpoint_path= to get a new head"
    weight, model_weight = theirs.get("head.weight"), ours.get("head.weight")
    if weight is not None and not ours:
        return (
            f"{origin}: the checkpoint's classifier has {weight[0]} classes and the model no classifier "
            f"(num_classes=0); pass num_classes={weight[0]} to load it, or load the file with pretrained= instead "
            "of checkpoint_path= to leave it out"
        )
    if model_weight is not None and not theirs:
        return (
            f"{origin}: the checkpoint has no classifier (saved with num_classes=0) and the model one of "
            f"{model_weight[0]} classes, which would keep its untrained initial values; pass num_classes=0 for a "
            f"model without a head, {new_head} of {model_weight[0]} classes"
        )
    if weight is not None and model_weight is not None and weight[0] != model_weight[0]:
        return (
            f"{origin}: the checkpoint's classifier has {weight[0]} classes and the model's {model_weight[0]}; "
            f"pass num_classes={weight[0]} to load it, {new_head} of {model_weight[0]} classes"
        )
    if weight is not None and model_weight is not None and weight[1:] != model_weight[1:]:
        return (
            f"{origin}: the checkpoint's classifier takes {weight[1]} features and the model's {model_weight[1]} "
            "(global_pool='catavgmax' takes twice the others'); pass the global_pool it was trained with to load it, "
            f"{new_head} for this global_pool"
        )
    differ = sorted(
        f"{key}: checkpoint {theirs.get(key, 'absent')} vs model {ours.get(key, 'absent')}"
        for key in set(theirs) | set(ours)
        if theirs.get(key) != ours.get(key)
    )
    return f"{origin}: the checkpoint's classifier is not the model's ({'; '.join(differ)}); {new_head}"


def fit_state_dict(
    state_dict: dict[str, torch.Tensor],
    model: nn.Module,
    origin: str = "the checkpoint",
    whole: bool = False,
) -> dict[str, torch.Tensor]:
    """The part of ``state_dict`` (our layout) that ``model`` can load, adapted to its shapes.

    Resizes bias tables to the model's windows and the patch embedding to its input channels; drops a
    classifier of another size and keys the model lacks; warns (``UserWarning``) listing what was dropped
    and what the model keeps at its initial values. ``origin`` names the checkpoint in messages.
    ``whole``: the checkpoint must be the model's, every key loaded, as timm's strict ``load_checkpoint``
    (``create_model``'s ``checkpoint_path=``: a fine-tuned head that does not load, or a final norm left at its
    initial values, is an error, not a warning). Bias tables and the patch embedding are still adapted.

    Raises:
        ValueError: keys of the trunk missing, surplus or of another shape (another architecture); the
            message lists them with both shapes. With ``whole``, a classifier of another size or input width,
            or one of the checkpoint and the model without one (the message names both heads and what to
            pass), and any other key the model has and the checkpoint lacks, or the reverse.
    """
    own = model.state_dict()
    fitted: dict[str, torch.Tensor] = {}
    dropped: list[str] = []
    mismatched: list[str] = []
    notes: list[str] = []
    for key, value in state_dict.items():
        if key not in own:
            (mismatched if _TRUNK.match(key) and not unbuilt(key, own) else dropped).append(key)
            continue
        target = own[key].shape
        if value.shape != target and key.endswith(_TABLE) and value.ndim == 2 and value.shape[1] == target[1]:
            value = resize_relative_position_bias_table(value, _window_of(model, key, target[0]))
        elif value.shape != target and key == "patch_embed.proj.weight" and value.shape[0] == target[0]:
            warnings.warn(
                f"loading {origin}: its patch embedding takes {value.shape[1]} input channels and the model "
                f"{target[1]}: adapted as timm's adapt_input_conv does ("
                + ("summed over them" if target[1] == 1 else f"repeated and scaled by {value.shape[1]}/{target[1]}")
                + ")",
                UserWarning,
                stacklevel=3,
            )
            value = adapt_input_conv(value, target[1])
        elif value.shape != target and key == "absolute_pos_embed" and len(target) == 3:
            value = _fit_position_embedding(value, model, target)
        if value.shape == target:
            fitted[key] = value
        elif key.startswith("head."):
            dropped.append(key)
            if key == "head.weight" and value.shape[0] != target[0]:
                notes.append(
                    f"the checkpoint's classifier has {value.shape[0]} classes and the model {target[0]}: the head "
                    f"keeps its initial values (pass num_classes={value.shape[0]} to load it, or train the new head)"
                )
            elif key == "head.weight":
                notes.append(
                    f"the checkpoint's classifier takes {value.shape[1]} features and the model's {target[1]} "
                    "(global_pool='catavgmax' doubles them): the head keeps its initial values"
                )
        else:
            mismatched.append(f"{key}: checkpoint {tuple(value.shape)} vs model {tuple(target)}")
    if any(key.startswith("head.") for key in dropped):  # a classifier loads whole or not at all
        dropped += [key for key in fitted if key.startswith("head.")]
        fitted = {key: value for key, value in fitted.items() if not key.startswith("head.")}
    missing = [key for key in own if key not in state_dict]
    mismatched += [f"{key}: not in the checkpoint" for key in missing if _TRUNK.match(key)]
    if mismatched:
        name = getattr(getattr(model, "config", None), "name", type(model).__name__)
        unexpected = [key for key in state_dict if key not in own]
        hint = common_prefix_hint(unexpected, set(own)) or _version_hint(state_dict, own)
        extra = (
            f" The checkpoint has {len(unexpected)} key(s) the model lacks, e.g. {_summarize(unexpected)}."
            if (unexpected)
            else ""
        )
        raise ValueError(
            f"{origin} does not fit the model ({name}): "
            f"{len(mismatched)} trunk key(s) differ, e.g. {'; '.join(mismatched[:8])}"
            + (f"; ... {len(mismatched) - 8} more" if len(mismatched) > 8 else "")
            + "."
            + extra
            + (hint or " Is it a checkpoint of another architecture (depths, embed_dim, num_heads, patch_size)?")
        )
    if whole:
        misfit = _head_misfit(state_dict, own, origin)
        if misfit is not None:
            raise ValueError(misfit)
        absent = [key for key in missing if not key.startswith("head.")]
        surplus = [key for key in dropped if not key.startswith("head.")]
        if absent or surplus:
            parts = ([f"the model's {_summarize(absent)} not in it"] if absent else []) + (
                [f"its {_summarize(surplus)} not in the model"] if surplus else []
            )
            raise ValueError(
                f"{origin} is not this model's whole checkpoint: {'; '.join(parts)}. checkpoint_path= loads a "
                "checkpoint whole, as timm's load_checkpoint; load it with pretrained= instead to keep what fits "
                "(what does not is listed in a warning)"
            )
    if dropped or missing:
        parts = [f"loading {origin}:"]
        if dropped:
            parts.append(f"dropped {len(dropped)} key(s) the model does not use: {_summarize(dropped)}.")
        if missing:
            kept = _summarize(missing)
            parts.append(f"{len(missing)} key(s) not in the checkpoint keep their initial values: {kept}.")
        parts += [note[0].upper() + note[1:] + "." for note in notes]
        warnings.warn(" ".join(parts), UserWarning, stacklevel=3)
    return fitted
