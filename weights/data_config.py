"""Evaluation preprocessing of a pretrained tag: ``swin.data_config`` and the transform it describes."""

from __future__ import annotations

import math
import numbers
import weakref
from collections.abc import Mapping
from typing import Any

from torch import nn

from . import manifest

__all__ = ["data_config", "pretrained_cfg", "create_transform", "class_names", "check_preprocessing"]

# For models whose architecture has no manifest entry: ImageNet statistics and Swin's evaluation crop.
_FALLBACK = {
    "interpolation": "bicubic",
    "mean": (0.485, 0.456, 0.406),
    "std": (0.229, 0.224, 0.225),
    "crop_pct": 0.9,
    "crop_mode": "center",
    "labels": None,
}


def data_config(model_or_name: nn.Module | str) -> dict[str, Any]:
    """Input size, resize, crop, interpolation and mean/std to evaluate a model or a pretrained tag.

    Args:
        model_or_name: ``"swin_t"`` (its default tag), ``"swin_t.ms_in22k"``, a timm alias, or a model from
            ``create_model``: the tag it was loaded with, else its architecture's default tag at the model's
            own ``img_size``.

    Returns:
        ``input_size`` (C, H, W), ``resize_size`` (before the center crop: the shorter side for a square
        input, the (H, W) box the image is resized to cover for a non-square one), ``crop_pct``,
        ``crop_mode``, ``interpolation``, ``mean``, ``std``, ``num_classes`` and ``labels`` (timm's
        ImageNetInfo subset name, or None).
    """
    if isinstance(model_or_name, str):
        return manifest.get_entry(model_or_name).data_config()
    cfg = pretrained_cfg(model_or_name)
    return {k: cfg[k] for k in _keys()}


def pretrained_cfg(model: nn.Module) -> dict[str, Any]:
    """``model.pretrained_cfg``, in timm's key names, computed on every access (never stale).

    ``input_size`` is the model's own (``in_chans``, ``img_size``), ``num_classes`` its head's as it is now and
    ``labels`` the weights' class names only while the head still has their classes; the preprocessing
    (``mean``, ``std``, ``crop_pct``, ``crop_mode``, ``interpolation``, and the resize it implies) is the one of
    the tag that was loaded (recorded by the loader or by ``create_model("ARCH.TAG")``), else of the
    architecture's default tag. timm's ``resolve_model_data_config`` reads it.

    Your values win: ``model.pretrained_cfg = {"mean": ..., "crop_pct": 1.0}`` replaces the values you set
    before, and an edit of the returned dict (``cfg["crop_pct"] = 1.0``, ``cfg.update(...)``) is kept on the
    model as timm's plain dict keeps it; deleting a key from it drops your value and the derived one returns.
    A value equal to what the model reports when it is set is not pinned: ``model.pretrained_cfg =
    {**model.pretrained_cfg, "mean": m}`` pins ``mean`` only, and ``num_classes`` still follows a later
    ``reset_classifier``.
    """
    derived = _derived(model)
    pinned = _pinned(model)
    cfg = {**derived, **pinned}
    if "resize_size" not in pinned and ("input_size" in pinned or "crop_pct" in pinned):
        cfg["resize_size"] = _resize_size(cfg["input_size"], cfg["crop_pct"], _origin(model)[0])
    return PretrainedCfg(model, cfg)


def record_loaded(model: nn.Module, record: Mapping[str, Any] | None) -> None:
    """What the loader (or ``create_model("ARCH.TAG")``) records about the weights: ``file``, ``layout``,
    ``name``/``tag`` and the tag's :meth:`~swin.weights.manifest.PretrainedEntry.data_config`. Only the
    provenance and preprocessing of it are reported; sizes, classes and labels come from the model."""
    setattr(model, _RECORD, dict(record) if record else None)


def described_weights(model: nn.Module) -> dict[str, Any]:
    """The tag and preprocessing recorded on ``model`` (``create_model("ARCH.TAG")``, or a tag loaded before),
    without where those weights came from: what a file loaded into it next keeps."""
    record = dict(getattr(model, _RECORD, None) or {})
    return {k: v for k, v in record.items() if k not in ("file", "layout", *_PROVENANCE)}


def record_provenance(model: nn.Module, described: Mapping[str, Any]) -> None:
    """Where weights described elsewhere come from (a hub repository's ``config.json``): its ``hf_hub_id``,
    ``url`` and ``license``, None where it names none, in place of the default tag's."""
    record = dict(getattr(model, _RECORD, None) or {})
    record.update({key: described.get(key) for key in _PROVENANCE})
    setattr(model, _RECORD, record)


class PretrainedCfg(dict):
    """What ``model.pretrained_cfg`` returns: a dict of the current values whose edits are kept on the model
    (as your values, see :func:`pretrained_cfg`). A copy (``dict(cfg)``, ``copy.copy``, pickle) is a plain dict."""

    def __init__(self, model: nn.Module, values: Mapping[str, Any]) -> None:
        super().__init__(values)
        self._model = weakref.ref(model)

    def __reduce__(self):
        return dict, (dict(self),)

    def __setitem__(self, key: str, value: Any) -> None:
        self._set({key: value})

    def update(self, *args: Any, **kwargs: Any) -> None:
        self._set(dict(*args, **kwargs))

    def __ior__(self, other: Mapping[str, Any]) -> PretrainedCfg:
        self._set(dict(other))
        return self

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self._set({key: default})
        return self[key]

    def __delitem__(self, key: str) -> None:
        if key not in self:
            raise KeyError(key)
        self._unset([key])

    def pop(self, key: str, *default: Any) -> Any:
        if key not in self:
            if default:
                return default[0]
            raise KeyError(key)
        value = self[key]
        self._unset([key])
        return value

    def popitem(self) -> tuple[str, Any]:
        if not self:
            raise KeyError("popitem(): pretrained_cfg is empty")
        key = next(reversed(self))
        item = (key, self[key])
        self._unset([key])
        return item

    def clear(self) -> None:
        self._unset(list(self))

    def _set(self, values: dict[str, Any]) -> None:
        model = self._model()
        if model is None:  # the model is gone: an ordinary dict
            dict.update(self, values)
            return
        derived = _derived(model)
        # what the model reports already is not checked again (a one-channel model reports ImageNet's three
        # means, as timm's pretrained_cfg does)
        check_preprocessing(_changed(values, derived), "pretrained_cfg", model.config.in_chans)
        values = _plain(values)
        pinned = dict(_pinned(model))
        for key, value in values.items():
            if key in derived and _same(value, derived[key]):
                pinned.pop(key, None)
            else:
                pinned[key] = value
        _pin(model, pinned)
        self._refresh(model)

    def _unset(self, keys: list[str]) -> None:
        model = self._model()
        if model is None:
            for key in keys:
                dict.pop(self, key, None)
            return
        pinned = {k: v for k, v in _pinned(model).items() if k not in keys}
        try:
            _pin(model, pinned)
        except ValueError:  # a resize pinned to agree with the crop (or size) just dropped goes with it
            pinned.pop("resize_size", None)
            _pin(model, pinned)
        self._refresh(model)

    def _refresh(self, model: nn.Module) -> None:
        dict.clear(self)
        dict.update(self, pretrained_cfg(model))


# Where a model keeps them: the loader's record, and what you set (``model.pretrained_cfg = {...}``).
_RECORD = "_weights_record"
_USER = "_loaded_cfg"
_MISSING = object()


def check_preprocessing(values: Mapping[str, Any], origin: str, channels: int | None = None) -> None:
    """Refuse preprocessing entries that no transform can use, naming ``origin`` (where they came from) and the
    entry: sizes of three positive ints, crops in (0, 1] of a finite number, one mean and std per channel (of
    ``input_size`` where ``values`` has one, else ``channels`` where given; a single value serves all)...
    Entries it does not know, and None, pass as they are (timm's pretrained_cfg carries free-form ones: license,
    notes, ...)."""

    def fail(key: str, expected: str) -> None:
        raise ValueError(f"{origin} {key} is {values[key]!r}; expected {expected}")

    for key in ("input_size", "test_input_size", "min_input_size"):
        if values.get(key) is not None and not _ints(values[key], 3):
            fail(key, "(channels, height, width): three positive ints, e.g. (3, 224, 224)")
    if values.get("resize_size") is not None and not (
        _ints(values["resize_size"], 1) or _ints(values["resize_size"], 2)
    ):
        fail("resize_size", "a positive int (the shorter side) or a [height, width] box of them")
    for key in ("crop_pct", "test_crop_pct"):
        if values.get(key) is not None and not (_number(values[key]) and 0 < values[key] <= 1):
            fail(key, "a number in (0, 1], the crop's share of the resized image (Swin's is 0.9)")
    for key in ("mean", "std"):
        value = values.get(key)
        if value is not None and not (
            isinstance(value, (list, tuple)) and value and all(_number(v) and (key == "mean" or v > 0) for v in value)
        ):
            fail(key, f"one number per channel{', each positive' if key == 'std' else ''}, e.g. (0.5, 0.5, 0.5)")
    if _ints(values.get("input_size"), 3):
        channels = values["input_size"][0]
    for key in ("mean", "std"):
        if values.get(key) is not None and channels is not None and len(values[key]) not in (1, channels):
            fail(key, f"{channels} numbers, one per input channel (or one for all)")
    if values.get("interpolation") is not None and values["interpolation"] not in _INTERPOLATIONS:
        fail("interpolation", "one of " + ", ".join(repr(mode) for mode in _INTERPOLATIONS))
    if values.get("crop_mode") is not None and values["crop_mode"] not in ("center", "squash", "border"):
        fail("crop_mode", "one of 'center', 'squash', 'border' (timm's)")


# What timm's evaluation transform takes by name (timm's str_to_interp_mode: torchvision's InterpolationMode
# without "nearest-exact", which timm's transforms refuse).
_INTERPOLATIONS = ("bilinear", "bicubic", "nearest", "box", "hamming", "lanczos")


def _plain(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with numpy's numbers (checked by :func:`check_preprocessing`) as Python's: what is kept is
    written to JSON (an ONNX file's metadata, ``--format json``)."""

    def plain(value: Any) -> Any:
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return int(value)
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, (list, tuple)):
            return type(value)(plain(v) for v in value)
        return value

    return {key: plain(value) for key, value in values.items()}


def _number(value: Any) -> bool:
    """A finite real number (numpy's too), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _ints(value: Any, count: int) -> bool:
    """``count`` positive ints (one may stand alone for ``count`` 1)."""
    items = value if isinstance(value, (list, tuple)) else [value]
    return len(items) == count and all(
        isinstance(v, numbers.Integral) and not isinstance(v, bool) and v > 0 for v in items
    )


def _derived(model: nn.Module) -> dict[str, Any]:
    config = getattr(model, "config", None)
    if config is None:
        raise TypeError(f"expected a model name or a swin model, got {type(model).__name__}")
    origin, record = _origin(model)
    height, width = config.img_size
    num_classes = getattr(model, "num_classes", config.num_classes)
    stride = config.patch_size * 2 ** (len(config.depths) - 1)
    input_size = (config.in_chans, height, width)
    # the tag the weights are of: the recorded one, none for weights from a file, else the default tag
    name = origin.get("name") if "name" in record or "file" not in record else None
    derived = {
        "architecture": config.name,
        "tag": name.split(".", 1)[1] if name else None,
        "input_size": input_size,
        **{k: origin[k] for k in _PREPROCESSING},
        "resize_size": _resize_size(input_size, origin["crop_pct"], origin),
        "num_classes": num_classes,
        "labels": origin.get("labels") if num_classes == origin.get("num_classes") else None,
        "pool_size": (-(-height // stride), -(-width // stride)),
        "first_conv": "patch_embed.proj",
        "classifier": "head",
    }
    # where the default tag's weights come from (timm reports them before any are loaded); none for weights
    # loaded from elsewhere (a file, a URL, a state dict), whose record says what it knows
    derived.update({k: None if "file" in record else origin.get(k) for k in _PROVENANCE})
    # the provenance the loader recorded (file, layout, name, tag, hf_hub_id...), never the tag's sizes or classes
    derived.update({k: v for k, v in record.items() if k not in _keys()})
    return derived


def _origin(model: nn.Module) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the preprocessing and head of the weights: the recorded tag's, else the default tag's, else ImageNet
    statistics; the loader's record)."""
    record = dict(getattr(model, _RECORD, None) or {})
    if all(k in record for k in _PREPROCESSING) and "input_size" in record:
        return record, record
    try:
        entry = manifest.get_entry(model.config.name)
    except KeyError:  # an architecture without pretrained weights
        return {**_FALLBACK, "input_size": None, "num_classes": None}, record
    return {"name": entry.name, **entry.provenance(), **entry.data_config()}, record


def _resize_size(input_size: Any, crop_pct: float, origin: Mapping[str, Any]) -> int | tuple[int, int]:
    """What the image is resized to before the center crop, as timm's evaluation transform does it.

    A square input: the shorter side, the weights' own at their size and crop, else timm's floor(size / crop).
    A non-square (H, W): the box (floor(H / crop), floor(W / crop)) that the image is resized to cover, keeping
    its aspect ratio (timm's ``scale_size``), the weights' own box where they have one at this size and crop.
    """
    height, width = tuple(input_size)[-2:]
    own = origin.get("input_size")
    if own is not None and tuple(own)[-2:] == (height, width) and crop_pct == origin["crop_pct"]:
        if height == width or not isinstance(origin["resize_size"], int):  # an int is one side: square only
            return origin["resize_size"]
    if height == width:
        return math.floor(height / crop_pct)
    return (math.floor(height / crop_pct), math.floor(width / crop_pct))


def _pinned(model: nn.Module) -> Mapping[str, Any]:
    """Your values (those that differed from what the model reported when you set them)."""
    return getattr(model, _USER, None) or {}


def set_pretrained_cfg(model: nn.Module, values: Mapping[str, Any] | None) -> None:
    """``model.pretrained_cfg = values``: keep the values that differ from what the model reports now (so that
    assigning back a copy with one change pins that one only); None forgets them all."""
    derived = _derived(model)
    check_preprocessing(_changed(values or {}, derived), "pretrained_cfg", model.config.in_chans)
    values = _plain(values or {})
    _pin(model, _changed(values, derived))


def _pin(model: nn.Module, pinned: Mapping[str, Any]) -> None:
    """Keep ``pinned`` as your values, unless the resize they make disagrees with the crop (timm reads
    ``crop_pct`` alone): then the values before stay, and the error says what to set."""
    before = getattr(model, _USER, None)
    setattr(model, _USER, dict(pinned) or None)
    try:
        resize_box(pretrained_cfg(model))
    except ValueError as error:
        setattr(model, _USER, before)
        raise ValueError(f"pretrained_cfg {error}") from None


def _changed(values: Mapping[str, Any], derived: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of ``values`` that differ from what the model reports."""
    return {k: v for k, v in values.items() if not _same(v, derived.get(k, _MISSING))}


def _same(a: Any, b: Any) -> bool:
    """Equal, a list equal to a tuple included (a config read from JSON or YAML)."""
    if isinstance(a, list):
        a = tuple(a)
    if isinstance(b, list):
        b = tuple(b)
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 (a value whose == does not answer a bool, e.g. a tensor)
        return False


_PREPROCESSING = ("interpolation", "mean", "std", "crop_pct", "crop_mode")
_PROVENANCE = ("hf_hub_id", "url", "license")  # timm's pretrained_cfg keys for where weights come from


def _keys() -> tuple[str, ...]:
    return (
        "input_size",
        "interpolation",
        "mean",
        "std",
        "crop_pct",
        "crop_mode",
        "resize_size",
        "num_classes",
        "labels",
    )


def create_transform(config: Mapping[str, Any] | str | nn.Module):
    """A torchvision transform (PIL image -> normalised tensor) for a ``data_config`` dict (or the model or name
    :func:`data_config` describes): timm's evaluation transform (``timm.data.create_transform`` of the same
    config), with ``resize_size`` as the resize.

    ``crop_mode`` "center" (the default): a square input resizes the shorter side to ``resize_size``; a
    non-square one resizes the image, keeping its aspect ratio, to the smallest size that covers the
    ``resize_size`` (H, W) box. Then a center crop to ``input_size``. "squash" resizes to the box ignoring the
    aspect ratio, "border" to fit inside it, padding with the mean colour. Then scale to [0, 1] and normalise
    with ``mean``/``std``, all with ``interpolation``.

    Without ``resize_size`` (timm's own config dicts), the resize is timm's ``floor(input / crop_pct)``.

    Raises:
        ValueError: ``resize_size`` and ``crop_pct`` disagree, or ``resize_size`` is one side for a non-square
            ``input_size`` (see :func:`resize_box`), or an unknown ``crop_mode``.
    """
    from torchvision import transforms

    if isinstance(config, (str, nn.Module)):
        config = data_config(config)
    elif not isinstance(config, Mapping):
        raise TypeError(
            f"create_transform takes a data_config dict, a model or a name, got {type(config).__name__}; "
            "e.g. create_transform(swin.data_config(model))"
        )
    channels, height, width = config["input_size"]
    # ImageNet's three values for a one-channel model (what it reports, as timm's): their average, as timm's
    # save_for_hf writes them and as its adapt_input_conv sums the three input planes' weights into one
    mean, std = (_averaged(config[key], channels) for key in ("mean", "std"))
    mode = transforms.InterpolationMode(config["interpolation"])
    crop_mode = config.get("crop_mode") or "center"
    box = resize_box(config)
    if crop_mode == "center" and box[0] == box[1]:  # the square case: the shorter side to resize_size
        resize, crop = transforms.Resize(box[0], interpolation=mode), transforms.CenterCrop((height, width))
    elif crop_mode == "center":  # to cover the box, keeping the aspect ratio (timm's own transform)
        from timm.data.transforms import ResizeKeepRatio

        resize = ResizeKeepRatio(box, longest=0.0, interpolation=config["interpolation"])
        crop = transforms.CenterCrop((height, width))
    elif crop_mode == "squash":
        resize, crop = transforms.Resize(box, interpolation=mode), transforms.CenterCrop((height, width))
    elif crop_mode == "border":  # to fit inside the box, padded with the mean colour (timm's own transforms)
        from timm.data.transforms import CenterCropOrPad, ResizeKeepRatio

        resize = ResizeKeepRatio(box, longest=1.0, interpolation=config["interpolation"])
        crop = CenterCropOrPad((height, width), fill=tuple(round(255 * v) for v in mean))
    else:
        raise ValueError(
            f"crop_mode {crop_mode!r} is not one of 'center', 'squash', 'border' (timm's); pass one of them"
        )
    # a one-channel model takes grey images: PIL's luminance of a colour image (as torchvision's Grayscale)
    grey = [transforms.Grayscale(1)] if channels == 1 else []
    return transforms.Compose([*grey, resize, crop, transforms.ToTensor(), transforms.Normalize(mean, std)])


def _averaged(values: Any, channels: int) -> tuple[float, ...]:
    """``values`` as they are, or their average where they are not one per channel (nor one for all)."""
    values = tuple(values)
    return values if len(values) in (1, channels) else (sum(values) / len(values),)


def resize_box(config: Mapping[str, Any]) -> tuple[int, int]:
    """The (H, W) box the evaluation transform resizes to before its crop: ``resize_size`` (one side for a square
    input, else a [height, width] box), else timm's ``floor(input / crop_pct)`` from ``crop_pct``.

    Raises:
        ValueError: neither is given; ``resize_size`` and ``crop_pct`` disagree (timm's transform reads
            ``crop_pct`` alone, so one of them would be silently ignored); or ``resize_size`` is one side for a
            non-square ``input_size`` (the image would not cover the crop: black bars).
    """
    _, height, width = config["input_size"]
    crop_pct = config.get("crop_pct")
    timm = None  # what timm's create_transform resizes to for this crop
    if _number(crop_pct) and 0 < crop_pct <= 1:
        timm = (math.floor(height / crop_pct), math.floor(width / crop_pct))
    size = config.get("resize_size")
    if size is None:
        if timm is None:
            raise ValueError(
                "the preprocessing config has neither resize_size nor crop_pct; give crop_pct (timm's: the crop's "
                "share of the resized image, 0.9 for Swin)"
            )
        return timm
    box = _box(size, height, width, timm)
    if timm is not None and box != timm:
        side = timm[0] if height == width else list(timm)
        fits = round(height / (box[0] + 0.5), 6)  # a crop whose floor(input / crop) is the box
        fits = fits if (math.floor(height / fits), math.floor(width / fits)) == box else None
        raise ValueError(
            f"resize_size {size!r} and crop_pct {crop_pct} disagree: crop_pct resizes to {side} "
            f"(floor(input / crop_pct), as timm's transform, which reads crop_pct alone); leave resize_size out to "
            "follow crop_pct, or "
            + (
                f"give it together with crop_pct={fits}, which resizes to {size!r} (e.g. "
                f"pretrained_cfg.update(resize_size={size!r}, crop_pct={fits}))"
                if fits
                else "give it together with the crop_pct that resizes to it"
            )
        )
    return box


def _box(size: Any, height: int, width: int, timm: tuple[int, int] | None) -> tuple[int, int]:
    """``resize_size`` as an (H, W) box; a single side (an int) is a square box, refused for a non-square input."""
    if isinstance(size, (list, tuple)):
        if len(size) == 1:
            size = size[0]
        elif len(size) == 2:
            return (int(size[0]), int(size[1]))
        else:
            raise ValueError(f"resize_size {size!r}: expected one side or a [height, width] box")
    if height != width:
        hint = f" (timm's: {list(timm)})" if timm else ""
        raise ValueError(
            f"resize_size {size} is one side, but input_size {height}x{width} is not square: the resized image "
            f"would not cover the crop (black bars); give resize_size as a [height, width] box{hint}, or leave it "
            "out of the model's pretrained_cfg to have it derived from crop_pct"
        )
    return (int(size), int(size))


def class_names(config: dict[str, Any]) -> list[str] | None:
    """Human-readable class names for ``config["labels"]`` (timm ships ImageNet-1k and -22k's), or None."""
    subset = config.get("labels")
    if not subset:
        return None
    from timm.data import ImageNetInfo

    info = ImageNetInfo(subset)
    return [info.index_to_description(i) for i in range(info.num_classes())]
