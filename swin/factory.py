"""``create_model``: a registered name (or alias) plus overrides -> a model."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from .backbone import SwinBackbone
from .model import SwinTransformer
from .pooling import check_pool
from .registry import SwinConfig, get_config, resolve_name

__all__ = ["create_model"]


def _check_pretrained(pretrained: Any) -> bool:
    """Whether ``pretrained`` asks for weights; an empty or false-like value other than False/None is an
    error rather than silently random weights."""
    if pretrained is None or pretrained is False:
        return False
    if isinstance(pretrained, Mapping):
        if not pretrained:
            raise ValueError("pretrained= got an empty state dict; pass the checkpoint's tensors, or False")
        return True
    if pretrained is True or (isinstance(pretrained, (str, os.PathLike)) and os.fspath(pretrained)):
        return True
    raise ValueError(
        f"pretrained= got {type(pretrained).__name__} {str(pretrained)[:40]!r}: pass False/None (random weights), "
        "True (the default tag), a tag such as 'ms_in1k', a checkpoint path or URL, or a state dict"
    )


def _split_tag(name: str, pretrained: Any) -> tuple[str, str | None, Any]:
    """``"ARCH.TAG"`` -> (arch, tag, what to load): the tag is the weights ``pretrained=True`` loads, and
    the preprocessing the model describes even with random weights (as timm's ``create_model``)."""
    arch, dot, tag = name.partition(".")
    if not dot:
        return name, None, pretrained
    if not tag:
        raise ValueError(f"model name {name!r} ends in a dot; write ARCH or ARCH.TAG (e.g. swin_t.ms_in1k)")
    if pretrained is True:
        return arch, tag, tag
    if isinstance(pretrained, str) and pretrained not in (tag, name):
        raise ValueError(
            f"create_model({name!r}, pretrained={pretrained!r}) names two different weights; "
            f"use create_model({arch!r}, pretrained={pretrained!r}) or create_model({name!r}, pretrained=True)"
        )
    return arch, tag, pretrained


def create_model(
    name: str,
    pretrained: bool | str | os.PathLike | Mapping = False,
    features_only: bool = False,
    out_indices: Sequence[int] | int | None = None,
    checkpoint_path: str | os.PathLike | None = None,
    optimize: bool | str | Any = False,
    pretrained_cfg_overlay: Mapping[str, Any] | None = None,
    **overrides: Any,
) -> SwinTransformer | SwinBackbone:
    """Build the registered architecture ``name`` (timm's names work as aliases).

    Args:
        name: ``swin_t``, ``swin_b_384``, ``swin_tiny_patch4_window7_224``, ... (see ``swin.list_models()``),
            optionally with a pretrained tag, ``swin_t.ms_in22k`` or timm's
            ``swin_tiny_patch4_window7_224.ms_in22k``: ``pretrained=True`` then loads that tag, and without
            weights the model still takes its head size and preprocessing (``pretrained_cfg``). timm's
            ``hf-hub:OWNER/NAME[@REVISION]``: the architecture, head and preprocessing a timm model repository's
            ``config.json`` describes, and with ``pretrained=True`` its weights; ``local-dir:FOLDER`` the same of a
            folder in that form (what ``swin.save_for_hf`` and timm's ``save_for_hf`` write).
        pretrained: ``False``; ``True`` (the architecture's default tag in the weights manifest); a tag
            (``"ms_in22k"``) or ``"ARCH.TAG"``; a local checkpoint file or an http(s) URL, or a state dict
            already in memory, in any supported layout (official, timm, torchvision, transformers,
            mmdetection). A manifest tag also sets
            ``num_classes`` to its head's (21841 for ``ms_in22k``) unless ``num_classes`` is given.
        features_only: return a :class:`SwinBackbone` (multi-scale NCHW features, detection semantics)
            instead of the classifier.
        out_indices: with ``features_only``, the stages to return (0..3, negative from the last, or an int n
            for the last n; returned in stage order; None: all four); ``frozen_stages`` and
            ``norm_eval`` pass through to the backbone as well.
        checkpoint_path: a checkpoint file (any supported layout) loaded after ``pretrained``, as timm's
            ``checkpoint_path=``; its head must fit ``num_classes`` (and ``global_pool``): a head of another
            size, or none where the model has one (or the reverse), is an error, as in timm. For a new head
            of ``num_classes`` on a checkpoint's trunk, pass it as ``pretrained=PATH``.
        optimize: ``True`` (or a dtype: ``"bfloat16"``, ``torch.float32``, ...): return the model through
            :func:`swin.optimize`, the fastest inference version for this machine's CPU (compiled on its first
            call), in ``dtype`` when that is given too. For a GPU, build the model, move it (``.cuda()``) and
            call ``swin.optimize`` on it.
        pretrained_cfg_overlay: as timm's: entries that replace those of ``model.pretrained_cfg`` (``mean``,
            ``crop_pct``, ...); its ``num_classes`` and ``input_size`` are the model's defaults (an explicit
            ``num_classes``/``in_chans``/``img_size`` wins), and with ``pretrained=True`` its ``state_dict``,
            ``file`` or ``url`` (in that order) is what is loaded; ``num_classes=-1`` (timm's train.py
            ``--pretrained-path``) loads the weights' trunk under a new head of the model's ``num_classes``.
        **overrides: any :class:`swin.registry.SwinConfig` field (``num_classes=10``, ``img_size=384``,
            ``window_size=(8, 8)``, ``drop_path_rate=0.2``, ...), ``semantics``, and for the classifier
            ``global_pool`` ("avg", "max", "avgmax", "catavgmax", "", timm's "fast..."; with ``features_only``
            checked and ignored, as timm does). As in timm, an override given as ``None`` is left out; timm's
            ``dynamic_img_size=False`` and ``strict_img_size=True`` are its defaults and change nothing;
            ``device`` and ``dtype`` place the model once its weights are loaded; timm's layer flags
            ``exportable`` and ``no_jit`` change nothing, and ``scriptable=True`` is refused (no TorchScript).

    Raises:
        KeyError: unknown name (the message lists the closest registered names).
        TypeError: an override that is not a config field, or of the wrong type; ``out_indices`` without
            ``features_only``; timm's ``output_fmt`` (the message says what to use).
        ValueError: a checkpoint of another architecture; a ``checkpoint_path`` whose head does not fit the
            model's (the message names both heads and what to pass); timm's ``dynamic_img_size=True``,
            ``strict_img_size=False`` and ``scriptable=True`` (the message says what to do instead).
    """
    # As timm: an option given as None is not given (timm's train.py passes drop_path_rate=None and the like).
    overrides = {key: value for key, value in overrides.items() if value is not None}
    hub_classes = None  # a hub repository's head: its weights load whole into a model with that head, as timm
    hub_spec = None  # a hub repository whose weights are fetched once its description has built a model
    origin = None  # where the configuration comes from, when not from the caller alone
    yours: set[str] = set()
    if isinstance(name, str) and name.startswith(("hf-hub:", "local-dir:")):  # timm's: config.json describes it
        if "pretrained_cfg" in overrides:  # timm asserts as much: the description is the pretrained config
            raise ValueError(
                f"create_model({name!r}, pretrained_cfg=...): the config.json it names is the pretrained config; "
                "change its entries with pretrained_cfg_overlay=dict(...)"
            )
        origin, hub_spec, asked = name, name, pretrained
        name, pretrained_cfg_overlay, hub_args, hub_stages = _from_hub(
            name, pretrained, pretrained_cfg_overlay, features_only
        )
        if out_indices is None and hub_stages:  # a transformers SwinBackbone repository's out_features
            out_indices = hub_stages
        yours = set(overrides)  # the caller's own: their errors stay theirs, not the repository's
        if features_only:  # the repository's head dropout: a backbone has no head (and would warn of it)
            hub_args.pop("drop_rate", None)
        overrides = {**hub_args, **overrides}
        hub_classes = pretrained_cfg_overlay.get("num_classes")
        # the repository's weights unless the caller's overlay names others (timm's order: state_dict, file, url)
        if asked is True and not any(pretrained_cfg_overlay.get(k) for k in ("state_dict", "file", "url")):
            pretrained = False
        else:
            hub_spec = None
    _check_timm_options(overrides)
    name = _with_cfg_tag(name, overrides.pop("pretrained_cfg", None))
    placement = _placement(overrides)
    overlay = _overlay(pretrained_cfg_overlay, overrides, features_only)
    # timm's train.py --pretrained-path: num_classes=-1 in the overlay loads the file's trunk under a new head
    new_head = overlay.get("num_classes") == -1
    if new_head:
        del overlay["num_classes"]
    source = _overlay_source(overlay, pretrained, name)
    arch, tag, pretrained = _split_tag(name, pretrained)
    pretrained = pretrained if source is None else source
    canonical = resolve_name(arch)
    wanted = _check_pretrained(pretrained)
    named = None  # the manifest entry a tag in the name designates, when nothing is loaded from it
    if tag is not None and not wanted:
        from .weights.manifest import get_entry

        named = get_entry(canonical, tag)
        if not features_only and "num_classes" not in overrides:
            overrides["num_classes"] = named.num_classes
    if wanted and not isinstance(pretrained, Mapping) and not features_only and "num_classes" not in overrides:
        from .weights.pretrained import manifest_entry_for

        entry = manifest_entry_for(canonical, pretrained)
        if entry is not None:
            overrides["num_classes"] = entry.num_classes
    if out_indices is not None and not features_only:
        raise TypeError(
            f"out_indices={out_indices!r} selects the stages of a features_only backbone; pass features_only=True "
            "(the classifier has one output)"
        )
    if features_only:
        check_pool(overrides.pop("global_pool", None))  # timm's classifier option: a backbone has no pooling
        backbone_args = {k: overrides.pop(k) for k in ("frozen_stages", "norm_eval", "semantics") if k in overrides}
        config = _config(canonical, overrides, origin, yours)
        model = SwinBackbone(config, out_indices=(0, 1, 2, 3) if out_indices is None else out_indices, **backbone_args)
    else:
        head_args = {k: overrides.pop(k) for k in ("semantics", "global_pool") if k in overrides}
        config = _config(canonical, overrides, origin, yours)
        model = SwinTransformer.from_config(config, **head_args)
    if hub_spec is not None:  # only now, with the description built: its weights
        from .weights.hub_model import HUB_PREFIX, LOCAL_PREFIX, hub_weights, local_weights

        if hub_spec.startswith(HUB_PREFIX):
            pretrained = overlay["file"] = str(hub_weights(hub_spec[len(HUB_PREFIX) :]))
        else:
            pretrained = overlay["file"] = str(local_weights(hub_spec[len(LOCAL_PREFIX) :]))
        wanted = True
    if named is not None:
        from .weights.data_config import record_loaded

        record_loaded(model, {"name": named.name, "file": None, **named.provenance(), **named.data_config()})
    if wanted or checkpoint_path is not None:
        from .weights.pretrained import load_pretrained

        if wanted:
            whole = hub_classes is not None and not features_only and model.num_classes == hub_classes
            load_pretrained(model, canonical, pretrained, model_for=entry_model, whole=whole)
        if checkpoint_path is not None:
            # loaded whole, as timm's strict load_checkpoint: a fine-tuned head that does not fit is an error, not
            # an untrained head behind the file's features (a backbone takes a classifier's trunk: not whole)
            path = _existing_file(checkpoint_path)
            load_pretrained(model, canonical, path, whole=not features_only)
    if new_head and wanted and not features_only:
        model.reset_classifier(model.num_classes)
    if placement:
        model.to(**placement)
    if origin is not None:  # a hub repository: where its weights come from, never the default tag's
        from .weights.data_config import record_provenance

        record_provenance(model, overlay)
    if overlay:
        # timm's features_only models leave out the classifier's entries (its pretrained_cfg_for_features)
        dropped = ("num_classes", "classifier", "global_pool") if features_only else ()
        model.pretrained_cfg.update({k: v for k, v in overlay.items() if k not in dropped})
    if optimize is not False:
        from .optimized import optimize as make_fast

        if optimize is not True and "dtype" in placement:
            raise ValueError(
                f"dtype={placement['dtype']} and optimize={optimize!r} both name a dtype; pass it once: "
                "optimize=True with dtype=..., or optimize=DTYPE"
            )
        return make_fast(model, dtype=placement.get("dtype", "auto") if optimize is True else optimize)
    return model


# timm's own options that these models do not take, with what to use instead.
_REFUSED = {
    "output_fmt": "output_fmt is not an option of Swin models (timm's Swin refuses it too): features_only "
    "outputs are NCHW; forward_intermediates(x, output_fmt='NHWC') gives NHWC maps",
}
# timm's input-size options: their defaults change nothing here, the other values are refused with why.
_IMG_SIZE_DEFAULTS = {"dynamic_img_size": False, "strict_img_size": True}
_IMG_SIZE_REFUSAL = (
    "{option}={value!r}: these models already run at any input size, but not as timm's dynamic_img_size (which "
    "keeps the windows and shifts of img_size): here a stage whose map is not larger than the window is not "
    "shifted at that input's size, as the official code built at that size does. Build with img_size=(H, W) for "
    "timm's outputs at H x W, and leave {option} out"
)


def _with_cfg_tag(name: str, pretrained_cfg: Any) -> str:
    """timm's ``pretrained_cfg="TAG"``: the name with that tag (as ``ARCH.TAG``); a whole config is refused
    with what to pass instead."""
    if pretrained_cfg is None:
        return name
    if not isinstance(pretrained_cfg, str):
        raise TypeError(
            f"pretrained_cfg={type(pretrained_cfg).__name__}: a whole pretrained config (timm replaces its own "
            "with it) is not taken here; name the weights with a tag, pretrained_cfg='ms_in22k' or "
            "create_model('ARCH.TAG'), and change its entries with pretrained_cfg_overlay=dict(...)"
        )
    arch, dot, tag = name.partition(".")
    if dot and tag != pretrained_cfg:
        raise ValueError(
            f"create_model({name!r}, pretrained_cfg={pretrained_cfg!r}) names two different weights; pass the tag "
            "once, in the name or as pretrained_cfg"
        )
    return f"{arch}.{pretrained_cfg}"


def _check_timm_options(overrides: dict[str, Any]) -> None:
    """Refuse timm's options that these models do not take, naming the option and what to do; drop the
    input-size options given at timm's defaults."""
    for option, message in _REFUSED.items():
        if option in overrides:
            raise TypeError(message)
    for option, default in _IMG_SIZE_DEFAULTS.items():
        if option in overrides:
            value = overrides.pop(option)
            if value != default:  # 0 and 1 as their booleans, as timm reads them
                raise ValueError(_IMG_SIZE_REFUSAL.format(option=option, value=value))


def _from_hub(
    name: str, pretrained: Any, overlay: Mapping[str, Any] | None, features_only: bool
) -> tuple[str, dict[str, Any], dict[str, Any], tuple[int, ...] | None]:
    """``hf-hub:REPO[@REVISION]`` or ``local-dir:FOLDER`` as timm reads them: the architecture its ``config.json``
    names, its preprocessing and head under the caller's ``pretrained_cfg_overlay`` and its ``model_args`` (the
    caller's overrides win). Its weights are fetched by the caller once the model is built. Last, the stages a
    backbone repository (transformers' SwinBackbone) outputs, else None."""
    from .weights.hub_model import HUB_PREFIX, LOCAL_PREFIX, hub_model, local_model

    if pretrained not in (True, False, None):
        raise ValueError(
            f"{name} names its own weights: pass pretrained=True for them (or False), or load {pretrained!r} into "
            "the architecture by its name"
        )
    if name.startswith(LOCAL_PREFIX):
        described = local_model(name[len(LOCAL_PREFIX) :])
    else:
        described = hub_model(name[len(HUB_PREFIX) :])
    stages = described.get("backbone")
    if stages and not features_only:
        raise ValueError(
            f"{name} holds a backbone (transformers' SwinBackbone: per-stage norms, no final norm or head); build it "
            f"with features_only=True (its stages, out_indices={stages}, are the default)"
        )
    overlay = {**described["overlay"], **(overlay or {})}
    return described["architecture"], overlay, described["model_args"], stages


def _config(canonical: str, overrides: dict[str, Any], origin: str | None, yours: set[str]) -> SwinConfig:
    """The registered configuration with ``overrides``; for a hub repository's description (``origin``), errors in
    its entries name the repository (the caller's own, ``yours``, raise as they would without it), and a model
    larger than any checkpoint may be is refused before it is built."""
    if origin is None:
        return get_config(canonical).replace(**overrides)
    from .weights.hub_model import check_buildable

    described = {key: value for key, value in overrides.items() if key not in yours}
    return check_buildable(origin, get_config(canonical), described, {k: overrides[k] for k in yours if k in overrides})


def _placement(overrides: dict[str, Any]) -> dict[str, Any]:
    """timm's factory options that are not the architecture's, taken out of ``overrides``: ``device`` and
    ``dtype`` (returned, for ``model.to``), and its layer flags ``scriptable`` / ``exportable`` / ``no_jit``
    (timm's train.py passes ``scriptable=False``): these models have no scripted layers, export through
    torch.export and ONNX, and are not scriptable."""
    if overrides.pop("scriptable", False):
        raise ValueError(
            "scriptable=True asks for TorchScript, which these models do not support (per-size window plans are "
            "Python); deploy with torch.export or ONNX (swin.export, `swin export`), or use torch.compile"
        )
    for flag in ("exportable", "no_jit"):
        if not isinstance(overrides.pop(flag, False), bool):
            raise TypeError(f"{flag} is timm's layer flag, True or False")
    placement = {key: overrides.pop(key) for key in ("device", "dtype") if key in overrides}
    if "device" in placement:
        placement["device"] = torch.device(placement["device"])
    dtype = placement.get("dtype")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype expects a floating point torch.dtype (torch.bfloat16, ...), got {dtype!r}")
    return placement


def _overlay(overlay: Mapping[str, Any] | None, overrides: dict[str, Any], features_only: bool) -> dict[str, Any]:
    """``pretrained_cfg_overlay`` as a dict; as timm, its ``num_classes`` and ``input_size`` become the defaults
    of ``num_classes``, ``in_chans`` and ``img_size`` (timm's Swin configs have a fixed input size)."""
    if overlay is None:
        return {}
    if not isinstance(overlay, Mapping):
        raise TypeError(
            f"pretrained_cfg_overlay expects a dict of pretrained_cfg entries, got {type(overlay).__name__}; "
            "pass e.g. pretrained_cfg_overlay={'mean': (0.5, 0.5, 0.5)}"
        )
    overlay = dict(overlay)
    from .weights.data_config import check_preprocessing

    check_preprocessing(overlay, "pretrained_cfg_overlay")
    if overlay.get("num_classes") is not None and overlay["num_classes"] != -1 and not features_only:
        overrides.setdefault("num_classes", overlay["num_classes"])
    if overlay.get("input_size") is not None:
        channels, *size = overlay["input_size"]
        overrides.setdefault("in_chans", channels)
        overrides.setdefault("img_size", tuple(size))
    return overlay


def _overlay_source(overlay: dict[str, Any], pretrained: Any, name: str) -> Any:
    """What ``pretrained=True`` loads from the overlay, in timm's order (``state_dict``, ``file``, then the hub
    or ``url``), or None: nothing asked for, or the overlay names no weights. An ``hf_hub_id`` or ``url`` of one
    of the architecture's manifest entries (a model's own ``pretrained_cfg`` passed back) is that entry's tag."""
    if pretrained is False or pretrained is None:
        return None
    source = next((overlay[key] for key in ("state_dict", "file") if overlay.get(key)), None)
    manifest_tag = _manifest_tag(name, overlay) if source is None else None
    source = manifest_tag if source is None else source
    if source is None and overlay.get("hf_hub_id"):
        raise ValueError(
            "pretrained_cfg_overlay names hf_hub_id, but the Hugging Face Hub is not a source here; download "
            "the checkpoint and pass pretrained_cfg_overlay={'file': PATH} (or pretrained=PATH)"
        )
    source = source if source is not None else overlay.get("url") or None
    tag = name.partition(".")[2]
    mismatch = tag and manifest_tag is not None and manifest_tag != tag
    same = isinstance(source, str) and source == pretrained  # (never ==: a state dict's tensors cannot say)
    if mismatch or (source is not None and pretrained is not True and not same):
        raise ValueError(
            f"create_model({name!r}, pretrained={str(pretrained)[:40]!r}) and pretrained_cfg_overlay's weights "
            f"({str(source)[:60]}) name two different weights; pass pretrained=True (and the name without a tag) to "
            "load the overlay's, or leave state_dict/file/url/hf_hub_id out of the overlay"
        )
    return source


def _manifest_tag(name: str, overlay: Mapping[str, Any]) -> str | None:
    """The tag of ``name``'s architecture whose manifest sources include the overlay's ``hf_hub_id`` or ``url``."""
    hub, url = overlay.get("hf_hub_id"), overlay.get("url")
    if not (hub or url):
        return None
    from .weights import manifest

    try:
        arch = resolve_name(name.partition(".")[0])
    except KeyError:
        return None
    for tag in manifest.tags(arch):
        sources = manifest.get_entry(arch, tag).sources
        if any((hub and s.hf_hub == hub) or (url and s.url == url) for s in sources):
            return tag
    return None


def entry_model(entry: Any) -> nn.Module:
    """The architecture and head a manifest entry's weights are of, on the meta device (shapes only): what a
    download is checked to load into before it is cached (``swin.weights.pretrained.fetch(model_for=...)``)."""
    with torch.device("meta"):
        return SwinTransformer.from_config(get_config(entry.arch).replace(num_classes=entry.num_classes))


def _existing_file(path: str | os.PathLike) -> str:
    if not isinstance(path, (str, os.PathLike)) or not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint_path={path!r} is not a file; pass the path of a checkpoint")
    return os.fspath(path)
