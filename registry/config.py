"""The architecture description: one frozen dataclass, filled from the registry's YAML and overrides."""

from __future__ import annotations

import dataclasses
import difflib
import math
import typing
from dataclasses import dataclass, field

from ..layers.semantics import get_semantics

__all__ = ["SwinConfig", "describe_window", "window_size_field"]


@dataclass(frozen=True)
class SwinConfig:
    """Everything that decides a Swin Transformer's shape and behaviour.

    Attributes:
        name: registered name (``swin_t``), informative only.
        embed_dim: channels C of stage 1; stage i has C * 2**i.
        depths: blocks per stage.
        num_heads: attention heads per stage.
        window_size: window M in tokens (7 at 224, 12 at 384 for the official models), or (height, width) for
            a rectangular window as timm takes it, or one of those per stage (timm's per-stage windows, kept
            as one (height, width) pair per stage); an equal pair is kept as one int, equal stages as one window.
        img_size: the input size the model is built for, (H, W) or one int. Classification models shrink a
            stage's window to its map when the map is not larger (official rule); any input size still runs.
        patch_size: side of the patch embedding's conv kernel and stride.
        in_chans: input channels.
        mlp_ratio: MLP hidden width over the block's width.
        qkv_bias: learn a bias in the q/k/v projections.
        num_classes: classifier outputs; 0 removes the head (the model then returns pooled features).
        drop_rate: dropout before the classifier head, as timm's ``drop_rate`` (its train.py ``--drop``).
        proj_drop_rate: dropout after each block's attention projection and both MLP layers (timm's
            ``proj_drop_rate``).
        pos_drop_rate: dropout after the patch embedding (and the absolute position embedding), as timm names
            it for its ViTs (timm's Swin has none). The official code's one ``DROP_RATE`` is ``pos_drop_rate`` and
            ``proj_drop_rate`` both at that value, with ``drop_rate`` 0: its head has no dropout.
        attn_drop_rate: dropout on attention probabilities.
        drop_path_rate: stochastic depth, rising linearly to this value over all blocks.
        ape: learn an absolute position embedding (no official checkpoint uses one).
        patch_norm: LayerNorm after the patch embedding.
        version: 1 (Swin) or 2 (Swin V2: scaled cosine attention, log-spaced continuous position bias,
            residual post-norm, patch merging that norms after the reduction).
        pretrained_window_sizes: Swin V2 only: per stage, the window the weights were trained at, which keeps
            the position bias coordinates of the pre-training (0: the stage's own window).
    """

    name: str = "swin"
    embed_dim: int = 96
    depths: tuple[int, ...] = (2, 2, 6, 2)
    num_heads: tuple[int, ...] = (3, 6, 12, 24)
    window_size: int | tuple[int, int] | tuple[tuple[int, int], ...] = 7
    img_size: tuple[int, int] = (224, 224)
    patch_size: int = 4
    in_chans: int = 3
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    num_classes: int = 1000
    drop_rate: float = 0.0
    proj_drop_rate: float = 0.0
    pos_drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.1
    ape: bool = False
    patch_norm: bool = True
    version: int = 1
    pretrained_window_sizes: tuple[int, ...] = (0, 0, 0, 0)
    aliases: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            object.__setattr__(self, f.name, _coerce(f.name, value, _hint(f.name)))
        for what, spelling in (("name", self.name), *(("alias", alias) for alias in self.aliases)):
            if not spelling or "." in spelling:
                raise ValueError(
                    f"{what} {spelling!r} must be non-empty and without '.' (NAME.TAG names a pretrained tag), "
                    "e.g. my_swin"
                )
        if not self.depths or any(depth < 1 for depth in self.depths):
            raise ValueError(f"depths must give each stage at least one block, e.g. (2, 2, 6, 2), got {self.depths}")
        if len(self.depths) != len(self.num_heads):
            raise ValueError(f"depths {self.depths} and num_heads {self.num_heads} must have one entry per stage")
        if any(heads < 1 for heads in self.num_heads):
            raise ValueError(f"num_heads must be positive in every stage, got {self.num_heads}")
        if len(self.img_size) != 2 or any(side < 1 for side in self.img_size):
            raise ValueError(f"img_size must be (height, width) in pixels, both positive, got {self.img_size}")
        if not 0 < self.mlp_ratio < math.inf:
            raise ValueError(
                f"mlp_ratio must be positive and finite (the MLP's hidden width over its input's), got {self.mlp_ratio}"
            )
        for name in ("drop_rate", "proj_drop_rate", "pos_drop_rate", "attn_drop_rate", "drop_path_rate"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name} is a probability in [0, 1), got {getattr(self, name)}")
        for i, heads in enumerate(self.num_heads):
            if (self.embed_dim * 2**i) % heads:
                raise ValueError(f"stage {i} has {self.embed_dim * 2**i} channels, not divisible by num_heads={heads}")
        for name in ("embed_dim", "patch_size", "in_chans"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if any(side < self.patch_size for side in self.img_size):
            raise ValueError(
                f"img_size {self.img_size} is smaller than one {self.patch_size}x{self.patch_size} patch: the model "
                f"would be built for an empty patch grid; pass at least {self.patch_size} on each side"
            )
        if self.version not in (1, 2):
            raise ValueError(f"version must be 1 (Swin) or 2 (Swin V2), got {self.version}")
        if any(size < 0 for size in self.pretrained_window_sizes):
            raise ValueError(f"pretrained_window_sizes must be >= 0 (0: none), got {self.pretrained_window_sizes}")
        if any(self.pretrained_window_sizes):
            if self.version != 2:
                raise ValueError(
                    f"pretrained_window_sizes {self.pretrained_window_sizes} apply to Swin V2 only; set version=2 "
                    "or leave them at 0"
                )
            if len(self.pretrained_window_sizes) != len(self.depths):
                raise ValueError(
                    f"pretrained_window_sizes {self.pretrained_window_sizes} needs one entry per stage "
                    f"({len(self.depths)})"
                )
        if self.num_classes < 0:
            raise ValueError(f"num_classes must be >= 0 (0 removes the head), got {self.num_classes}")
        if _per_stage(self.window_size) and len(self.window_size) != len(self.depths):
            raise ValueError(
                f"window_size gives {len(self.window_size)} per-stage windows {list(self.window_size)} for "
                f"{len(self.depths)} stages: give one per stage, or one window for all"
            )
        if _per_stage(self.window_size) and len(set(self.window_size)) == 1:  # one spelling for one window
            object.__setattr__(self, "window_size", window_size_field(self.window_size[0]))

    def replace(self, **overrides: typing.Any) -> SwinConfig:
        """A copy with fields overridden; unknown names and wrong types raise ``TypeError``."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            fields = sorted(known - {"aliases"})
            guesses = {
                name: _OTHER_LIBRARIES.get(name)
                or ", ".join(difflib.get_close_matches(name, [*fields, *_BACKBONE_OPTIONS, *_FACTORY_OPTIONS], 1))
                for name in unknown
                if name not in _BACKBONE_OPTIONS
            }
            hints = [f"{name}: {guess}?" for name, guess in guesses.items() if guess]
            message = f"unknown config field(s) {unknown}" + (f" (did you mean {'; '.join(hints)})" if hints else "")
            message += f"; valid fields are {fields}"
            backbone = [name for name in unknown if name in _BACKBONE_OPTIONS]
            if backbone:
                message += (
                    f"; {backbone} are options of the features_only backbone, not config fields: "
                    f"create_model(name, features_only=True, {backbone[0]}=...)"
                )
            else:
                message += f", and with features_only=True the backbone's options {list(_BACKBONE_OPTIONS)}"
            raise TypeError(message)
        return dataclasses.replace(self, **overrides)

    def stage_sizes(self, height: int | None = None, width: int | None = None) -> list[tuple[int, int]]:
        """Map size of each stage for a (height, width) input (default ``img_size``): ceil(H/patch), then
        ceil(previous/2) per patch merging."""
        height, width = self.img_size if height is None else (height, width)
        sizes = [(-(-height // self.patch_size), -(-width // self.patch_size))]
        for _ in range(len(self.depths) - 1):
            h, w = sizes[-1]
            sizes.append((-(-h // 2), -(-w // 2)))
        return sizes

    def stage_windows(self, semantics: str = "classification") -> list[tuple[int, int]]:
        """The (wh, ww) window of each stage: ``window_size``, or under classification semantics the map at
        ``img_size`` when it is not larger (official rule, see :mod:`swin.layers.semantics`)."""
        rules = get_semantics(semantics)
        # one axis at a time: the rule takes one window side, and each axis shrinks to its own map side
        return [
            (rules.stage_window(h, w, wh)[0], rules.stage_window(h, w, ww)[1])
            for (h, w), (wh, ww) in zip(self.stage_sizes(), self.stage_window_sizes, strict=True)
        ]

    @property
    def stage_window_sizes(self) -> list[tuple[int, int]]:
        """The configured (height, width) window of each stage, before any stage shrinks it to its map."""
        size = self.window_size
        if _per_stage(size):
            return list(size)
        return [(size, size) if isinstance(size, int) else size] * len(self.depths)

    @property
    def window(self) -> tuple[int, int]:
        """``window_size`` as (height, width); a ``ValueError`` when the stages have windows of their own
        (:attr:`stage_window_sizes` gives those)."""
        size = self.window_size
        if _per_stage(size):
            raise ValueError(
                f"{self.name} has a window per stage, {describe_window(size)}: there is no one window; read "
                "stage_window_sizes"
            )
        return (size, size) if isinstance(size, int) else size

    def to_dict(self) -> dict[str, typing.Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


# SwinBackbone's own arguments, which create_model(features_only=True) routes to it rather than to the config.
_BACKBONE_OPTIONS = ("frozen_stages", "norm_eval", "out_indices")
# create_model's own options, which a misspelt name may have meant.
_FACTORY_OPTIONS = (
    "global_pool",
    "semantics",
    "features_only",
    "pretrained",
    "checkpoint_path",
    "pretrained_cfg_overlay",
)
# Other libraries' names for what a field or a backbone option does here.
_OTHER_LIBRARIES = {
    "trainable_layers": "frozen_stages (torchvision's trainable_layers=k trains the last k of its 5 parts; "
    "frozen_stages=n freezes the patch embedding and stages 0..n-1)",
    "trainable_backbone_layers": "frozen_stages (see trainable_layers)",
    "drop_path": "drop_path_rate",
    "stochastic_depth_prob": "drop_path_rate (torchvision's name)",
    "patch_norm_layer": "patch_norm",
}


def _hint(name: str) -> typing.Any:
    return typing.get_type_hints(SwinConfig)[name]


def _coerce(name: str, value: typing.Any, hint: typing.Any) -> typing.Any:
    """Check ``value`` against the field's type; accept lists for tuples and one int for a size pair."""
    if name == "window_size":
        return window_size_field(value)
    origin = typing.get_origin(hint)
    if origin is tuple:
        args = typing.get_args(hint)
        if name == "img_size" and isinstance(value, int) and not isinstance(value, bool):
            value = (value, value)
        if not isinstance(value, (list, tuple)):
            kind = "names" if typing.get_args(hint)[0] is str else "ints"
            raise TypeError(f"config field {name!r} expects a list of {kind}, got {type(value).__name__} {value!r}")
        if args[-1] is not Ellipsis and len(value) != len(args):
            raise TypeError(f"config field {name!r} expects {len(args)} values, got {len(value)}: {value!r}")
        item = args[0]
        for v in value:
            if not isinstance(v, item) or isinstance(v, bool):
                raise TypeError(f"config field {name!r} expects {item.__name__} items, got {v!r}")
        return tuple(value)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is int and isinstance(value, bool):
        raise TypeError(f"config field {name!r} expects int, got bool {value!r}")
    if not isinstance(value, hint):
        raise TypeError(f"config field {name!r} expects {hint.__name__}, got {type(value).__name__} {value!r}")
    return value


def _per_stage(size: typing.Any) -> bool:
    """Whether a ``window_size`` field value holds one window per stage (pairs nested in a tuple)."""
    return isinstance(size, tuple) and isinstance(size[0], tuple)


def _is_int(value: typing.Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _one_window(value: typing.Any, given: typing.Any) -> tuple[int, int]:
    pair = tuple(value) if isinstance(value, (list, tuple)) else (value, value)
    if len(pair) != 2 or not all(_is_int(v) for v in pair):
        raise TypeError(
            f"config field 'window_size' expects an int, a (height, width) pair of ints, or one of those per "
            f"stage, got {type(given).__name__} {given!r}"
        )
    if any(v < 1 for v in pair):
        raise ValueError(f"window_size must be a positive integer (or pairs of them), got {given!r}")
    return pair


def window_size_field(value: typing.Any) -> int | tuple[int, int] | tuple[tuple[int, int], ...]:
    """``window_size`` as timm takes it: one positive int; a (height, width) pair (an equal pair as its int);
    or one int or pair per stage, as one (height, width) pair per stage (:class:`SwinConfig` checks their count
    and keeps equal ones as one window). As in timm, a sequence of two ints is one (height, width) window: two
    stages' windows nest, ``((7, 7), (5, 5))``."""
    if isinstance(value, (list, tuple)) and not (len(value) == 2 and all(_is_int(v) for v in value)):
        if not value:
            raise TypeError("config field 'window_size' expects an int, a (height, width) pair or one per stage: ()")
        return tuple(_one_window(v, value) for v in value)  # SwinConfig checks the count, then keeps one if equal
    pair = _one_window(value, value)
    return pair[0] if pair[0] == pair[1] else pair


def describe_window(size: int | tuple[int, int] | tuple[tuple[int, int], ...]) -> str:
    """A ``window_size`` field value for messages: ``7``, ``8x6``, ``7, 7, 7, 5x3 per stage``."""
    if _per_stage(size):
        return ", ".join(describe_window(window_size_field(pair)) for pair in size) + " per stage"
    return str(size) if isinstance(size, int) else f"{size[0]}x{size[1]}"
