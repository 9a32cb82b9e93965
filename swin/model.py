"""The Swin Transformer classifier, assembled from ``swin.layers``."""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from .features import FeatureInfo, stage_info, take_indices
from .pooling import check_pool, pool, pooled_features
from .registry import SwinConfig
from .trunk import SwinTrunk

__all__ = ["SwinTransformer"]


class SwinTransformer(SwinTrunk):
    """Swin Transformer (Liu et al., ICCV 2021) with the official checkpoint layout.

    The trunk works on (B, H, W, C) maps; the input is (B, in_chans, H, W) of any size of at least one
    patch. ``forward_features`` returns the normed last stage as (B, 8C, H/32, W/32), ``forward_head`` pools
    and classifies, ``forward`` does both.

    Args:
        config: the architecture (``swin.get_config("swin_t")``); default ``SwinConfig()`` (swin_t's shape).
        semantics: "classification" (official classifier, timm) or "detection" (official detection
            backbone): see :mod:`swin.layers.semantics`.
        global_pool: pooling before the head, timm's names: "avg" (Swin's), "max", "avgmax", "catavgmax", or
            "" (no pooling: ``forward_head`` scores every position, (B, num_classes, h, w)); timm's "fast",
            "fastavg", "fastmax", "fastavgmax" and "fastcatavgmax" compute the same as their plain names.
        **fields: :class:`swin.registry.SwinConfig` fields that override ``config`` (``num_classes=10``,
            ``embed_dim=128``, ...): the config is the one description of the architecture.
    """

    def __init__(
        self,
        config: SwinConfig | None = None,
        *,
        semantics: str = "classification",
        global_pool: str = "avg",
        **fields: Any,
    ):
        config = (config or SwinConfig()).replace(**fields)
        super().__init__(config, semantics)
        self.num_classes = config.num_classes
        self.global_pool = check_pool(global_pool)
        self.norm = nn.LayerNorm(self.num_features)
        self.head_drop = nn.Dropout(config.drop_rate)
        self.head = self._new_head(config.num_classes)
        self.feature_info = FeatureInfo(
            stage_info(config.embed_dim, config.patch_size, len(config.depths)), range(len(config.depths))
        )
        self.init_weights()

    @classmethod
    def from_config(cls, config: SwinConfig, **kwargs: Any) -> SwinTransformer:
        return cls(config, **kwargs)

    # -- forward ----------------------------------------------------------------------------------------

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, in_chans, H, W) -> (B, 8C, ceil(H/32), ceil(W/32)) after the final norm."""
        return self.forward_stages(x, self._features)

    def _features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for stage in self.layers:
            _, x = stage(x)
        return self.norm(x).permute(0, 3, 1, 2)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """(B, 8C, h, w) -> pooled (B, 8C) if ``pre_logits`` else logits (B, num_classes); with
        ``global_pool=""`` the map is kept: (B, 8C, h, w) or (B, num_classes, h, w)."""
        x = self.head_drop(pool(x, self.global_pool))
        if pre_logits:
            return x
        if self.global_pool == "":  # score every position: the head acts on the channel dimension
            return self.head(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | list[int] | None = None,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """Stage outputs as timm's ``forward_intermediates``: ``indices`` None (all stages), an int n (the last
        n) or stage indices (negative from the end); ``norm`` applies the final norm to the last stage's output;
        ``stop_early`` skips the stages after the last one asked for. Each intermediate is the stage's output
        before patch merging, (B, C_i, h_i, w_i) for "NCHW" or (B, h_i, w_i, C_i) for "NHWC".

        Returns the intermediates if ``intermediates_only``, else ``(final, intermediates)`` where ``final`` is
        what :meth:`forward_features` returns (NCHW, normed) when every stage ran, else the un-normed output
        of the last stage run.
        """
        if output_fmt not in ("NCHW", "NHWC"):
            raise ValueError(f"output_fmt={output_fmt!r}; use 'NCHW' or 'NHWC'")
        chosen = take_indices(len(self.layers), indices)
        last = max(chosen) if stop_early else len(self.layers) - 1
        run = functools.partial(self._intermediates, chosen=chosen, last=last, norm=norm, nhwc=output_fmt == "NHWC")
        final, intermediates = self.forward_stages(x, run)
        return intermediates if intermediates_only else (final, intermediates)

    def _intermediates(self, x: torch.Tensor, *, chosen, last, norm, nhwc) -> tuple[torch.Tensor, list]:
        x = self.embed(x)
        intermediates = []
        final_stage = len(self.layers) - 1
        for i, stage in enumerate(self.layers[: last + 1]):
            features, x = stage(x)
            if i in chosen:
                out = self.norm(features) if norm and i == final_stage else features
                intermediates.append(out.contiguous() if nhwc else out.permute(0, 3, 1, 2).contiguous())
        # The last stage run, before any merging: normed as forward_features when it is the model's last.
        final = self.norm(features) if last == final_stage else features
        return final.permute(0, 3, 1, 2), intermediates

    # -- utilities --------------------------------------------------------------------------------------

    def _new_head(self, num_classes: int) -> nn.Module:
        if num_classes <= 0:
            return nn.Identity()
        head = nn.Linear(pooled_features(self.num_features, self.global_pool), num_classes)
        self._init_module(head)
        return head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """Replace the head with a freshly initialised one of ``num_classes`` outputs (0: no head), on the
        model's device and in its dtype, and the pooling if ``global_pool`` is given (timm's signature)."""
        if global_pool is not None:
            self.global_pool = check_pool(global_pool)
        self.num_classes = num_classes
        self.config = self.config.replace(num_classes=num_classes)
        # on the device and in the dtype of the model (a model already on a GPU or in bf16 stays whole)
        like = next(self.patch_embed.parameters(), None)
        head = self._new_head(num_classes)
        self.head = head if like is None else head.to(device=like.device, dtype=like.dtype)

    def get_classifier(self) -> nn.Module:
        return self.head

    @property
    def head_hidden_size(self) -> int:
        """Width of what the head's linear layer takes (timm's attribute): ``num_features``, doubled by
        "catavgmax" pooling."""
        return pooled_features(self.num_features, self.global_pool)

    def prune_intermediate_layers(
        self, indices: int | list[int] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        """Drop what :meth:`forward_intermediates` for ``indices`` does not need, as timm's method of the name:
        the stages after the last one asked for (and the patch merging that ends it), the final norm if
        ``prune_norm`` or if stages went (it is sized for the last stage), and the head if ``prune_head`` or if
        stages went (``num_classes`` 0, no pooling). Returns the stage indices to pass on."""
        chosen = take_indices(len(self.layers), indices)
        last = max(chosen)
        prune_end = last < len(self.layers) - 1
        if prune_norm or prune_end:
            self.norm = nn.Identity()
        if prune_end:
            self.layers = self.layers[: last + 1]
            self.layers[last].downsample = None  # its output would go to a stage that is gone
            self.num_features = self.feature_info[last]["num_chs"]
            kept = {"depths": self.config.depths[: last + 1], "num_heads": self.config.num_heads[: last + 1]}
            if any(self.config.pretrained_window_sizes):
                kept["pretrained_window_sizes"] = self.config.pretrained_window_sizes[: last + 1]
            kept["window_size"] = self.config.stage_window_sizes[: last + 1]
            self.config = self.config.replace(**kept)
            windows, grid = self._window_reference  # what set_input_size scales from, for the stages kept
            self._window_reference = (windows[: last + 1], grid)
        if prune_head or prune_end:
            self.reset_classifier(0, "")
        return chosen
