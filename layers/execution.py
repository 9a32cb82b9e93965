"""How the math runs: decided here, once per forward, never inside the blocks.

The blocks are the paper's equations and run their submodules only through ``forward``, so a user's
wrapper (a LoRA adapter, a quantized linear, a hook) sees every call. Two things here choose how:

- :func:`image_chunks`: CPU inference in pieces of a few images. On Linux, glibc serves allocations above 32 MiB
  (its largest mmap threshold on 64-bit) with fresh pages from the kernel on every call, and the first write to each
  page faults; a swin_t batch of 8 at 224 makes a 36.8 MiB MLP hidden tensor in each stage-1 block. Images are
  independent through the whole trunk (LayerNorm is per token), so the model's forward runs on slices of the batch,
  each small enough that no intermediate passes :data:`CHUNK_BYTES`, and the outputs are the same ops on the same
  rows. Where the process started with glibc keeping larger blocks in its heap (``MALLOC_MMAP_THRESHOLD_`` and
  ``MALLOC_TRIM_THRESHOLD_`` raised, :mod:`swin.layers.allocator`), there is nothing to avoid up to that size, and
  the batch runs whole (in the main thread; glibc maps a worker thread's large blocks fresh whatever they say). Used
  only in evaluation without autograd (under autograd each piece would be saved for backward anyway), on CPU (CUDA's
  caching allocator has no such cost), without autocast, untraced (neither compiled nor ``torch.jit.trace``), with
  every submodule in eval mode, when no submodule has forward hooks (a hook must see the whole batch once, and FLOP
  counters attribute work through hooks), and when every submodule is one of ours or torch's own layers: a module of
  the user's may depend on the whole batch (dynamic quantization takes each call's activation range), so a model
  holding one runs the batch at once; so does a model run under a torch-function or dispatch mode of the user's, or
  with a ``torch.nn.functional`` function or a method of ours replaced (:func:`users_code_around`, :func:`plain`).
  What it gains: ``swin bench --unchunked``.
- :func:`window_sdpa`: the attention kernel call for windows, eager or traced: in bf16 inference on a CPU with
  AVX512-BF16 our fused window-attention kernel (:mod:`swin.layers.window_kernel`), else SDPA's fused kernel,
  or on CPU in bf16/fp16 two matmuls and a softmax (faster there at 49-token windows, see
  ``_matmul_attention_pays``). Where a user's code hooks or replaces an attention's ``softmax`` or ``attn_drop``
  (the official modules, which those kernels do not call), or replaces ``F.softmax`` / ``F.dropout`` (which they
  call), the probabilities are made and passed through them instead (:func:`observed`,
  :func:`module_attention`): a hook on ``attn.softmax`` gets the attention maps. A user's torch-function mode sees
  the ops (the fused kernel, one opaque call, steps aside).
- :func:`swin.layers.linear_kernel.linear_kernels` (its own module, entered beside :func:`image_chunks` in the
  trunk's forward): which GEMM library runs float32 linear layers on CPU, MKL's (ATen's default) or
  oneDNN's, whichever a timing on the machine found faster; every call still goes through the module's
  ``forward`` with its current weights.
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch.fx._symbolic_trace import is_fx_symbolic_tracing

from . import allocator, window_kernel

__all__ = [
    "CHUNK_BYTES",
    "ENABLED",
    "image_chunks",
    "merged_bias",
    "module_attention",
    "observed",
    "plain",
    "run_in_image_chunks",
    "splittable",
    "window_sdpa",
]

# The largest intermediate a piece may make: under glibc's 32 MiB mmap threshold with room to spare.
CHUNK_BYTES = 24 * 2**20
# Off: the forward always takes the whole batch at once, as in training (``swin bench --unchunked`` times both).
ENABLED = True

T = TypeVar("T")


def image_chunks(model: torch.nn.Module, x: torch.Tensor, bytes_per_image: Callable[[], int]) -> int | None:
    """How many images of ``x`` one piece of ``model``'s forward takes, or None for the whole batch at once:
    pieces only where chunked inference applies (see the module docstring) and one image's largest
    intermediate, ``bytes_per_image()``, times the batch would pass :data:`CHUNK_BYTES`."""
    # Traced first: with symbolic sizes every comparison below would add a guard to the graph, and
    # torch.jit.trace would record the pieces of this batch size as the graph for every batch size.
    if torch.compiler.is_compiling() or torch.jit.is_tracing() or not ENABLED:
        return None
    if model.training or torch.is_grad_enabled() or x.device.type != "cpu" or torch.is_autocast_enabled("cpu"):
        return None
    batch = x.shape[0]
    if batch < 2 or not splittable(model) or users_code_around():
        return None
    if any(module.training for module in model.modules()):
        return None  # a submodule left in training mode may use batch statistics (BatchNorm) or draw dropout
    # pieces keep each intermediate under glibc's mmap threshold; where the process started with the heap
    # keeping larger blocks (allocator.heap_keeps_blocks_up_to), blocks up to that size gain nothing from pieces
    per_chunk = max(1, max(CHUNK_BYTES, allocator.heap_keeps_blocks_up_to()) // max(1, bytes_per_image()))
    if per_chunk >= batch:
        return None
    pieces = -(-batch // per_chunk)
    return -(-batch // pieces)  # pieces of equal size, the last one may be smaller


def run_in_image_chunks(forward: Callable[[torch.Tensor], T], x: torch.Tensor, images: int | None) -> T:
    """``forward(x)``, computed ``images`` images at a time and concatenated along the batch (a tensor, or
    lists and tuples of them, element by element); ``images=None``: at once."""
    if images is None:
        return forward(x)
    return _concatenate([forward(part) for part in x.split(images)])


def _concatenate(pieces: list):
    if isinstance(pieces[0], torch.Tensor):
        return torch.cat(pieces)
    return type(pieces[0])(_concatenate(list(level)) for level in zip(*pieces, strict=True))


# Modules known to compute each sample on its own (per token or per image): ours and torch.nn's layers.
_PER_SAMPLE = ("swin.", "torch.nn.modules.")


def plain(model: torch.nn.Module) -> bool:
    """No forward hooks below ``model`` or global ones, and only modules known to work per sample (ours and
    torch's layers, with their own ``forward``: not one patched onto the instance or the class): what a compiled
    graph may replace without a user's code missing a call."""
    if _global_hooks(backward=False):
        return False
    classes: dict[type, dict[str, object] | None] = {}  # each class checked once
    for m in model.modules():
        if m is not model and (m._forward_hooks or m._forward_pre_hooks):
            return False
        cls = type(m)
        known = classes[cls] if cls in classes else classes.setdefault(cls, _unpatched(cls))
        if known is None or _patched_on(m, known):
            return False
    return True


def observed(module: torch.nn.Module) -> bool:
    """Whether a user's code watches or replaces ``module``, so that it must be called rather than computed
    around: hooks on it (forward, backward) or global ones, a module of the user's in its place or inside it, or a
    forward patched onto it. (For the modules a fused kernel would skip: attention's ``softmax`` and
    ``attn_drop``.)"""
    if is_fx_symbolic_tracing() or _global_hooks(backward=True):  # a traced graph records the modules' calls
        return True
    if functional_patched("softmax", "dropout"):  # what nn.Softmax and nn.Dropout call, and the kernels do not
        return True
    for m in module.modules():
        if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks:
            return True
        if _users_code(m):
            return True
    return False


def _global_hooks(backward: bool) -> bool:
    """Whether module hooks are registered for every module (``register_module_forward_hook`` and the like)."""
    from torch.nn.modules import module as torch_module

    forward = torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks
    return bool(
        forward or (backward and (torch_module._global_backward_hooks or torch_module._global_backward_pre_hooks))
    )


# torch.nn.functional's functions as imported: one replaced later (``F.layer_norm = mine``) is a user's code that
# every module calling it runs (see users_code_around); one already replaced then is not torch's own code.
_FUNCTIONAL = {name: value for name, value in vars(F).items() if callable(value)}
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def _torch_written(value: object) -> bool:
    """A builtin, or a Python function whose code is in torch's own files."""
    return not inspect.isfunction(value) or value.__code__.co_filename.startswith(_TORCH_DIR)


_REPLACED_BEFORE = {name for name, value in _FUNCTIONAL.items() if not _torch_written(value)}


def functional_patched(*names: str) -> bool:
    """Whether a user replaced functions of ``torch.nn.functional`` (those ``names``, or any), before this module
    was imported or since: code that the modules calling them run, and that a kernel doing their work would
    skip."""
    for name in _REPLACED_BEFORE if not names else _REPLACED_BEFORE.intersection(names):
        if not _torch_written(getattr(F, name, None)):  # still not torch's (one restored since counts as torch's)
            return True
    items = _FUNCTIONAL.items() if not names else ((name, _FUNCTIONAL.get(name)) for name in names)
    return any(getattr(F, name, None) is not value for name, value in items if name not in _REPLACED_BEFORE)


def users_code_around() -> bool:
    """Whether a user's code watches this pass from outside the modules: a torch-function or dispatch mode of
    theirs (every op of the pass goes through it; ours and torch's device contexts excepted) or a
    replaced ``torch.nn.functional`` function. Such code may depend on the whole batch, and must see the ops."""
    modes = torch._C._len_torch_function_stack()
    if any(not _torch_own_mode(torch._C._get_function_stack_at(i)) for i in range(modes)):
        return True
    return torch._C._len_torch_dispatch_stack() > 0 or functional_patched()


def _torch_own_mode(mode: object) -> bool:
    """Ours (:mod:`swin.layers.linear_kernel`'s) or torch's ``with torch.device(...)`` /
    ``torch.set_default_device``, which only sets where new tensors are made."""
    from torch.utils._device import DeviceContext

    from .linear_kernel import _OneDNNLinear

    return type(mode) in (_OneDNNLinear, DeviceContext)


def _users_code(m: torch.nn.Module) -> bool:
    """Whether ``m`` runs a user's code: a class that is neither ours nor torch.nn's, or a function patched onto
    the class or the instance: its forward, and for our classes any of their methods (a patched
    ``SwinBlock.shifted_window_attention`` would see pieces of the batch as much as a patched forward)."""
    known = _unpatched(type(m))
    return known is None or _patched_on(m, known)


def _patched_on(m: torch.nn.Module, known: dict[str, object]) -> bool:
    """Whether one of the class's functions is shadowed by one set on the instance (``block.forward = mine``)."""
    instance = m.__dict__
    for name in known:  # a loop, not any(): plain() asks this of every module on every forward
        if name in instance:
            return True
    return False


def _unpatched(cls: type) -> dict[str, object] | None:
    """The functions of ``cls`` that :func:`_known_class` checks, or None where one is a user's."""
    known = _KNOWN.get(cls)
    if known is None or any(getattr(cls, name, None) is not function for name, function in known.items()):
        # read eagerly (code objects are not traced): a class a graph meets first counts as the user's
        if torch.compiler.is_compiling() or not _known_class(cls):
            return None
        known = _KNOWN[cls]
    return known


# Per class of ours or torch.nn's, the functions checked (see _known_class), as they were when found unpatched.
_KNOWN: dict[type, dict[str, object]] = {}


def _ours(cls: type) -> bool:
    return cls.__module__.startswith("swin.")


def _known_class(cls: type) -> bool:
    """Whether ``cls`` is one of ours or torch.nn's whose functions are the ones its defining classes' modules
    wrote: for torch.nn's classes ``forward``, for ours every method (``functools.wraps`` around a user's
    function counts as the user's). Not a user's function patched onto the class."""
    if not cls.__module__.startswith(_PER_SAMPLE):
        return False
    names = {"forward"}
    if _ours(cls):
        names |= {
            name for base in cls.__mro__ if _ours(base) for name, v in vars(base).items() if inspect.isfunction(v)
        }
    functions = {}
    for name in sorted(names):
        function = getattr(cls, name)
        owner = next(base for base in cls.__mro__ if name in vars(base))
        source = getattr(sys.modules.get(owner.__module__), "__file__", None)
        if not owner.__module__.startswith(_PER_SAMPLE) or not _written_in(function, source):
            return False
        functions[name] = function
    _KNOWN[cls] = functions
    return True


def _written_in(function: object, source: str | None) -> bool:
    """Whether ``function``'s code is in the file ``source``, through torch's own decorators (``torch.no_grad()``
    wraps with ``functools.wraps``), not through anyone else's."""
    while True:
        code = getattr(function, "__code__", None)
        if code is None or source is None:
            return False
        if code.co_filename == source:
            return True
        function = getattr(function, "__wrapped__", None)
        if function is None or not code.co_filename.startswith(_TORCH_DIR):
            return False


def splittable(model: torch.nn.Module) -> bool:
    """:func:`plain`, and its batch may run in pieces: no BatchNorm without running statistics (it normalizes
    by the batch's, in eval too, so a piece would compute other values)."""
    return plain(model) and not any(
        isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.running_mean is None for m in model.modules()
    )


def merged_bias(position_bias: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Position bias (heads, N, N) plus shift mask (nW, N, N) as one additive tensor: (1, heads, N, N) without a
    mask, (1, nW*heads, N, N) with one (the layout :func:`window_sdpa`'s unfused paths take)."""
    bias = position_bias.unsqueeze(0)
    if mask is not None:
        n = mask.shape[-1]
        bias = (bias + mask.unsqueeze(1)).reshape(1, -1, n, n)
    return bias


def window_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    position_bias: torch.Tensor,
    mask: torch.Tensor | None,
    dropout: float = 0.0,
    scale: float | None = None,
) -> torch.Tensor:
    """softmax(q k^T * scale + position_bias + mask) v for (B, nW, heads, N, d) q, k, v, a (heads, N, N) position
    bias and a (nW, N, N) shift mask or None; the heads' outputs side by side, (B, nW, N, heads*d).

    Which kernel: bfloat16 inference on a CPU with AVX512-BF16, eager or compiled with static sizes: the fused
    window-attention kernel (:mod:`swin.layers.window_kernel`), where no autograd, autocast, dispatch mode or
    transform needs the aten ops. Otherwise SDPA's fused kernel, or on CPU in bf16/fp16 with the default scale (Swin V1)
    two matmuls and a softmax (``_matmul_attention_pays``).

    SDPA's fused CPU kernel takes 4-D inputs. Without a mask the bias broadcasts over (B*nW); with one,
    windows and heads share a dimension so that the (nW*heads) bias broadcasts over the batch, which costs a
    copy of q/k/v unless there is one image (then the bias is viewed per window). Eager, reshapes stay views
    where they can, and SDPA called on views of the projection writes its output already in token-major order.
    Exported (``torch.export``, ONNX) or traced with symbolic sizes, a reshape would have to decide whether it
    is a view, and the ONNX exporter fails on reshape of the transposed output even at static sizes, so there:
    explicit copies, then views (and neither the fused kernel nor the matmul path). Compiled with static sizes
    (``torch.compile`` of one shape, as ``swin.optimize`` does) it runs as eager, without those copies.
    """
    batch, windows, heads, n, head_dim = q.shape
    traced = torch.compiler.is_compiling()
    # torch.jit.trace (and the ONNX exporter built on it) records one batch size's branches for all of them
    careful = torch.jit.is_tracing() or (
        traced and (torch.compiler.is_exporting() or not all(type(size) is int for size in q.shape))
    )
    # our kernels only where SDPA is torch's: a user's F.scaled_dot_product_attention (another kernel, a
    # recorder) is then the one attention call
    ours = not careful and not functional_patched("scaled_dot_product_attention")
    if ours and _fused_attention_pays(q, k, v, position_bias, dropout, traced):
        return window_kernel.window_attention(
            q,
            k,
            v,
            position_bias.float().contiguous(),
            None if mask is None else mask.float().contiguous(),
            head_dim**-0.5 if scale is None else scale,
        )
    bias = merged_bias(position_bias, mask)
    masked = mask is not None
    if ours and ((not traced and _transforming()) or scale is None and _matmul_attention_pays(q)):
        # Under autocast the bias keeps its float32 and the scores, softmax and its backward follow, as in
        # timm's and torchvision's attention under autocast (their float32 bias promotes the scores too).
        if not torch.is_autocast_enabled(q.device.type):
            bias = bias.to(q.dtype)
        return _matmul_attention(q, k, v, bias.reshape(1, windows if masked else 1, heads, n, n), dropout, scale)
    bias = bias.to(q.dtype)
    if careful:
        q, k, v = (t.clone(memory_format=torch.contiguous_format) for t in (q, k, v))
    if not masked or (not careful and batch == 1):
        shape = (batch * windows, heads, n, head_dim)
        if masked:
            bias = bias.view(windows, heads, n, n)
    else:
        shape = (batch, windows * heads, n, head_dim)
    q, k, v = (t.reshape(shape) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout, scale=scale)
    out = out.view(batch, windows, heads, n, head_dim).transpose(2, 3)
    if careful:
        return out.clone(memory_format=torch.contiguous_format).view(batch, windows, n, heads * head_dim)
    return out.reshape(batch, windows, n, heads * head_dim)


def _fused_attention_pays(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, position_bias: torch.Tensor, dropout: float, traced: bool
) -> bool:
    """Whether the fused bf16 window-attention kernel runs this call: a shape and dtype it covers, no autograd
    wanted through it, not under autocast (whose semantics, as timm's and torchvision's attention under it,
    round the scores to bf16 before adding the float32 bias; the kernel keeps them in float32), and, eager,
    plain tensors with nothing observing the aten ops (dispatch modes such as FLOP counters, functorch
    transforms, forward-mode AD); it is built on the first such call. Compiled (``swin.optimize`` runs one image
    eagerly first, which builds it), it is used once built."""
    if not (window_kernel.ENABLED and window_kernel.supports(q, k, v, dropout)):
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, position_bias)):
        return False
    if torch.is_autocast_enabled(q.device.type):
        return False  # autocast's attention is a bf16 matmul's scores, softmax in float32: timm's, kept
    if traced:
        return window_kernel.READY
    return (
        all(type(t) in (torch.Tensor, torch.nn.Parameter) for t in (q, k, v, position_bias))
        and not users_code_around()  # a mode sees the ops the kernel's one call would hide
        and not _transforming()
        and window_kernel.available()
    )


def _matmul_attention_pays(q: torch.Tensor) -> bool:
    """Whether attention runs as matmuls and a softmax instead of SDPA: on CPU in bfloat16 or float16 (weights
    cast, or autocast), eager or compiled with static sizes, for Swin V1 (V2's cosine scores reach its
    temperature, up to 100, where bf16 steps are 0.5 wide; SDPA keeps scores in float32, so V2 stays on it).
    ATen's fused CPU flash kernel spends most of its time per (window, head) pair at 49 tokens in reduced
    precision, forward and backward; compiled, inductor fuses bias, shift mask (constants once frozen) and
    softmax into one kernel around two batched matmuls. What it gains, compiled and in training under bf16
    autocast: docs/PERFORMANCE.md (the AVX512-BF16 machine). In float32 SDPA's kernel is not slow, and on CUDA
    SDPA's kernels are the fast ones: both keep it."""
    return q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16)


def module_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    position_bias: torch.Tensor,
    mask: torch.Tensor | None,
    softmax: torch.nn.Module,
    attn_drop: torch.nn.Module,
    scale: float | None = None,
) -> torch.Tensor:
    """:func:`window_sdpa`'s result with the probabilities made and passed through ``softmax`` and ``attn_drop``
    (the official modules), for a user's code that watches or replaces them (:func:`observed`): the scores
    q k^T * scale + position bias + mask, (B, nW, heads, N, N), in the bias's float32 under autocast, as the
    matmul path; the modules get them as (B*nW, heads, N, N)."""
    batch, windows, heads, n, head_dim = q.shape
    # the modules see (B*nW, heads, N, N), as the official code's and timm's do
    probs = attn_drop(softmax(attention_scores(q, k, position_bias, mask, scale)))
    out = probs.reshape(batch, windows, heads, n, n) @ v
    return out.transpose(2, 3).reshape(batch, windows, n, heads * head_dim)


@torch.fx.wrap  # it decides on device and autocast: one node under torch.fx.symbolic_trace
def attention_scores(
    q: torch.Tensor, k: torch.Tensor, position_bias: torch.Tensor, mask: torch.Tensor | None, scale: float | None
) -> torch.Tensor:
    """q k^T * scale + position bias + mask as (B*nW, heads, N, N), in the bias's float32 under autocast."""
    batch, windows, heads, n, head_dim = q.shape
    bias = merged_bias(position_bias, mask).reshape(1, -1, heads, n, n)
    if q.device.type == "meta" or not torch.is_autocast_enabled(q.device.type):  # (meta has no autocast)
        bias = bias.to(q.dtype)
    scores = (q * (head_dim**-0.5 if scale is None else scale)) @ k.transpose(-2, -1) + bias
    return scores.reshape(batch * windows, heads, n, n)


def _transforming() -> bool:
    """Whether a torch.func transform (grad, jacrev, jacfwd, vmap) or forward-mode AD is running (eager): our
    fused kernel hides the aten ops they need, and ATen's fused CPU attention has neither a derivative for its
    mask there (the position bias, a parameter) nor forward AD, so attention runs as matmuls and a softmax, as
    timm's unfused attention always does."""
    return torch._C._functorch.peek_interpreter_stack() is not None or torch.autograd.forward_ad._current_level != -1


def _matmul_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, dropout: float, scale: float | None = None
) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + bias) v for (B, nW, heads, N, d) q, k, v and a (1, nW or 1, heads, N, N) bias,
    as (B, nW, N, heads*d); ``dropout`` on the attention probabilities (training). The scores are in the bias's
    dtype when it is wider than q's (float32 under autocast), else rounded to q's, as timm's and torchvision's
    unfused attention do."""
    batch, windows, heads, n, head_dim = q.shape
    scores = (q * (head_dim**-0.5 if scale is None else scale)) @ k.transpose(-2, -1) + bias
    probs = scores.softmax(-1)
    if dropout:
        probs = F.dropout(probs, dropout)
    out = probs @ v
    return out.transpose(2, 3).reshape(batch, windows, n, heads * head_dim)


for _attention_module in (torch.nn.Softmax, torch.nn.Dropout):  # what observed() meets in every attention
    _known_class(_attention_module)
