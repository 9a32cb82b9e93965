"""``swin predict``: classify one image with the weights a user names, with their head and preprocessing."""

from __future__ import annotations

import json
import math
import os
import re

import torch

from ..factory import entry_model
from ..registry import resolve_name
from ..weights import manifest
from ..weights.user_weights import class_labels, locate_weights, preprocessing_for, read_weights
from .argtypes import whole_number
from .described import described_model, is_described
from .images import check_resized_size, read_image

__all__ = ["check_window", "cmd_predict", "register"]

_TABLE = re.compile(r"layers\.(\d+)\.blocks\.\d+\.attn\.relative_position_bias_table")


def check_window(arch: str, state: dict[str, torch.Tensor], origin: str) -> None:
    """Refuse a checkpoint (our layout) whose relative position bias tables are for other windows than
    ``arch``'s: loading would interpolate them (``fit_state_dict``) into a model the weights were not trained as.
    The message names the registered architectures whose windows fit, if any.
    """
    from ..registry import get_config

    config = get_config(arch)
    if config.version != 1:
        return  # Swin V2's continuous position bias has no table tied to the window
    rows = _table_rows(state)
    expected = _expected_rows(config)
    wrong = [stage for stage, count in rows.items() if stage < len(expected) and count != expected[stage]]
    if not wrong:
        return
    stage = wrong[0]
    side = math.isqrt(rows[stage])
    theirs = (
        f"window {_window_of(rows[stage])} ({side}x{side} bias table)"
        if side * side == rows[stage]
        else (f"a {rows[stage]}-row bias table")
    )
    height, width = config.stage_windows()[stage]
    ours = f"{height}" if height == width else f"{height}x{width}"
    fitting = _fitting_architectures(config, rows)
    if fitting:
        advice = f"run it with --model {fitting[0]}" + (f" (or {', '.join(fitting[1:])})" if fitting[1:] else "")
    else:
        windows = ", ".join(_window_of(rows[i]) for i in sorted(rows))
        setting = f"window_size: [{windows}]" if "rows" not in windows else "window_size, one per stage"
        advice = (
            f"register an architecture like {arch} whose stages have the checkpoint's windows ({windows}; set by "
            f"{setting}, and img_size where a stage's map is smaller than the window) in a YAML file (format of "
            "registry/models.yaml), and run it with --models-file FILE"
        )
    raise ValueError(f"{origin} has {theirs} at stage {stage + 1} but {arch} has window {ours} there: {advice}")


def _window_of(rows: int) -> str:
    """The square window a table of ``rows`` rows is for, or the row count when it is not square."""
    side = math.isqrt(rows)
    return str((side + 1) // 2) if side * side == rows else f"{rows} rows"


def _table_rows(state: dict[str, torch.Tensor]) -> dict[int, int]:
    rows = {}
    for key, value in state.items():
        match = _TABLE.fullmatch(key)
        if match:
            rows[int(match[1])] = value.shape[0]
    return rows


def _expected_rows(config) -> list[int]:
    return [(2 * h - 1) * (2 * w - 1) for h, w in config.stage_windows()]


def _fitting_architectures(config, rows: dict[int, int]) -> list[str]:
    """Registered Swin V1 architectures of ``config``'s shape whose every stage's bias table has ``rows``'s size."""
    from ..registry import get_config, list_models

    shape = (config.embed_dim, tuple(config.depths), tuple(config.num_heads))
    fitting = []
    for name in list_models():
        other = get_config(name)
        if other.version != 1 or (other.embed_dim, tuple(other.depths), tuple(other.num_heads)) != shape:
            continue
        expected = _expected_rows(other)
        if all(stage < len(expected) and count == expected[stage] for stage, count in rows.items()):
            fitting.append(name)
    return fitting


_FOLDER_HINT = " (swin validate scores a folder)"


def _name_a_missing_image(path) -> None:
    """A missing image or a folder is named before any weights are fetched (a typo must not wait for a
    download): read_image's "no such image file" or folder error."""
    if os.path.isdir(path) or not os.path.exists(path):
        read_image(path, _FOLDER_HINT)


def _predict_described(args) -> int:
    """``--model hf-hub:REPO`` or ``local-dir:FOLDER``: the model, head, classes and preprocessing its
    ``config.json`` describes (timm's or transformers'), with its own weights."""
    from ..weights.data_config import class_names, create_transform, data_config

    _name_a_missing_image(args.image)
    model = described_model(args.model, args.weights, classifier=True)
    image = read_image(args.image, _FOLDER_HINT)
    config = data_config(model)
    check_resized_size(image, config, args.image)
    with torch.inference_mode():
        probabilities = model(create_transform(config)(image).unsqueeze(0)).softmax(dim=-1)[0]
    cfg = model.pretrained_cfg
    names = cfg.get("label_names")
    if names and len(names) != model.num_classes:  # by index, a shorter list failed, a longer one was off by the gap
        raise ValueError(
            f"{args.model}: its config.json lists {len(names)} class names (label_names) for a "
            f"{model.num_classes}-class head; make label_names one name per class, in the head's order"
        )
    if not names:  # the tag's label set, where it names this head's classes
        names = class_names(cfg)
        if names is None or len(names) != model.num_classes:
            names = [f"class {i}" for i in range(model.num_classes)]
    descriptions = cfg.get("label_descriptions") or {}
    names = [descriptions.get(name, name) for name in names]
    file = cfg.get("file")
    described = {
        "model": args.model,
        "weights": args.model,
        "file": file and os.fspath(file),
        "layout": cfg.get("layout"),
    }
    return _report(args, probabilities, names, config, described)


def _report(args, probabilities: torch.Tensor, names: list[str], config, described: dict) -> int:
    """The top classes, as a table or JSON (``described``: model, weights, file, layout)."""
    top = probabilities.topk(min(args.top, probabilities.numel()))
    rows = [
        {"index": int(i), "probability": float(p), "label": names[int(i)]}
        for p, i in zip(top.values, top.indices, strict=True)
    ]
    if args.format == "json":
        shown = ("input_size", "resize_size", "crop_pct", "crop_mode", "interpolation", "mean", "std")
        result = {
            "image": os.fspath(args.image),
            **described,
            "num_classes": probabilities.numel(),
            "preprocessing": {k: list(v) if isinstance(v, tuple) else v for k, v in config.items() if k in shown},
            "top": rows,
        }
        print(json.dumps(result, indent=2))
    else:
        print(f"{args.image} ({described['model']}, weights {described['weights']}, {probabilities.numel()} classes):")
        for rank, row in enumerate(rows, 1):
            print(f"  {rank}. {row['probability']:7.2%}  {row['index']:>5}  {row['label']}")
    return 0


def cmd_predict(args) -> int:
    from ..factory import create_model
    from ..weights.data_config import create_transform, data_config

    if is_described(args.model):
        return _predict_described(args)
    arch, _, tag = args.model.partition(".")
    arch = resolve_name(arch)
    named = manifest.get_entry(arch, tag) if tag else None  # an explicit tag: its weights or preprocessing
    # A missing image is named before any weights are fetched (a typo must not wait for a download); the
    # weights are located (fetched if need be) before the image is read, and read after it: a bad image costs
    # no checkpoint read.
    _name_a_missing_image(args.image)
    located = locate_weights(
        arch, args.weights if args.weights else (named.tag if named else True), model_for=entry_model
    )
    image = read_image(args.image, _FOLDER_HINT)
    weights = read_weights(*located)
    num_classes = weights.num_classes
    if num_classes is None:
        raise ValueError(f"{weights.name} has no classifier head (head.weight): a backbone checkpoint cannot classify")
    check_window(arch, weights.state, weights.name)
    model = create_model(arch, num_classes=num_classes, pretrained=weights.state).eval()
    described = weights.entry or named  # the tag whose preprocessing and labels apply, if any
    config = preprocessing_for(arch, described, weights.layout) or data_config(model)
    check_resized_size(image, config, args.image)
    x = create_transform(config)(image).unsqueeze(0)
    with torch.inference_mode():
        probabilities = model(x).softmax(dim=-1)[0]
    names = class_labels(num_classes, described.labels if described else None)
    return _report(
        args,
        probabilities,
        names,
        config,
        {
            "model": weights.entry.name if weights.entry else arch,
            "weights": weights.name,
            "file": os.fspath(weights.path),
            "layout": weights.layout,
        },
    )


def register(sub) -> None:
    p = sub.add_parser(
        "predict",
        help="classify an image with pretrained weights",
        description="Classify an image. The head's size comes from the weights (ImageNet-1k names for 1000 "
        "classes, ImageNet-22k's for 21841, else 'class N'); the preprocessing is the tag's, or for a checkpoint "
        "file that of its publisher (torchvision's transforms for torchvision files, crop 0.9 bicubic for "
        "Microsoft's and timm's).",
    )
    p.add_argument("image", metavar="IMAGE", help="an image file PIL can read (JPEG, PNG, ...)")
    p.add_argument(
        "--model",
        required=True,
        metavar="NAME[.TAG]",
        help="e.g. swin_t or swin_b.ms_in22k_ft_in1k; or hf-hub:OWNER/NAME, local-dir:FOLDER (a timm or transformers "
        "model repository or folder: its own weights, classes and preprocessing)",
    )
    p.add_argument(
        "--weights", default=None, help="a checkpoint file, URL or tag instead of the tag's (or default) download"
    )
    p.add_argument("--top", type=whole_number(1), default=5, help="how many classes to print (default 5)")
    p.add_argument("--format", choices=("table", "json"), default="table", help="output format (default: table)")
    p.set_defaults(func=cmd_predict)
