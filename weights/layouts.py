"""Checkpoint layouts as data: key rename rules, tensor transforms, keys to drop, and how to recognise each.

Ours is the official Microsoft layout without its derived buffers. Each other layout is a list of
``(pattern, replacement)`` regex rules applied in order to every key (replacement may be a function of
the match, for index arithmetic), plus a few named tensor transforms for what renaming cannot express
(transformers' separate q/k/v, mmdetection's ``nn.Unfold`` channel order), plus patterns of keys that carry
no weights.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .export_transforms import fill_qkv_bias, hf_prefix, split_qkv

__all__ = [
    "Layout",
    "LAYOUTS",
    "BUFFER_KEYS",
    "DETECTION_ORDER",
    "merge_qkv",
    "qv_bias_v2",
    "split_qkv_bias_v2",
    "unfold_to_official",
]

Rule = tuple[str, "str | Callable[[re.Match], str]"]
StateDict = dict[str, torch.Tensor]
Transform = Callable[[StateDict], StateDict]

# Derived buffers that some layouts save; rebuilt from the window size, never loaded.
BUFFER_KEYS = r"(relative_position_index|relative_coords_table|attn_mask)$"


@dataclass(frozen=True)
class Layout:
    """One checkpoint layout.

    Attributes:
        name: what ``convert(source=...)`` and ``export(target=...)`` call it.
        to_ours: rename rules, theirs -> ours, applied in order to each key.
        to_ours_transforms: tensor transforms applied after renaming (many keys -> one, reordering).
        from_ours: rename rules, ours -> theirs (empty: no export to this layout).
        from_ours_before: tensor transforms applied to our keys before ``from_ours`` renames them.
        from_ours_after: tensor transforms applied to the renamed keys.
        drop: keys matching this regex are derived state and skipped.
        signature: regexes; a key matching any of them marks a checkpoint as this layout.
    """

    name: str
    to_ours: tuple[Rule, ...] = ()
    to_ours_transforms: tuple[Transform, ...] = ()
    from_ours: tuple[Rule, ...] = ()
    from_ours_before: tuple[Transform, ...] = ()
    from_ours_after: tuple[Transform, ...] = ()
    drop: str = BUFFER_KEYS
    signature: tuple[str, ...] = field(default=())


def _shift_stage(offset: int) -> Callable[[re.Match], str]:
    return lambda m: f"layers.{int(m.group(1)) + offset}.downsample"


def _torchvision_stage(m: re.Match) -> str:
    index = int(m.group(1))
    if index % 2:  # features.1, 3, 5, 7: the blocks of stage 0..3
        return f"layers.{(index - 1) // 2}.blocks."
    return f"layers.{index // 2 - 1}.downsample."  # features.2, 4, 6: merging after stage 0..2


# -- tensor transforms ----------------------------------------------------------------------------------


def merge_qkv(sd: StateDict) -> StateDict:
    """``*.attn.{q,k,v}.{weight,bias}`` -> ``*.attn.qkv.*``, concatenated q, k, v on the output dimension.

    The official fused projection is reshaped to (3, heads, head_dim) on its outputs, so its rows are all of
    q, then all of k, then all of v: exactly the three separate projections stacked.
    """
    out: StateDict = {}
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in sd.items():
        m = re.match(r"^(.*\.attn)\.([qkv])\.(weight|bias)$", key)
        if m:
            parts.setdefault(f"{m.group(1)}.qkv.{m.group(3)}", {})[m.group(2)] = value
        else:
            out[key] = value
    for key, qkv in parts.items():
        if set(qkv) != {"q", "k", "v"}:
            raise ValueError(f"{key}: found only the {sorted(qkv)} projection(s); q, k and v are all needed")
        out[key] = torch.cat([qkv["q"], qkv["k"], qkv["v"]], dim=0)
    return out


def qv_bias_v2(sd: StateDict) -> StateDict:
    """Swin V2 ``*.attn.q.bias`` and ``*.attn.v.bias`` (transformers) -> ``*.attn.q_bias`` and ``*.attn.v_bias``.

    V2 attention (``logit_scale`` beside it) learns no k bias: transformers' key projection has none, and the
    official layout keeps the other two as ``q_bias`` / ``v_bias`` beside a bias-free fused ``qkv``. Runs
    before :func:`merge_qkv`, which then fuses the three weights. V1 attention keeps its three biases.
    """
    out = dict(sd)
    for key in sd:
        m = re.match(r"^(.*\.attn)\.([qv])\.bias$", key)
        if m and f"{m.group(1)}.logit_scale" in sd and f"{m.group(1)}.k.bias" not in sd:
            out[f"{m.group(1)}.{m.group(2)}_bias"] = out.pop(key)
    return out


def split_qkv_bias_v2(sd: StateDict) -> StateDict:
    """Swin V2 ``*.attn.qkv.bias`` (torchvision) -> ``*.attn.q_bias`` and ``*.attn.v_bias``.

    The official V2 attention learns q and v biases only; torchvision keeps one fused (3C,) bias and zeroes
    its k third in every forward, so dropping that third is exact. V1 attention (no ``logit_scale`` beside
    it) keeps its fused bias.
    """
    out = dict(sd)
    for key, value in sd.items():
        m = re.match(r"^(.*\.attn)\.qkv\.bias$", key)
        if not m or f"{m.group(1)}.logit_scale" not in sd:
            continue
        dim = value.shape[0] // 3
        del out[key]
        out[f"{m.group(1)}.q_bias"] = value[:dim]
        out[f"{m.group(1)}.v_bias"] = value[2 * dim :]
    return out


def unfold_to_official(sd: StateDict) -> StateDict:
    """Undo mmdetection's channel order in patch merging.

    mmdetection merges patches with ``nn.Unfold(2, stride=2)``, whose output channels run channel-major,
    then kernel position (0,0), (0,1), (1,0), (1,1). The official order is quadrant-major: [0::2,0::2],
    [1::2,0::2], [0::2,1::2], [1::2,1::2], i.e. kernel positions 0, 2, 1, 3. mmdetection's converter
    (``correct_unfold_reduction_order`` / ``correct_unfold_norm_order``) permutes the official weights one
    way; this is its inverse.
    """
    out = dict(sd)
    for key, value in sd.items():
        if not re.match(r"^layers\.\d+\.downsample\.(reduction\.weight|norm\.weight|norm\.bias)$", key):
            continue
        if value.ndim == 2:  # reduction (2C, 4C): columns are (C, 4) in mmdetection, (4, C) officially
            out_channels, in_channels = value.shape
            x = value.reshape(out_channels, in_channels // 4, 4).transpose(1, 2)
            out[key] = x[:, [0, 2, 1, 3], :].reshape(out_channels, in_channels)
        else:  # norm (4C,)
            x = value.reshape(value.shape[0] // 4, 4).transpose(0, 1)
            out[key] = x[[0, 2, 1, 3], :].reshape(-1)
    return out


# -- the layouts ----------------------------------------------------------------------------------------

OFFICIAL = Layout(
    name="official",
    # Patch merging at the end of stage 0 is what tells official from timm (timm's filter tests the same
    # key); saved buffers are no sign of either, timm versions before 0.9 saved them too.
    signature=(r"^layers\.0\.downsample\.",),
)

TIMM = Layout(
    name="timm",
    # timm merges patches at the start of the next stage and keeps the classifier in head.fc; its features_only
    # model (FeatureListNet) names the stages layers_0 .. layers_3 (module names cannot hold dots).
    to_ours=(
        (r"^layers_(\d+)\.", r"layers.\1."),
        (r"^layers\.(\d+)\.downsample", _shift_stage(-1)),
        (r"^head\.fc\.", "head."),
    ),
    from_ours=((r"^layers\.(\d+)\.downsample", _shift_stage(+1)), (r"^head\.", "head.fc.")),
    signature=(r"^head\.fc\.", r"^layers\.[1-9]\.downsample\.", r"^layers_\d+\."),
)

TORCHVISION = Layout(
    name="torchvision",
    to_ours=(
        (r"^features\.0\.0\.", "patch_embed.proj."),
        (r"^features\.0\.2\.", "patch_embed.norm."),
        (r"^features\.(\d+)\.", _torchvision_stage),
        (r"\.mlp\.0\.", ".mlp.fc1."),
        (r"\.mlp\.3\.", ".mlp.fc2."),
    ),
    # Swin V2 (swin_v2_t/s/b): the same module tree; its fused qkv bias becomes the official q_bias / v_bias.
    to_ours_transforms=(split_qkv_bias_v2,),
    # torchvision's derived buffers are persistent: swin.weights.export adds them (they need the windows)
    from_ours_before=(fill_qkv_bias,),
    from_ours=(
        (r"^patch_embed\.proj\.", "features.0.0."),
        (r"^patch_embed\.norm\.", "features.0.2."),
        (r"^layers\.(\d+)\.blocks\.", lambda m: f"features.{2 * int(m.group(1)) + 1}."),
        (r"^layers\.(\d+)\.downsample\.", lambda m: f"features.{2 * int(m.group(1)) + 2}."),
        (r"\.mlp\.fc1\.", ".mlp.0."),
        (r"\.mlp\.fc2\.", ".mlp.3."),
    ),
    signature=(r"^features\.0\.0\.",),
)

# Hugging Face transformers: SwinModel / SwinForImageClassification / SwinBackbone, and their Swin V2
# counterparts (Swinv2Model, ...: keys under swinv2., the V1 names plus logit_scale, continuous_position_bias_mlp
# and q/v biases only). ``save_pretrained`` writes the 4.x names (attention.self.query, intermediate.dense, ...)
# even in 5.x, whose in-memory V1 state_dict uses q_proj/k_proj/v_proj/o_proj and mlp.fc1/fc2; both read here.
# V2's norms after attention and MLP are its layernorm_before / layernorm_after, as official V2's norm1 / norm2.
_HF = r"^(?:swinv2\.|swin\.)?"
TRANSFORMERS = Layout(
    name="transformers",
    to_ours=(
        (_HF + r"embeddings\.patch_embeddings\.projection\.", "patch_embed.proj."),
        (_HF + r"embeddings\.norm\.", "patch_embed.norm."),
        (_HF + r"embeddings\.position_embeddings$", "absolute_pos_embed"),  # use_absolute_embeddings=True
        (_HF + r"encoder\.layers\.(\d+)\.", r"layers.\1."),
        (_HF + r"layernorm\.", "norm."),
        (r"^hidden_states_norms\.stage(\d+)\.", lambda m: f"norm{int(m.group(1)) - 1}."),
        (r"^classifier\.", "head."),
        (r"\.layernorm_before\.", ".norm1."),
        (r"\.layernorm_after\.", ".norm2."),
        (r"\.attention\.(?:self|relative_position_bias)\.(relative_position_bias_table|logit_scale)$", r".attn.\1"),
        (r"\.attention\.self\.continuous_position_bias_mlp\.", ".attn.cpb_mlp."),
        (r"\.attention\.self\.query\.", ".attn.q."),
        (r"\.attention\.self\.key\.", ".attn.k."),
        (r"\.attention\.self\.value\.", ".attn.v."),
        (r"\.attention\.([qkv])_proj\.", r".attn.\1."),
        (r"\.attention\.(?:output\.dense|o_proj)\.", ".attn.proj."),
        (r"\.intermediate\.dense\.", ".mlp.fc1."),
        (r"\.blocks\.(\d+)\.output\.dense\.", r".blocks.\1.mlp.fc2."),
    ),
    to_ours_transforms=(qv_bias_v2, merge_qkv),
    # what save_pretrained writes (the 4.x names), which from_pretrained reads in 4.x and 5.x
    from_ours_before=(split_qkv,),
    from_ours=(
        (r"^patch_embed\.proj\.", "embeddings.patch_embeddings.projection."),
        (r"^patch_embed\.norm\.", "embeddings.norm."),
        (r"^absolute_pos_embed$", "embeddings.position_embeddings"),
        (r"^layers\.(\d+)\.", r"encoder.layers.\1."),
        (r"^norm\.", "layernorm."),
        (r"^norm(\d)\.", lambda m: f"hidden_states_norms.stage{int(m.group(1)) + 1}."),
        (r"^head\.", "classifier."),
        (r"\.norm1\.", ".layernorm_before."),
        (r"\.norm2\.", ".layernorm_after."),
        (r"\.attn\.(relative_position_bias_table|logit_scale)$", r".attention.self.\1"),
        (r"\.attn\.cpb_mlp\.", ".attention.self.continuous_position_bias_mlp."),
        (r"\.attn\.q\.", ".attention.self.query."),
        (r"\.attn\.k\.", ".attention.self.key."),
        (r"\.attn\.v\.", ".attention.self.value."),
        (r"\.attn\.proj\.", ".attention.output.dense."),
        (r"\.mlp\.fc1\.", ".intermediate.dense."),
        (r"\.mlp\.fc2\.", ".output.dense."),
    ),
    from_ours_after=(hf_prefix,),
    signature=(r"embeddings\.patch_embeddings\.", r"\.layernorm_before\.", r"\.attention\.(self|q_proj)"),
)

# mmdetection / mmsegmentation ``SwinTransformer`` (what their ``swin_converter`` produces from the official
# checkpoints); the ``backbone.`` prefix of a detector checkpoint is unwrapped before renaming.
MMDET = Layout(
    name="mmdet",
    to_ours=(
        (r"^patch_embed\.projection\.", "patch_embed.proj."),
        (r"^stages\.(\d+)\.", r"layers.\1."),
        (r"\.attn\.w_msa\.", ".attn."),
        (r"\.ffn\.layers\.0\.0\.", ".mlp.fc1."),
        (r"\.ffn\.layers\.1\.", ".mlp.fc2."),
    ),
    to_ours_transforms=(unfold_to_official,),
    # anchored at the trunk: a DETR's transformer (encoder.layers.*.ffn.layers.*) passed through is no mmdet trunk
    signature=(r"^patch_embed\.projection\.", r"^stages\.\d+\.blocks\.\d+\.(attn\.w_msa|ffn\.layers)\."),
)

LAYOUTS: dict[str, Layout] = {layout.name: layout for layout in (OFFICIAL, TIMM, TORCHVISION, TRANSFORMERS, MMDET)}

# Order in which detect_layout tries the signatures: the distinctive ones first; official before timm
# because both have layers.{i}.downsample keys (official also at i = 0).
DETECTION_ORDER = ("transformers", "mmdet", "torchvision", "official", "timm")
