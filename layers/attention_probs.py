"""The attention probabilities of a window attention module, for looking at them.

The forward never materialises them (the fused SDPA kernel goes from q, k, v straight to the output), and it
should not have to for a picture. So they are recomputed here from the module's own submodules and
parameters, on the windows and mask the module was called with (a forward hook can capture both), and the
caller can check that they reproduce the module's output (:func:`attention_output`) before trusting them.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from .attention import WindowAttention
from .attention_v2 import LOGIT_SCALE_MAX, WindowAttentionV2
from .execution import attention_scores

__all__ = ["AttentionProbs", "attention_output", "attention_probabilities"]


class AttentionProbs(NamedTuple):
    """``probs`` (B, nW, heads, N, N): softmax over keys (last dimension); ``values`` (B, nW, heads, N, d)."""

    probs: torch.Tensor
    values: torch.Tensor


def attention_probabilities(attn: torch.nn.Module, x: torch.Tensor, mask: torch.Tensor | None = None) -> AttentionProbs:
    """softmax(logits + position bias + shift mask) of ``attn`` on windows ``x`` (B, nW, N, C), as its forward
    computes it: V1 ``q k^T / sqrt(d)``, V2 ``tau * cos(q, k)`` (its scaled cosine attention); scores, position
    bias and mask by the forward's own :func:`swin.layers.execution.attention_scores`. Dropout on the
    probabilities is not applied (call it on a model in eval mode).
    """
    if not isinstance(attn, (WindowAttention, WindowAttentionV2)):
        raise TypeError(
            f"attention probabilities are defined for WindowAttention and WindowAttentionV2, got {type(attn).__name__}"
        )
    batch, windows, n, channels = x.shape
    heads = attn.num_heads
    head_dim = channels // heads
    qkv = attn.qkv(x)
    if isinstance(attn, WindowAttentionV2) and attn.q_bias is not None:
        qkv = qkv + torch.cat((attn.q_bias, torch.zeros_like(attn.q_bias), attn.v_bias))
    q, k, v = qkv.view(batch, windows, n, 3, heads, head_dim).permute(3, 0, 1, 4, 2, 5).unbind(0)
    scale = None  # SDPA's default, 1 / sqrt(d)
    if isinstance(attn, WindowAttentionV2):  # the temperature scales the unit queries
        q = F.normalize(q, dim=-1) * torch.clamp(attn.logit_scale, max=LOGIT_SCALE_MAX).exp()
        k, scale = F.normalize(k, dim=-1), 1.0
    scores = attention_scores(q, k, attn.position_bias(), mask, scale)  # the forward's own, (B*nW, heads, N, N)
    return AttentionProbs(scores.softmax(dim=-1).view(batch, windows, heads, n, n), v)


def attention_output(attn: torch.nn.Module, probs: AttentionProbs) -> torch.Tensor:
    """(B, nW, N, C): the module's output from the probabilities, ``proj(P V)``; equal to ``attn(x, mask)`` in
    eval mode when the probabilities are right."""
    out = probs.probs @ probs.values  # B, nW, heads, N, d
    batch, windows, heads, n, head_dim = out.shape
    return attn.proj(out.transpose(2, 3).reshape(batch, windows, n, heads * head_dim))
