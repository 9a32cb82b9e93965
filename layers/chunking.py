"""Inference on CPU in pieces, so that no intermediate tensor is large.

Why: on Linux, glibc serves allocations above 32 MiB (its largest mmap threshold on 64-bit) with fresh pages
from the kernel on every call, and the first write to each page faults. A swin_t batch of 8 at 224 makes a
38.5 MiB MLP hidden tensor in each stage-1 block, and the 800x1333 backbone a 98 MiB one; where faults are
expensive (on virtual machines especially) allocating such a tensor can cost more than the GELU over it.
Computing the block in row or window chunks of a few MiB keeps every intermediate small enough to be reused
from the heap and to stay in cache between the ops that make and consume it. Results are the same ops on the
same rows, so the outputs equal the unchunked forward.

Only for inference without autocast: under autograd the pieces would each be saved for backward, and on
CUDA one large kernel is faster than several small ones (its caching allocator has no such cost).
"""

from __future__ import annotations

import torch

__all__ = ["CHUNK_BYTES", "ENABLED", "chunked_inference", "chunk_length"]

# The largest intermediate a chunk may make. 8 MiB: well under glibc's 32 MiB mmap ceiling, and still whole
# images or many windows per chunk. What it gains: `swin bench --unchunked` (docs/PERFORMANCE.md).
CHUNK_BYTES = 8 * 2**20
# Off: every block computes in one piece, as in training (``swin bench --unchunked`` times both).
ENABLED = True


def chunked_inference(module: torch.nn.Module, x: torch.Tensor) -> bool:
    """Whether ``module`` may compute on ``x`` in chunks: evaluation, no autograd, CPU, no autocast (its
    outputs change dtype between ops, so in-place and ``out=`` writes would round the residual stream), not
    being traced, and no forward hooks on its submodules or global ones (a hook on ``attn`` or ``mlp`` must
    see whole inputs and outputs, and FLOP counters attribute work to modules through hooks)."""
    return (
        ENABLED
        and not module.training
        and not torch.is_grad_enabled()
        and x.device.type == "cpu"
        and not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_compiling()
        and not _hooked(module)
    )


def _hooked(module: torch.nn.Module) -> bool:
    from torch.nn.modules import module as torch_module

    if getattr(torch_module, "_global_forward_hooks", None) or getattr(torch_module, "_global_forward_pre_hooks", None):
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in module.modules() if m is not module)


def chunk_length(total: int, bytes_per_item: int, budget: int | None = None) -> int:
    """How many of ``total`` items (rows, windows) one chunk takes so that it makes at most ``budget`` bytes
    (default :data:`CHUNK_BYTES`, read at each call); at least one; chunks of equal length (the last one may
    be shorter)."""
    budget = CHUNK_BYTES if budget is None else budget
    per_chunk = max(1, budget // max(1, bytes_per_item))
    if per_chunk >= total:
        return total
    pieces = -(-total // per_chunk)
    return -(-total // pieces)
