"""Tensor transforms from our layout to another library's, for what renaming cannot express: transformers'
separate q/k/v projections, torchvision's one (3C,) bias of Swin V2, a library's own name prefix."""

from __future__ import annotations

import re

import torch

__all__ = ["fill_qkv_bias", "hf_prefix", "split_qkv"]

StateDict = dict[str, torch.Tensor]


def split_qkv(sd: StateDict) -> StateDict:
    """``*.attn.qkv.{weight,bias}`` -> ``*.attn.{q,k,v}.*`` (the fused projection's rows are all of q, then all
    of k, then all of v: the inverse of :func:`swin.weights.layouts.merge_qkv`), and Swin V2's ``*.attn.q_bias`` /
    ``*.attn.v_bias`` -> ``*.attn.q.bias`` / ``*.attn.v.bias`` (its k projection learns no bias)."""
    out: StateDict = {}
    for key, value in sd.items():
        fused = re.match(r"^(.*\.attn)\.qkv\.(weight|bias)$", key)
        own = re.match(r"^(.*\.attn)\.([qv])_bias$", key)
        if fused:
            for part, chunk in zip("qkv", value.chunk(3, dim=0), strict=True):
                out[f"{fused.group(1)}.{part}.{fused.group(2)}"] = chunk
        elif own:
            out[f"{own.group(1)}.{own.group(2)}.bias"] = value
        else:
            out[key] = value
    return out


def fill_qkv_bias(sd: StateDict) -> StateDict:
    """A (3C,) ``*.attn.qkv.bias`` where torchvision's attention always has one: Swin V2's ``q_bias``, zeros
    (torchvision zeroes the k third in every forward) and ``v_bias``; zeros for a model built with
    ``qkv_bias=False`` (adding zeros is exact)."""
    out = dict(sd)
    for key, weight in sd.items():
        m = re.match(r"^(.*\.attn)\.qkv\.weight$", key)
        if not m or f"{m.group(1)}.qkv.bias" in sd:
            continue
        q, v = out.pop(f"{m.group(1)}.q_bias", None), out.pop(f"{m.group(1)}.v_bias", None)
        zeros = weight.new_zeros(weight.shape[0] // 3)
        out[f"{m.group(1)}.qkv.bias"] = torch.cat([zeros if q is None else q, zeros, zeros if v is None else v])
    return out


def hf_prefix(sd: StateDict) -> StateDict:
    """The base model's prefix transformers saves a classifier or a ``SwinModel`` with (``swin.``, ``swinv2.``
    for Swin V2), left off for a ``SwinBackbone`` (per-stage norms ``hidden_states_norms.*``), whose keys have
    none; the classifier itself stays ``classifier.*``."""
    if any(key.startswith("hidden_states_norms.") for key in sd):
        return dict(sd)
    prefix = "swinv2." if any(key.endswith(".logit_scale") for key in sd) else "swin."
    return {(key if key.startswith("classifier.") else prefix + key): value for key, value in sd.items()}
