"""The data of ``swin show attention``: the attention probabilities of a real forward pass, per block.

Forward hooks on every block capture the map size it ran on, and on its ``attn`` module the windows and
shift mask it was called with and what it returned. The probabilities are then recomputed from the module's
own weights (:func:`swin.layers.attention_probs.attention_probabilities`) and must reproduce the module's
output, and the window layout drawn must be the block's own gather plan: otherwise this raises rather than
draw something the model did not do. The model itself is not changed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch

from ..layers.attention_probs import attention_output, attention_probabilities
from ..registry import get_config, resolve_name
from .images import check_resized_size, read_image
from .show_windows import WindowLayout, layout_for

__all__ = [
    "AttentionRequest",
    "AttentionView",
    "BlockAttention",
    "attention_view",
    "Prepared",
    "check_request",
    "prepare",
]


@dataclass(frozen=True)
class AttentionRequest:
    """What ``swin show attention`` was asked for, checked (ranges, files) before anything heavy runs."""

    image: str
    arch: str
    entry: object | None  # the manifest entry of NAME.TAG (or of the cached default), for weights / preprocessing
    weights: str | None  # the checkpoint file to read; None with random weights
    random_weights: bool
    stage: int  # 1-based
    block: int  # 1-based
    head: int | None  # 1-based; None: the mean of the heads
    query: tuple[int, int]  # (row, col) in the stage's map, 0-based


def _locate_weights(arch: str, tag: str, weights: str | None, random_weights: bool):
    """(manifest entry or None, file to read or None), or a one-line error saying how to get weights."""
    from ..weights import manifest

    if random_weights and weights:
        raise ValueError("--random-weights and --weights contradict each other; pass one of them")
    entry = manifest.get_entry(arch, tag) if tag else None  # an unknown tag: KeyError naming the tags
    if random_weights:
        return entry, None
    if weights:
        if os.path.isdir(weights) or not os.path.isfile(weights):
            raise FileNotFoundError(f"--weights {weights}: no such file; pass a checkpoint file")
        return entry, weights
    if entry is None:
        if not manifest.tags(arch):
            raise ValueError(
                f"{arch} has no pretrained weights in the manifest: pass --weights FILE, or --random-weights to draw "
                "an untrained model"
            )
        entry = manifest.get_entry(arch)
    cached = entry.cached_file()
    if cached is None:
        raise FileNotFoundError(
            f"weights {entry.name} are not in the cache: fetch them with `swin download {entry.name}`, pass a "
            "checkpoint with --weights FILE, or --random-weights to draw an untrained model"
        )
    return entry, os.fspath(cached)


def check_request(args) -> AttentionRequest:
    """Every argument of ``swin show attention`` checked against the architecture, the image opened and the
    weights located, before a model is built or a checkpoint read."""
    arch, dot, tag = args.model.partition(".")
    if dot and not tag:
        raise ValueError(f"--model {args.model} ends in a dot; write NAME or NAME.TAG (e.g. swin_t.ms_in1k)")
    arch = resolve_name(arch)
    config = get_config(arch)
    read_image(args.image)  # before any model is built: a bad path costs nothing
    entry, weights = _locate_weights(arch, tag, args.weights, args.random_weights)
    stages = len(config.depths)
    if not 1 <= args.stage <= stages:
        raise ValueError(f"--stage {args.stage} is out of range: {arch} has stages 1..{stages}")
    depth, heads = config.depths[args.stage - 1], config.num_heads[args.stage - 1]
    block = depth if args.block is None else args.block
    if not 1 <= block <= depth:
        raise ValueError(f"--block {block} is out of range: stage {args.stage} of {arch} has blocks 1..{depth}")
    if args.head is not None and not 1 <= args.head <= heads:
        raise ValueError(f"--head {args.head} is out of range: stage {args.stage} of {arch} has heads 1..{heads}")
    height, width = config.stage_sizes()[args.stage - 1]
    row, col = (height // 2, width // 2) if args.query is None else args.query
    if not (0 <= row < height and 0 <= col < width):
        raise ValueError(
            f"--query {row},{col} is outside stage {args.stage}'s {height}x{width} token map (at the model's input "
            f"{config.img_size[0]}x{config.img_size[1]}): rows 0..{height - 1}, columns 0..{width - 1}"
        )
    return AttentionRequest(
        args.image, arch, entry, weights, args.random_weights, args.stage, block, args.head, (row, col)
    )


class Prepared(NamedTuple):
    """The model in eval mode, the image preprocessed for it, what undoes the normalisation, and which weights."""

    model: torch.nn.Module
    image: torch.Tensor  # (1, 3, H, W) at the model's input size
    mean: tuple[float, ...]
    std: tuple[float, ...]
    caption: str


def prepare(request: AttentionRequest) -> Prepared:
    """Build the model with the requested weights and preprocess the image as those weights expect."""
    from ..factory import create_model
    from ..weights.data_config import create_transform, data_config
    from ..weights.user_weights import preprocessing_for, read_weights
    from .predict_cmd import check_window

    layout = None
    if request.random_weights:
        torch.manual_seed(0)
        model = create_model(request.arch)
        caption = "RANDOM WEIGHTS (untrained, seed 0): near-uniform attention is expected, not learned structure"
    else:
        loaded = read_weights(Path(request.weights), request.entry)
        check_window(request.arch, loaded.state, loaded.name)
        model = create_model(request.arch, num_classes=loaded.num_classes or 0, pretrained=loaded.state)
        caption = f"weights {loaded.name}"
        layout = loaded.layout
    model.eval()
    config = dict(preprocessing_for(request.arch, request.entry, layout) or data_config(model))
    config["input_size"] = (3, *model.config.img_size)  # the size the stage maps were checked against
    pixels = read_image(request.image)  # 8-bit RGB, 16-bit and float images rescaled (not clipped)
    check_resized_size(pixels, config, request.image)
    x = create_transform(config)(pixels).unsqueeze(0)
    return Prepared(model, x, tuple(config["mean"]), tuple(config["std"]), caption)


@dataclass(frozen=True)
class BlockAttention:
    """One block's attention in the forward: probabilities (nW, heads, N, N) of the first image, the window
    layout (the block's own plan), and the mean attention distance of each head in input pixels."""

    stage: int  # 1-based
    block: int  # 1-based
    layout: WindowLayout
    probs: torch.Tensor
    stride: int  # input pixels per token side at this stage
    distance: list[float]
    uniform_distance: float  # the same for attention spread evenly over the keys each query may attend to


def _mean_distance(layout: WindowLayout, probs: torch.Tensor, stride: int) -> list[float]:
    """Per head: the expected distance, in input pixels, from a query to the keys it attends to, averaged over
    the queries that are image tokens (padding queries left out), as the ViT paper's attention distance."""
    home = layout.in_window_order(layout.home).float()  # nW, N, 2
    distance = torch.cdist(home, home) * stride  # nW, N, N
    per_query = (probs * distance[:, None]).sum(dim=-1)  # nW, heads, N
    real = layout.in_window_order(layout.source) >= 0  # nW, N
    return (per_query * real[:, None]).sum(dim=(0, 2)).div(real.sum()).tolist()


def _uniform(layout: WindowLayout, stride: int) -> float:
    """:func:`_mean_distance` of attention spread evenly over the keys the mask allows: the reference an
    untrained model sits at."""
    allowed = torch.zeros(layout.num_windows, 1, layout.tokens, layout.tokens)
    if layout.masks is not None:
        allowed = layout.masks[:, None]
    return _mean_distance(layout, allowed.softmax(dim=-1), stride)[0]


def _check_same(block, layout: WindowLayout, height: int, width: int, device) -> None:
    """The layout drawn must be the block's own gather plan (same windows, same tokens in them)."""
    plan = block.plans.get(height, width, block.window, block.shift_for(height, width), block.rules.pad_first, device)
    ours = layout.in_window_order(layout.source).flatten()
    theirs = torch.where(plan.gather < height * width, plan.gather, -1).cpu()
    if not torch.equal(ours, theirs):
        raise RuntimeError("the window layout does not match the block's gather plan; the drawing would be wrong")


def capture(model: torch.nn.Module, image: torch.Tensor) -> list[BlockAttention]:
    """Run ``image`` through ``model`` once and return the attention of every block, in order."""
    seen: dict[int, dict] = {}
    handles = []
    blocks = [(s, b, block) for s, stage in enumerate(model.layers) for b, block in enumerate(stage.blocks)]
    for key, (_, _, block) in enumerate(blocks):

        def before(module, args, key=key):
            seen[key] = {"size": tuple(args[0].shape[1:3])}

        def after(module, args, output, key=key):
            seen[key].update(windows=args[0], mask=args[1] if len(args) > 1 else None, output=output)

        handles.append(block.register_forward_pre_hook(before))
        handles.append(block.attn.register_forward_hook(after))
    try:
        with torch.no_grad():
            model(image)
    finally:
        for handle in handles:
            handle.remove()
    patch = model.config.patch_size
    result = []
    with torch.no_grad():
        for key, (s, b, block) in enumerate(blocks):
            run = seen[key]
            probs = attention_probabilities(block.attn, run["windows"], run["mask"])
            expected = run["output"]
            if not torch.allclose(
                attention_output(block.attn, probs), expected, rtol=1e-3, atol=1e-4 * float(expected.abs().max()) + 1e-6
            ):
                raise RuntimeError(
                    f"stage {s + 1} block {b + 1}: the recomputed attention does not reproduce the module's output "
                    f"({type(block.attn).__name__} wrapped or changed?); refusing to draw probabilities it did not use"
                )
            height, width = run["size"]
            layout = layout_for(height, width, block.window, block.shift_for(height, width), block.rules.pad_first)
            _check_same(block, layout, height, width, image.device)
            stride = patch * 2**s
            first = probs.probs[0].float()
            distance = _mean_distance(layout, first, stride)
            result.append(BlockAttention(s + 1, b + 1, layout, first, stride, distance, _uniform(layout, stride)))
    return result


@dataclass(frozen=True)
class AttentionView:
    """What the figure draws: the query's attention over the map, its window as a grid, every head's distance."""

    model: str
    blocks: list[BlockAttention]
    chosen: BlockAttention
    head: int | None
    heads: int
    query: tuple[int, int]
    window: int  # index of the query's window (model order)
    row: torch.Tensor  # (N,) the query's attention over the window's keys (window order)
    heat: torch.Tensor  # (h, w) that attention on the map (0 outside the window)
    padding_mass: float  # attention on padding keys
    image: torch.Tensor  # (H, W, 3) the preprocessed image, back in [0, 1]
    mean: tuple[float, ...]
    std: tuple[float, ...]


def attention_view(
    model: torch.nn.Module,
    image: torch.Tensor,
    stage: int,
    block: int,
    head: int | None,
    query: tuple[int, int],
    mean: tuple[float, ...] = (0.485, 0.456, 0.406),
    std: tuple[float, ...] = (0.229, 0.224, 0.225),
) -> AttentionView:
    """Capture every block's attention and pick the query's row in block ``block`` of stage ``stage``
    (1-based; ``head`` 1-based or None for the mean of the heads). ``mean``/``std``: the normalisation to undo
    for showing the image."""
    blocks = capture(model, image)
    chosen = next(b for b in blocks if (b.stage, b.block) == (stage, block))
    layout = chosen.layout
    height, width = layout.map_size
    windows = layout.in_window_order(layout.source)  # nW, N: source token per window token
    where = torch.nonzero(windows == query[0] * width + query[1])
    window, token = (int(v) for v in where[0])
    heads = chosen.probs[window, :, token]  # heads, N
    row = heads.mean(dim=0) if head is None else heads[head - 1]
    keys = windows[window]
    heat = torch.zeros(height * width)
    heat[keys[keys >= 0]] = row[keys >= 0]
    picture = image[0].permute(1, 2, 0) * torch.tensor(std) + torch.tensor(mean)
    return AttentionView(
        model=model.config.name,
        blocks=blocks,
        chosen=chosen,
        head=head,
        heads=chosen.probs.shape[1],
        query=query,
        window=window,
        row=row,
        heat=heat.view(height, width),
        padding_mass=float(row[keys < 0].sum()),
        image=picture.clamp(0, 1),
        mean=tuple(mean),
        std=tuple(std),
    )
