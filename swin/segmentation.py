"""Swin inside the segmentation heads users run: transformers' ``UperNetForSemanticSegmentation`` on our backbone.

transformers builds UperNet's backbone from ``config.backbone_config`` and then only asks it for
``channels`` (when building the head) and ``forward_with_filtered_kwargs(pixel_values, ...).feature_maps``.
:class:`TransformersBackbone` answers both for a :class:`~swin.SwinBackbone`, so the model stays transformers'
own class (its forward, loss and auxiliary head, for code written for UperNet) while the backbone is ours:
any input size, every registered Swin V1/V2, our pretrained weights and layouts, frozen stages.

With detection semantics (the default) the backbone computes what transformers' ``SwinBackbone`` computes (pad
each map to a window multiple, then roll; the window never shrinks; odd blocks always shift; per-stage
LayerNorms), so a checkpoint of transformers' Swin UperNet gives the same logits here after
:func:`convert_upernet` (see :func:`from_transformers`).

transformers is imported inside the functions: ``import swin`` stays quick.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import os
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .backbone import SwinBackbone
from .registry import SwinConfig, describe_window
from .weights.adapt import unbuilt

if TYPE_CHECKING:
    from transformers import PretrainedConfig, UperNetForSemanticSegmentation

__all__ = ["TransformersBackbone", "convert_upernet", "from_transformers", "upernet"]


def _transformers():
    """transformers (UperNet's head and its configs), imported on first use, with what to install without it."""
    try:
        import transformers
    except ImportError:
        raise ImportError(
            "swin.segmentation builds transformers' UperNet: pip install transformers (or, in a checkout, "
            'pip install -e ".[segmentation]")'
        ) from None
    return transformers


# Where the backbone sits in our UperNet's state dict: ``model.backbone.body`` (as ``SwinFPN.body``).
_OURS = "backbone.body."
# transformers' SwinModel keeps the classifier's final LayerNorm even inside SwinBackbone, which never uses it
# (``swin.layernorm``, "norm" once converted); our backbone has no such norm.
_UNUSED = ("norm.weight", "norm.bias")
# The UperNetConfig attribute (written to config.json by save_pretrained) that holds our backbone's whole
# description, which transformers' SwinConfig cannot carry (V2, patch_norm, semantics, ...).
_SAVED = "swin_backbone"
# The stage mmsegmentation's Swin UperNet puts the auxiliary FCN head on (the third).
_AUXILIARY_STAGE = 2


class TransformersBackbone(nn.Module):
    """A :class:`~swin.SwinBackbone` behind the interface transformers' heads call on ``model.backbone``.

    ``forward_with_filtered_kwargs(pixel_values, ...)`` (and ``forward``) return a ``BackboneOutput`` whose
    ``feature_maps`` are the backbone's levels; ``channels``, ``out_features``, ``out_indices`` and
    ``stage_names`` use transformers' names (``stem``, ``stage1``..``stage4``; an index counts the stem).
    ``hidden_states``, when asked for, are the same levels (transformers' Swin gives the stem and the stage
    outputs before their norms instead); attention maps are not available.
    """

    def __init__(self, body: SwinBackbone):
        super().__init__()
        if not isinstance(body, SwinBackbone):
            raise TypeError(
                f"expected a swin.SwinBackbone, got {type(body).__name__}; build one with "
                "swin.create_model(name, features_only=True)"
            )
        self.body = body
        self.stage_names = ["stem"] + [f"stage{i + 1}" for i in range(len(body.config.depths))]
        self.out_indices = [i + 1 for i in body.out_indices]
        self.out_features = [self.stage_names[i] for i in self.out_indices]
        self.num_features = [body.config.embed_dim] + [info["num_chs"] for info in body.feature_info]

    @property
    def channels(self) -> list[int]:
        return list(self.body.out_channels)

    @property
    def out_feature_channels(self) -> dict[str, int]:
        return dict(zip(self.stage_names, self.num_features, strict=True))

    def forward(
        self,
        pixel_values: torch.Tensor,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
    ) -> Any:
        from transformers.modeling_outputs import BackboneOutput

        if output_attentions:
            raise ValueError(
                "output_attentions=True: this Swin backbone does not return attention maps (its windowed "
                "attention runs fused); call the model with output_attentions=False"
            )
        levels = tuple(self.body(pixel_values))
        output = BackboneOutput(feature_maps=levels, hidden_states=levels if output_hidden_states else None)
        return output.to_tuple() if return_dict is False else output

    def forward_with_filtered_kwargs(self, *args: Any, **kwargs: Any) -> Any:
        """What UperNet calls (transformers' ``BackboneMixin`` name)."""
        return self(*args, **kwargs)


def _transformers_config(body: SwinBackbone, out_features: list[str]) -> PretrainedConfig:
    """transformers' description (``SwinConfig`` / ``Swinv2Config``) of our backbone's architecture, kept as
    ``model.config.backbone_config`` so that the config says what the model is."""
    transformers = _transformers()

    c = body.config
    if not isinstance(c.window_size, int):  # transformers' configs hold one window side (an int)
        raise ValueError(
            f"upernet describes its backbone with transformers' Swin config, which takes one window side; this "
            f"backbone's window is {describe_window(c.window_size)}: build it with one square window_size"
        )
    fields = {
        "image_size": list(c.img_size),
        "patch_size": c.patch_size,
        "num_channels": c.in_chans,
        "embed_dim": c.embed_dim,
        "depths": list(c.depths),
        "num_heads": list(c.num_heads),
        "window_size": c.window_size,
        "mlp_ratio": c.mlp_ratio,
        "qkv_bias": c.qkv_bias,
        "hidden_dropout_prob": c.proj_drop_rate,  # transformers: after the embeddings and the MLP
        "attention_probs_dropout_prob": c.attn_drop_rate,
        "drop_path_rate": c.drop_path_rate,
        "use_absolute_embeddings": c.ape,
        "out_features": out_features,
    }
    if c.version == 2:
        return transformers.Swinv2Config(**fields, pretrained_window_sizes=list(c.pretrained_window_sizes))
    return transformers.SwinConfig(**fields)


def _assemble(
    body: SwinBackbone, config: Any, checkpoint: Mapping | str | os.PathLike | None, auxiliary_index: int = 2
):
    """UperNet for ``config`` (a ``UperNetConfig``) with ``body`` as its backbone, optionally loaded; the
    auxiliary head reads feature map ``auxiliary_index`` (transformers' head always reads 2)."""
    transformers = _transformers()

    backbone = TransformersBackbone(body)
    described = config.backbone_config
    if list(getattr(described, "out_features", None) or []) != backbone.out_features:
        raise ValueError(f"backbone_config.out_features must be {backbone.out_features}, got {described!r}")
    # UperNet's constructor builds a backbone from the config only to read its channels: hand it a Swin of
    # the same widths without blocks (milliseconds), then put ours in its place.
    placeholder = copy.deepcopy(config)
    placeholder.backbone_config = transformers.SwinConfig(
        embed_dim=body.config.embed_dim,
        depths=[0] * len(body.config.depths),
        num_heads=[1] * len(body.config.depths),
        out_features=backbone.out_features,
    )
    model = transformers.UperNetForSemanticSegmentation(placeholder)
    if model.auxiliary_head is not None:
        model.auxiliary_head.in_index = auxiliary_index
    model.config.backbone_config = described
    model.backbone = backbone
    if checkpoint is not None:
        _load(model, checkpoint)
    return model.train(body.training)


def _load(model: nn.Module, checkpoint: Mapping | str | os.PathLike) -> None:
    """Load a whole UperNet's weights (transformers' keys or ours) strictly, or say what does not fit; a
    training checkpoint's EMA weights first (``state_dict_ema``, ``state_dict``, ``model``, ``module.``, as
    ``create_model``'s ``checkpoint_path=`` reads them)."""
    from .weights import load_file, unwrap

    if isinstance(checkpoint, (str, os.PathLike)):
        checkpoint = load_file(checkpoint)
    state = convert_upernet(unwrap(checkpoint, whole_model=True))
    own = model.state_dict()
    # stages after the last one the backbone outputs are not built (out_features ending early): theirs go
    body = "backbone.body."
    own_body = {k[len(body) :]: v for k, v in own.items() if k.startswith(body)}
    unused = [k for k in state if k.startswith(body) and k not in own and unbuilt(k[len(body) :], own_body)]
    if unused:
        warnings.warn(
            f"loading the UperNet checkpoint: dropped {len(unused)} key(s) of backbone stages this model does not "
            f"build (its out_features end earlier), e.g. {unused[0]}",
            UserWarning,
            stacklevel=3,
        )
        state = {k: v for k, v in state.items() if k not in unused}
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    mismatched = [
        f"{k} {tuple(state[k].shape)} vs {tuple(v.shape)}"
        for k, v in own.items()
        if k in state and state[k].shape != v.shape
    ]
    if missing or unexpected or mismatched:
        raise ValueError(
            f"the checkpoint does not fit this UperNet: {len(missing)} missing key(s) {missing[:3]}, "
            f"{len(unexpected)} unexpected {unexpected[:3]}, {len(mismatched)} of another shape (checkpoint vs "
            f"model) {mismatched[:3]}; build the model with the checkpoint's backbone and head sizes "
            "(hidden_size, auxiliary_channels, num_labels, ...), or use from_transformers() with its config"
        )
    model.load_state_dict(state)


def convert_upernet(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state dict of transformers' Swin-backed ``UperNetForSemanticSegmentation`` in our UperNet's keys.

    The backbone's keys (``backbone.swin.*``, ``backbone.hidden_states_norms.stageN.*``, 4.x and 5.x names)
    go through ``swin.weights.convert(..., source="transformers")`` to ``backbone.body.*``; the unused
    ``backbone.swin.layernorm`` is dropped; the heads' keys (``decode_head.*``, ``auxiliary_head.*``) are
    kept. A state dict already in our keys passes through unchanged.
    """
    from .weights import convert

    if not isinstance(state_dict, Mapping):
        raise TypeError(f"expected a state dict (a mapping of names to tensors), got {type(state_dict).__name__}")
    theirs = {
        k.removeprefix("backbone."): v
        for k, v in state_dict.items()
        if k.startswith("backbone.") and not k.startswith(_OURS)
    }
    out = {k: v for k, v in state_dict.items() if not (k.startswith("backbone.") and not k.startswith(_OURS))}
    if theirs:
        converted = convert(theirs, source="transformers")
        out.update({_OURS + k: v for k, v in converted.items() if k not in _UNUSED})
    return out


def upernet(
    model: str | SwinBackbone = "swin_t",
    num_labels: int | None = None,
    *,
    pretrained: Any = False,
    checkpoint: Mapping | str | os.PathLike | None = None,
    out_indices: Sequence[int] | int = (0, 1, 2, 3),
    hidden_size: int = 512,
    use_auxiliary_head: bool = True,
    id2label: Mapping[int, str] | None = None,
    **kwargs: Any,
) -> UperNetForSemanticSegmentation:
    """transformers' ``UperNetForSemanticSegmentation`` with a Swin backbone of this package.

    >>> from swin.segmentation import upernet
    >>> model = upernet("swin_t", num_labels=150, pretrained="ms_in1k", drop_path_rate=0.3)
    >>> out = model(pixel_values, labels=label_maps)  # out.loss (with the auxiliary head's), out.logits
    >>> out.logits.shape  # (B, 150, H, W) at the input's size, any H and W

    The model is transformers' class, with its forward, loss (``loss_ignore_index``, auxiliary loss) and
    outputs; ``save_pretrained`` writes a directory that :func:`from_transformers` reloads.
    ``model.backbone.body`` is the :class:`~swin.SwinBackbone` (``frozen_stages=``, ``set_grad_checkpointing()``,
    ``swin.param_groups``).

    Args:
        model: a registered name (``swin_t``, ``swin_b_384``, timm's names, ``NAME.TAG``) or a
            :class:`~swin.SwinBackbone` already built.
        num_labels: classes of the segmentation (or give ``id2label``).
        pretrained: backbone weights, as ``swin.create_model(pretrained=...)`` (a tag, path, URL or state dict).
        checkpoint: a whole UperNet's state dict (or a file of one), in transformers' keys (``backbone.swin.*``,
            as a Swin UperNet of the Hugging Face hub) or ours (``backbone.body.*``), or a training checkpoint
            holding one (its EMA weights first, as ``create_model``'s ``checkpoint_path=``); loaded strictly.
        out_indices: the backbone stages the head reads (0..3).
        hidden_size: the head's width (UperNet's ``channels``: 512 in mmsegmentation's Swin configs).
        use_auxiliary_head: add the FCN head on stage 3 (index 2, which ``out_indices`` must then include)
            whose loss is weighted by ``auxiliary_loss_weight``.
        id2label: class names by index (sets ``num_labels``).
        **kwargs: other ``UperNetConfig`` fields (``pool_scales``, ``auxiliary_channels``,
            ``auxiliary_loss_weight``, ``loss_ignore_index``, ``label2id``, ...); every other name goes to
            ``swin.create_model`` (``drop_path_rate``, ``frozen_stages``, ``img_size``, ``semantics``, ...).

    Raises:
        ValueError: neither ``num_labels`` nor ``id2label`` given, or they disagree; the auxiliary head without
            stage 2 among ``out_indices``; a checkpoint that does not fit.
        TypeError: create_model arguments together with a backbone already built.
    """
    transformers = _transformers()

    head = {k: kwargs.pop(k) for k in list(kwargs) if k in _head_fields(transformers.UperNetConfig)}
    if id2label is not None:
        id2label = {int(k): v for k, v in id2label.items()}
        if num_labels is not None and num_labels != len(id2label):
            raise ValueError(f"num_labels={num_labels} but id2label names {len(id2label)} classes; give one of them")
        head["id2label"] = id2label
    elif num_labels is not None:
        head["num_labels"] = num_labels
    else:
        raise ValueError("give num_labels (the number of classes) or id2label (their names by index)")
    if isinstance(model, SwinBackbone):
        given = sorted(kwargs) + ["pretrained"] * (pretrained is not False)
        given += ["out_indices"] * (isinstance(out_indices, int) or tuple(out_indices) != (0, 1, 2, 3))
        if given:
            raise TypeError(
                f"upernet() got a SwinBackbone already built and backbone arguments {given}; pass them to "
                "swin.create_model(..., features_only=True) instead, or pass the model's name"
            )
        body = model
    else:
        from .factory import create_model

        body = create_model(model, pretrained=pretrained, features_only=True, out_indices=out_indices, **kwargs)
    auxiliary_index = _auxiliary_index(body) if use_auxiliary_head else 2
    if use_auxiliary_head:
        # transformers 4.x defaults this to 384 and 5.x to the channels of map 2: give both the same head.
        head.setdefault("auxiliary_in_channels", body.out_channels[auxiliary_index])
    described = _transformers_config(body, TransformersBackbone(body).out_features)
    config = transformers.UperNetConfig(
        backbone_config=described, hidden_size=hidden_size, use_auxiliary_head=use_auxiliary_head, **head
    )
    setattr(config, _SAVED, _describe(body))
    return _assemble(body, config, checkpoint, auxiliary_index)


def _auxiliary_index(body: SwinBackbone) -> int:
    """Where stage 2 is among the backbone's outputs (the feature map the auxiliary head reads)."""
    if _AUXILIARY_STAGE not in body.out_indices:
        raise ValueError(
            f"the auxiliary head reads stage {_AUXILIARY_STAGE}, but out_indices={list(body.out_indices)} leaves it "
            f"out; include {_AUXILIARY_STAGE} in out_indices or pass use_auxiliary_head=False"
        )
    return body.out_indices.index(_AUXILIARY_STAGE)


def _describe(body: SwinBackbone) -> dict[str, Any]:
    """Everything that rebuilds ``body`` (:func:`_rebuild`), as JSON types."""
    fields = {k: list(v) if isinstance(v, tuple) else v for k, v in body.config.to_dict().items() if k != "aliases"}
    options = {"frozen_stages": body.frozen_stages, "norm_eval": body.norm_eval, "semantics": body.semantics}
    return {**fields, **options, "out_indices": list(body.out_indices)}


def _rebuild(described: Mapping[str, Any]) -> SwinBackbone:
    """The backbone :func:`_describe` described (random weights)."""
    fields = dict(described)
    options = {k: fields.pop(k) for k in ("out_indices", "frozen_stages", "norm_eval", "semantics")}
    return SwinBackbone(SwinConfig(**fields), **options)


def _head_fields(config_class: type) -> set[str]:
    """``UperNetConfig``'s own fields (a dataclass in transformers 5, ``__init__`` arguments in 4.x), less the
    backbone's, plus ``label2id``."""
    if dataclasses.is_dataclass(config_class):
        fields = [field.name for field in dataclasses.fields(config_class)]
    else:
        fields = list(inspect.signature(config_class.__init__).parameters)
    backbone = {"backbone_config", "backbone", "backbone_kwargs", "use_pretrained_backbone", "use_timm_backbone"}
    return (set(fields) | {"label2id"}) - backbone - {"self", "kwargs"}


def from_transformers(
    reference: Any, state_dict: Mapping[str, torch.Tensor] | None = None
) -> UperNetForSemanticSegmentation:
    """Our UperNet carrying a transformers Swin UperNet's architecture, config and weights.

    >>> reference = UperNetForSemanticSegmentation.from_pretrained("openmmlab/upernet-swin-tiny")
    >>> model = from_transformers(reference)  # same logits; any input size; ours to fine-tune, export

    Args:
        reference: a ``UperNetForSemanticSegmentation`` whose ``backbone_config`` is a ``SwinConfig``, its
            ``UperNetConfig``, a ``save_pretrained`` directory (transformers' model's or one of ours: this is
            how ours reload, any backbone :func:`upernet` built, from the config's ``swin_backbone``; transformers'
            own ``from_pretrained`` cannot rebuild our backbone from such a directory), or a hub id (read by
            ``UperNetForSemanticSegmentation.from_pretrained``).
        state_dict: with a config, the weights to load (transformers' keys or ours); a model brings its own.

    Raises:
        ValueError: a model transformers made whose backbone is not a Swin V1 (``model_type`` "swin") with
            GELU and LayerNorm eps 1e-5 and no absolute position embedding, which is what this conversion
            reproduces exactly.
    """
    transformers = _transformers()

    if isinstance(reference, (str, os.PathLike)) and os.path.isdir(reference):
        if state_dict is not None:
            raise TypeError("from_transformers() got a directory and a state_dict; the directory brings its weights")
        reference, state_dict = transformers.UperNetConfig.from_pretrained(reference), _weights_in(reference)
    elif isinstance(reference, (str, os.PathLike)):
        name = os.fspath(reference)
        if isinstance(reference, os.PathLike) or name.count("/") > 1 or name.startswith(("/", ".", "~")):
            raise FileNotFoundError(f"from_transformers({name!r}): no such folder (a hub id is OWNER/NAME)")
        reference = transformers.UperNetForSemanticSegmentation.from_pretrained(reference)
    if isinstance(reference, nn.Module):
        if state_dict is not None:
            raise TypeError("from_transformers() got a model and a state_dict; the model brings its own weights")
        state_dict, config, training = reference.state_dict(), reference.config, reference.training
    else:
        config, training = reference, False
    if not isinstance(config, transformers.UperNetConfig):
        raise TypeError(f"expected a UperNetForSemanticSegmentation or UperNetConfig, got {type(config).__name__}")
    ours = getattr(config, _SAVED, None)
    if ours:
        body = _rebuild(ours)
        auxiliary_index = _auxiliary_index(body) if config.use_auxiliary_head else 2
    else:
        body, auxiliary_index = _backbone_from(config.backbone_config), 2
    model = _assemble(body, copy.deepcopy(config), state_dict, auxiliary_index)
    return model.train(training)


def _weights_in(directory: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The state dict a ``save_pretrained`` directory holds (one file, safetensors or pickle)."""
    from .weights import load_file

    for name in ("model.safetensors", "pytorch_model.bin"):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return load_file(path)
    raise FileNotFoundError(
        f"{os.fspath(directory)!r} has no model.safetensors or pytorch_model.bin (a sharded checkpoint is not "
        "read here); load it with UperNetForSemanticSegmentation.from_pretrained and pass the model"
    )


def _backbone_from(described: Any) -> SwinBackbone:
    """Our backbone for a transformers ``SwinConfig`` (detection semantics: what its ``SwinBackbone`` runs)."""
    from .factory import create_model
    from .weights.transformers_config import dropout_fields

    kind = getattr(described, "model_type", None)
    if kind != "swin":
        raise ValueError(
            f"the UperNet's backbone_config is {kind!r}; from_transformers() converts Swin V1 backbones "
            "(model_type 'swin'); for other backbones use transformers' model as it is"
        )
    unsupported = {
        "hidden_act": (described.hidden_act, "gelu"),
        "layer_norm_eps": (described.layer_norm_eps, 1e-5),
        "use_absolute_embeddings": (described.use_absolute_embeddings, False),
    }
    for name, (value, needed) in unsupported.items():
        if value != needed:
            raise ValueError(f"backbone_config.{name}={value!r}: only {needed!r} is converted exactly")
    stages = [name for name in described.out_features if name != "stem"]
    if len(stages) != len(described.out_features):
        raise ValueError(
            f"backbone_config.out_features={list(described.out_features)} includes 'stem' (the patch embedding's "
            "output), which this package's backbone does not return: only stage1..stage4 convert"
        )
    image_size = described.image_size
    image_size = tuple(image_size) if isinstance(image_size, (list, tuple)) else (image_size, image_size)
    return create_model(
        "swin_t",
        features_only=True,
        out_indices=[described.stage_names.index(name) - 1 for name in stages],
        semantics="detection",
        embed_dim=described.embed_dim,
        depths=tuple(described.depths),
        num_heads=tuple(described.num_heads),
        window_size=described.window_size,
        img_size=image_size,
        patch_size=described.patch_size,
        in_chans=described.num_channels,
        mlp_ratio=float(described.mlp_ratio),
        qkv_bias=described.qkv_bias,
        **dropout_fields(
            described.hidden_dropout_prob, described.attention_probs_dropout_prob, "the UperNet's backbone_config"
        ),
        drop_path_rate=described.drop_path_rate,
    )
