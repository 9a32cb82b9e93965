"""What the classifier and the detection backbone share: patch embedding, position embedding, stages."""

from __future__ import annotations

import functools
import math
import os
import re
import sys
import warnings
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.fx._symbolic_trace import is_fx_symbolic_tracing

from .layers.block_v2 import SwinBlockV2
from .layers.execution import image_chunks, run_in_image_chunks
from .layers.linear_kernel import linear_kernels
from .layers.patch_embed import PatchEmbed
from .layers.position_embedding import resized_position_embedding
from .layers.semantics import get_semantics
from .layers.stage import SwinStage
from .layers.variants import VARIANTS
from .registry import SwinConfig

__all__ = ["SwinTrunk"]


class SwinTrunk(nn.Module):
    """Patch embedding, optional absolute position embedding and the stages, in the official key layout.

    The trunk works on (B, H, W, C) maps. Subclasses add what sits on top (a classifier head, or per-level
    norms for a detection neck).

    Args:
        config: the architecture.
        semantics: "classification" or "detection" (see :mod:`swin.layers.semantics`).
        num_stages: build only the first stages (a backbone that outputs fewer levels); the last one built
            has no patch merging.
    """

    # timm's attribute for the layout of forward_features and features: NCHW here, where timm's Swin gives NHWC
    output_fmt = "NCHW"

    def __init__(self, config: SwinConfig, semantics: str = "classification", num_stages: int | None = None):
        super().__init__()
        rules = get_semantics(semantics)
        self.config = config
        self.semantics = rules.name
        self.in_chans = config.in_chans
        depths = config.depths
        num_stages = len(depths) if num_stages is None else num_stages
        self.num_layers = num_stages
        self.num_features = config.embed_dim * 2 ** (len(depths) - 1)

        self.patch_embed = PatchEmbed(config.in_chans, config.embed_dim, config.patch_size, norm=config.patch_norm)
        grid = self.patch_embed.output_size(*config.img_size)
        self.absolute_pos_embed = (
            nn.Parameter(torch.zeros(1, grid[0] * grid[1], config.embed_dim)) if config.ape else None
        )
        self.pos_drop = nn.Dropout(config.pos_drop_rate)

        # Stochastic depth rises linearly over all blocks of the full model, as torch.linspace(0, rate, n).
        total = sum(depths)
        rates = [config.drop_path_rate * i / max(total - 1, 1) for i in range(total)]
        self.layers = nn.ModuleList()
        variant = VARIANTS[config.version]
        windows = config.stage_windows(semantics)
        for i in range(num_stages):
            block = variant.block
            pretrained_window = dict(enumerate(config.pretrained_window_sizes)).get(i, 0)
            if pretrained_window:  # Swin V2 only (the config checks)
                block = functools.partial(block, pretrained_window=(pretrained_window, pretrained_window))
            self.layers.append(
                SwinStage(
                    config.embed_dim * 2**i,
                    depths[i],
                    config.num_heads[i],
                    windows[i],
                    config.mlp_ratio,
                    config.qkv_bias,
                    config.proj_drop_rate,
                    config.attn_drop_rate,
                    rates[sum(depths[:i]) : sum(depths[: i + 1])],
                    semantics=rules.name,
                    block=block,
                    downsample=variant.merging if i < num_stages - 1 else None,
                )
            )
        # What set_input_size(img_size=...) scales the windows from, as timm: the windows last asked for, and the
        # patch grid they were asked for at.
        self._window_reference = (config.stage_window_sizes, _patch_grid(config.img_size, config.patch_size))

    def init_weights(self) -> None:
        """The official initialisation: truncated normal (std 0.02) for linears and embeddings; Swin V2's
        res-post-norms at zero (its ``_init_respostnorm``, as timm), so that each block starts as the identity."""
        self.apply(self._init_module)
        if self.absolute_pos_embed is not None:
            nn.init.trunc_normal_(self.absolute_pos_embed, std=0.02)
        for module in self.modules():
            if isinstance(module, SwinBlockV2):
                for norm in (module.norm1, module.norm2):
                    nn.init.zeros_(norm.weight)
                    nn.init.zeros_(norm.bias)

    def init_non_persistent_buffers(self) -> None:
        """Rebuild the buffers derived from the architecture (position indices and coordinates, never saved),
        as timm's method of the name: after building on the ``meta`` device, ``to_empty()`` and
        ``load_state_dict``, call this before the first forward."""
        for module in self.modules():
            if module is not self and hasattr(module, "init_non_persistent_buffers"):
                module.init_non_persistent_buffers()

    @staticmethod
    def _init_module(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.trunc_normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """``nn.Module.load_state_dict``; a state dict in another layout (timm's, torchvision's, a DDP
        ``module.`` prefix, a whole training checkpoint) fails with torch's message and how to convert it."""
        try:
            return super().load_state_dict(state_dict, strict=strict, assign=assign)
        except RuntimeError as error:
            hint = self._layout_hint(state_dict)
            if hint is None:
                raise
            raise RuntimeError(f"{error}\n\t{hint}") from None

    def _layout_hint(self, state_dict) -> str | None:
        """How to load ``state_dict`` when :func:`swin.weights.convert` makes it fit better, else None."""
        from .weights.convert import convert, detect_layout, unwrap

        try:
            converted = convert(state_dict)
            layout = detect_layout(unwrap(state_dict))
        except Exception:  # not a checkpoint convert reads: torch's message alone
            return None
        own = set(super().state_dict())
        if len(own & set(converted)) <= len(own & set(state_dict)):
            return None
        what = f"{layout}'s layout" if layout != "official" else "a wrapper or under a prefix"
        return (
            f"The state dict is in {what}: load swin.weights.convert(state_dict), which gives this model's layout "
            "(as create_model(..., checkpoint_path=FILE) does; timm's load_checkpoint takes it as "
            "filter_fn=swin.weights.convert)"
        )

    # -- input checks and the embedding edge -----------------------------------------------------------

    def check_input(self, x: torch.Tensor) -> None:
        """Raise ``ValueError`` / ``TypeError`` naming what is wrong with ``x`` before any layer fails."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"expected a torch.Tensor of shape (B, {self.in_chans}, H, W), got {type(x).__name__}")
        if x.ndim != 4:
            hint = "; add a batch dimension with x.unsqueeze(0)" if x.ndim == 3 else ""
            raise ValueError(
                f"expected a 4-D tensor (B, {self.in_chans}, H, W), got {x.ndim}-D shape {tuple(x.shape)}{hint}"
            )
        if x.shape[1] != self.in_chans:
            raise ValueError(
                f"expected {self.in_chans} input channels, got {x.shape[1]} (shape {tuple(x.shape)}); build "
                f"the model with in_chans={x.shape[1]} or convert the images"
            )
        if not x.is_floating_point():
            raise TypeError(f"expected a floating point tensor, got {x.dtype}; convert with x.float()")
        patch = self.patch_embed.patch_size
        if x.shape[2] < patch or x.shape[3] < patch:
            raise ValueError(
                f"image {x.shape[2]}x{x.shape[3]} is smaller than one {patch}x{patch} patch; "
                "resize it to at least the patch size"
            )
        self._warn_of_windows_shrunk_at_build(x.shape[2], x.shape[3])

    def _warn_of_windows_shrunk_at_build(self, height: int, width: int) -> None:
        """Once per model (and config): where the size the model was built for shrank a stage's window to its map
        and this input's map there is larger, the window stays shrunk, where a model built for this size (timm's
        with ``img_size=``, the official code's) has the configured one: other outputs, which are said."""
        if torch.compiler.is_compiling():  # said by the eager call that comes first (and lru_cache is not traced)
            return
        config = self.config
        shrunk = _windows_shrunk_at_build(config, self.semantics)
        if not shrunk or getattr(self, "_warned_of_windows_for", None) is config:
            return
        if not (isinstance(height, int) and isinstance(width, int)):  # symbolic sizes (export): no guards added
            return
        sizes = config.stage_sizes(height, width)
        for i, built, configured in shrunk:
            if i >= self.num_layers:  # a backbone that outputs earlier stages does not build the later ones
                break
            if any(side > b and c > b for side, b, c in zip(sizes[i], built, configured, strict=True)):
                self._warned_of_windows_for = config
                h, w = config.img_size
                warnings.warn(
                    f"{config.name} was built for {h}x{w}, where stage {i + 1}'s window shrank to its "
                    f"{built[0]}x{built[1]} map (configured: {configured[0]}x{configured[1]}); at {height}x{width} "
                    f"it keeps {built[0]}x{built[1]} where a model built for that size (timm's with img_size=, the "
                    f"official code's) has {min(sizes[i][0], configured[0])}x{min(sizes[i][1], configured[1])}, and "
                    f"computes other outputs. Build it for the size: create_model({config.name!r}, "
                    f"img_size=({height}, {width}), pretrained=...) or model.set_input_size(img_size=({height}, "
                    f"{width}), window_size={config.window_size!r})",
                    UserWarning,
                    stacklevel=_caller_stacklevel(),
                )
                return

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """(B, in_chans, H, W) -> (B, H/p, W/p, C): patch embedding plus absolute position embedding."""
        x = self.patch_embed(x)
        if self.absolute_pos_embed is not None:
            x = add_position_embedding(x, self.absolute_pos_embed, self.patch_embed.output_size(*self.config.img_size))
        return self.pos_drop(x)

    def forward_stages(self, x: torch.Tensor, run) -> object:
        """``run(x)`` for a batch of images, run as :func:`swin.layers.execution.image_chunks` decides (in
        pieces of a few images in CPU inference, else at once): the one place where the trunk's forward is
        split, always through the modules' own ``forward``, with float32 linear layers on CPU on the faster
        GEMM library (:func:`swin.layers.linear_kernel.linear_kernels`). Under ``torch.fx.symbolic_trace`` (no sizes,
        dtype or device to check or decide on) ``run(x)`` is recorded as it is."""
        if is_fx_symbolic_tracing():
            return run(x)
        self.check_input(x)
        images = image_chunks(self, x, lambda: self._image_bytes(x))  # decided outside our own modes
        with linear_kernels(x):
            return run_in_image_chunks(run, x, images)

    def _image_bytes(self, x: torch.Tensor) -> int:
        """Bytes of the largest intermediate one image of ``x``'s size makes in the stages."""
        height, width = x.shape[-2:]
        sizes = self.stage_sizes(height, width)
        largest = max(stage.activation_elements(h, w) for (h, w), stage in zip(sizes, self.layers, strict=False))
        return largest * x.element_size()

    def __prepare_scriptable__(self) -> SwinTrunk:
        # torch.jit.script calls this first: say which path is supported instead of failing deep inside.
        raise RuntimeError(
            "TorchScript scripting is not supported for swin models (per-size window plans and caches are "
            "Python). Deploy with torch.export (swin.export.export_program) or ONNX (swin.export.export_onnx, "
            "or `swin export NAME out.onnx`); torch.compile works too."
        )

    # -- what the model describes about itself (timm's attribute names) ---------------------------------

    @property
    def pretrained_cfg(self) -> dict:
        """Preprocessing and origin of the weights, in timm's key names (``input_size``, ``crop_pct``,
        ``interpolation``, ``mean``, ``std``, ``architecture``, ``tag``, ...), so that
        ``timm.data.resolve_model_data_config(model)`` resolves Swin's evaluation transform. Derived on every
        access from the config and the record of what was loaded: never stale."""
        from .weights.data_config import pretrained_cfg

        return pretrained_cfg(self)

    @pretrained_cfg.setter
    def pretrained_cfg(self, values: dict | None) -> None:
        # Your values, kept over the derived ones (the loader records what it loaded elsewhere).
        from .weights.data_config import set_pretrained_cfg

        set_pretrained_cfg(self, values)

    @property
    def default_cfg(self) -> dict:
        """timm's older name for :attr:`pretrained_cfg`."""
        return self.pretrained_cfg

    @property
    def embed_dim(self) -> int:
        """Channels C of the first stage (timm's attribute)."""
        return self.config.embed_dim

    # -- utilities --------------------------------------------------------------------------------------

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block in the backward pass instead of storing its activations."""
        for stage in self.layers:
            stage.grad_checkpointing = enable

    @torch.no_grad()
    def set_input_size(
        self,
        img_size: int | tuple[int, int] | None = None,
        patch_size: int | tuple[int, int] | None = None,
        window_size: int | tuple[int, int] | Sequence[int | tuple[int, int]] | None = None,
        window_ratio: int | Sequence[int] | None = None,
        always_partition: bool | None = None,
    ) -> None:
        """Build the model for another input size and window, in place, as timm's ``set_input_size``: the
        stages' windows (shrunk to their maps at the new size under classification semantics), the bias tables
        resized to them (bicubic, as the official fine-tuning at another window; timm interpolates them its own
        way, so after a window change the two models' tables differ), V2's position
        coordinates, an absolute position embedding, and :attr:`config`. Any input size runs before and after;
        this sets the size the model is built for (what a stage's window shrinks to, and ``pretrained_cfg``).

        Args:
            img_size: the new input size, (H, W) or one side; None keeps the current one.
            patch_size: must be the current one (a new patch size would resample the embedding's kernel).
            window_size: the new window: one int or (height, width) for all stages, or one per stage (a
                sequence of two ints is one (height, width) window, as in timm).
            window_ratio: instead of ``window_size``, the patch grid's side over each stage's window: one int,
                or one per stage.
            always_partition: True is refused (a window larger than its map is not shrunk: another rule).

        Without ``window_size`` and ``window_ratio`` the windows scale with the patch grid from the ones last
        asked for (at construction or by this method), as timm: swin_t at 384 gets 12. The resized tables are new
        parameters: build the optimizer after this call. Resizing a table loses detail, so a round trip (224 ->
        384 -> 224) does not give back the original model (timm's neither): keep a copy to return to. Raises
        ``ValueError`` before anything changes.
        """
        config = self.config
        if patch_size is not None and tuple(_pair(patch_size, "patch_size")) != (config.patch_size,) * 2:
            raise ValueError(
                f"patch_size={patch_size!r}: the patch embedding is built for {config.patch_size}; create the model "
                f"with patch_size={patch_size!r} instead (its kernel is trained for one patch size)"
            )
        if always_partition:
            raise ValueError(
                "always_partition=True (timm's: a window larger than a stage's map is kept and the map padded) is "
                "not a rule these models have: they shrink such a window to the map, as the official "
                "classification code (semantics='detection' keeps windows whole too, but pads before the shift, as "
                "the official detection backbone, so it is not timm's rule either); leave always_partition False"
            )
        size = config.img_size if img_size is None else _pair(img_size, "img_size")
        grid = _patch_grid(size, config.patch_size)
        stages = len(config.depths)
        if window_size is not None:
            windows = config.replace(window_size=window_size).stage_window_sizes
            reference = (windows, grid)
        elif window_ratio is not None:
            ratios = _stage_ratios(window_ratio, stages)
            windows = [(max(1, grid[0] // ratio), max(1, grid[1] // ratio)) for ratio in ratios]
            reference = (windows, grid)
        else:  # keep each stage's window to grid ratio
            reference = self._window_reference
            references, reference_grid = reference
            windows = [
                tuple(max(1, side * g // r) for side, g, r in zip(window, grid, reference_grid, strict=True))
                for window in references
            ]
        new = config.replace(img_size=size, window_size=windows)
        if self.absolute_pos_embed is not None:
            old_grid = self.patch_embed.output_size(*config.img_size)
            embedding = resized_position_embedding(
                self.absolute_pos_embed, old_grid, self.patch_embed.output_size(*size)
            )
            self.absolute_pos_embed = nn.Parameter(
                embedding.flatten(1, 2), requires_grad=self.absolute_pos_embed.requires_grad
            )
        for stage, window in zip(self.layers, new.stage_windows(self.semantics), strict=False):
            stage.set_window(window)
        self.config = new
        self._window_reference = reference

    def no_weight_decay(self) -> set[str]:
        """Parameter names that Swin's recipes train without weight decay whatever their shape:
        ``absolute_pos_embed``, every ``relative_position_bias_table``, Swin-V2's ``logit_scale`` and ``cpb_mlp``
        where a model has them (the official ``no_weight_decay()`` and ``no_weight_decay_keywords()``, as timm's
        Swin names them). 1-D parameters (norms, biases) are left to the optimizer's rule, as there: timm's
        ``filter_bias_and_bn`` and :func:`swin.param_groups` exclude them, ``filter_bias_and_bn=False`` decays
        them."""
        named = ("absolute_pos_embed", "relative_position_bias_table", "logit_scale")
        names = set()
        for name, _ in self.named_parameters():
            parts = name.split(".")
            if parts[-1] in named or "cpb_mlp" in parts:
                names.add(name)
        return names

    def group_matcher(self, coarse: bool = False) -> Callable[[str], tuple[float, ...]]:
        """timm's interface for layer-wise learning-rate decay (``timm.optim.create_optimizer_v2(model,
        layer_decay=...)``): the ordinal of each parameter name, grouped as timm groups its own Swin, whose
        stages start with the patch merging that ours (the official layout) end with: the merging after stage i
        goes with the first block of stage i + 1. A backbone's per-level norm ``norm{i}`` goes with the last block
        of stage i, and the final ``norm`` on top, below the head. ``swin.param_groups`` groups as the official
        fine-tuning code instead (the merging with the last block of its stage)."""

        def ordinal(name: str) -> tuple[float, ...]:
            if name.startswith(("patch_embed.", "absolute_pos_embed")):
                return (0,)
            merging = re.match(r"^layers\.(\d+)\.downsample\.", name)
            block = re.match(r"^layers\.(\d+)\.blocks\.(\d+)\.", name)
            level_norm = re.match(r"^norm(\d+)\.", name)
            if merging:
                return (1, int(merging[1]) + 1) if coarse else (1, int(merging[1]) + 1, 0)
            if block:
                return (1, int(block[1])) if coarse else (1, int(block[1]), int(block[2]))
            if level_norm and int(level_norm[1]) < len(self.layers):  # reads stage i's output: with its last block
                stage = int(level_norm[1])
                return (1, stage) if coarse else (1, stage, self.layers[stage].depth - 1)
            if name.startswith("norm.") and not coarse:
                return (1, 99999)
            return (math.inf,)  # the head (and, coarse, the final norm), as timm leaves them unmatched

        return ordinal

    def stage_sizes(self, height: int, width: int) -> list[tuple[int, int]]:
        """Map size of each stage for a (height, width) input: ceil(H/4), then ceil(previous/2)."""
        return self.config.stage_sizes(height, width)


@torch.fx.wrap  # it decides the resizing on the size: one node under torch.fx.symbolic_trace
def add_position_embedding(x: torch.Tensor, table: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """(B, H, W, C) plus the absolute position embedding ``table`` learnt on a ``grid`` of patches."""
    return x + resized_position_embedding(table, grid, (x.shape[1], x.shape[2]))


def _caller_stacklevel() -> int:
    """The ``stacklevel`` that points a warning raised in the caller of this function at the first frame outside
    this package and torch (the user's line that called the model), however deep the forward path."""
    modules = [module for name, module in list(sys.modules.items()) if name == "swin" or name.startswith("swin.")]
    folders = {
        os.path.dirname(os.path.abspath(module.__file__)) for module in modules if getattr(module, "__file__", None)
    }
    inside = tuple(folder + os.sep for folder in {*folders, os.path.dirname(torch.__file__)})
    frame, level = sys._getframe(2), 2
    while frame.f_back is not None and frame.f_code.co_filename.startswith(inside):
        frame, level = frame.f_back, level + 1
    return level


@functools.lru_cache(maxsize=64)
def _windows_shrunk_at_build(config: SwinConfig, semantics: str) -> tuple[tuple[int, tuple, tuple], ...]:
    """(stage, window as built, window configured) of each stage whose window the built size shrank."""
    built = config.stage_windows(semantics)
    return tuple(
        (i, b, c) for i, (b, c) in enumerate(zip(built, config.stage_window_sizes, strict=True)) if tuple(b) != tuple(c)
    )


def _patch_grid(img_size: tuple[int, int], patch_size: int) -> tuple[int, int]:
    """The patch grid timm scales windows by: whole patches of the input size."""
    return img_size[0] // patch_size, img_size[1] // patch_size


def _pair(value: int | Sequence[int], name: str) -> tuple[int, int]:
    if isinstance(value, int) and not isinstance(value, bool):
        pair = (value, value)
    else:
        pair = tuple(value) if isinstance(value, Sequence) and not isinstance(value, str) else ()
    if len(pair) != 2 or any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in pair):
        raise ValueError(f"{name} must be a positive int or a (height, width) pair of them, got {value!r}")
    return pair


def _stage_ratios(ratio: int | Sequence[int], stages: int) -> list[int]:
    """``window_ratio`` per stage (one int for all; unlike a window, two values are two stages, as in timm)."""
    if isinstance(ratio, int) and not isinstance(ratio, bool):
        ratios = [ratio] * stages
    else:
        ratios = list(ratio) if isinstance(ratio, Sequence) and not isinstance(ratio, str) else []
    if len(ratios) != stages or any(not isinstance(r, int) or isinstance(r, bool) or r < 1 for r in ratios):
        raise ValueError(f"window_ratio must be a positive int or one per stage ({stages}), got {ratio!r}")
    return ratios
