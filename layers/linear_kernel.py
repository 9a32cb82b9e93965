"""Which GEMM library runs float32 linear layers on CPU: oneDNN where it is the faster one here.

ATen sends a float32 ``F.linear`` on CPU to MKL's sgemm, and bfloat16 to oneDNN. Which of the two is faster
in float32 depends on the CPU: on a 2-core AMD EPYC with AVX-512, oneDNN's linear ran swin_t's shapes 1.8x-2.3x
as fast as MKL's (``python docs/linear_libraries.py``, docs/PERFORMANCE.md), so it is timed on the machine
rather than assumed. Both compute in float32 (no reduced-precision accumulation); only the order of the
additions differs.

:func:`linear_kernels` wraps one forward pass (the trunk's, see ``swin/trunk.py``): while it runs, each
``F.linear`` call, whichever module makes it (ours, or a user's wrapper around ours), runs through
``torch.ops.mkldnn._linear_pointwise`` with the weight and bias it was given on that call, so nothing is
cached and a weight update or a wrapper is seen as always; under autograd through :class:`_Linear`, whose
backward is oneDNN linears too (differentiable again, for double backward). It applies only where the answer
is the same float32 math and nothing observes the ops below ``F.linear``:

- the faster library here is oneDNN (:func:`onednn_pays`: timed once per process and thread count, on two
  of Swin's linear shapes; ``SWIN_ONEDNN_LINEAR=1`` or ``0`` in the environment, or :data:`ONEDNN_LINEAR`,
  decides instead);
- CPU, float32 input, no autocast (autocast would cast F.linear's inputs below this layer), no
  torch-function mode of the user's (ours would take F.linear before it) and no ``torch.nn.functional``
  function replaced by the user (ours would run it twice, see ``_applies``);
- eager: not under ``torch.compile``, ``torch.jit.trace``, ``torch.func`` transforms or forward-mode AD, no
  ``TorchDispatchMode`` active (a FLOP counter or fake tensors see aten ops and would miss this one), and no
  saved-tensor hooks (activation checkpointing recomputes outside the pass and compares what was saved);
  these are checked again on every call, since a user's submodule may enter one inside the pass;
- per call: plain tensors (not subclasses such as quantized or distributed weights), float32, strided, on CPU,
  a 2-D weight and a contiguous 1-D bias; any other call goes to ``F.linear`` as it would without this.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

__all__ = ["ONEDNN_LINEAR", "compiled_linear_kernels", "linear_kernels", "onednn_pays"]

# None: decided by timing (onednn_pays); True / False: always / never (SWIN_ONEDNN_LINEAR=1 / 0 sets it).
ONEDNN_LINEAR: bool | None = {"1": True, "0": False}.get(os.environ.get("SWIN_ONEDNN_LINEAR", ""))

# Linear shapes (tokens, in, out) that Swin runs a lot of: swin_t's stage-1 qkv at one image, stage-4 fc1 at 8.
_PROBE_SHAPES = ((3136, 96, 288), (392, 768, 3072))
# oneDNN is chosen when it takes the probe in at most this share of MKL's time.
_PAYS_BELOW = 0.9

_PLAIN = (torch.Tensor, nn.Parameter)
# ATen's linear itself, bound at import: the probe times it, never a user's replacement of F.linear.
_ATEN_LINEAR = torch._C._nn.linear


_PROBE_LOCK = threading.Lock()
# thread count -> whether oneDNN was the faster there (timed once per process and thread count)
_MEASURED: dict[int, bool] = {}


def _measure() -> bool:
    # Its own generator, float32 CPU tensors whatever the defaults, and no torch-function modes of the
    # caller's (which would see these calls; dispatch modes: never timed under one): the probe leaves no
    # trace in the user's program.
    generator = torch.Generator().manual_seed(0)
    aten = onednn = 0.0
    with torch.no_grad(), torch._C.DisableTorchFunction():
        for tokens, d_in, d_out in _PROBE_SHAPES:
            x, w, b = (
                torch.randn(*shape, generator=generator, dtype=torch.float32, device="cpu")
                for shape in ((tokens, d_in), (d_out, d_in), (d_out,))
            )
            try:
                runs = library_times(x, w, b, rounds=3)
            except RuntimeError:  # oneDNN without a float32 kernel for this CPU: ATen's linear, as without it
                return False
            aten += min(runs["aten"])
            onednn += min(runs["onednn"])
    return onednn <= _PAYS_BELOW * aten


def library_times(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, rounds: int) -> dict[str, list[float]]:
    """Seconds of ``F.linear`` (ATen: MKL in float32) and of oneDNN's linear on the same arguments, ``rounds``
    times each, interleaved, after one warm-up round of both (the probe and docs/linear_libraries.py)."""
    times: dict[str, list[float]] = {"aten": [], "onednn": []}
    for _ in range(rounds + 1):
        for name, run in (("aten", _ATEN_LINEAR), ("onednn", _onednn)):
            start = time.perf_counter()
            run(x, weight, bias)
            times[name].append(time.perf_counter() - start)
    return {name: t[1:] for name, t in times.items()}


def _introspection_available() -> bool:
    """The private torch functions that tell whether anything observes the ops (checked against torch 2.14);
    a torch without one of them gets F.linear everywhere instead of an error in every forward."""
    try:
        return all(
            callable(f)
            for f in (
                torch._C._get_tracing_state,
                torch._C._functorch.peek_interpreter_stack,
                torch._C._len_torch_dispatch_stack,
                torch._C._len_torch_function_stack,
                torch._C._autograd._top_saved_tensors_default_hooks,
                torch.ops.mkldnn._linear_pointwise,
            )
        ) and isinstance(torch.autograd.forward_ad._current_level, int)
    except (AttributeError, RuntimeError):
        return False


_INTROSPECTION = _introspection_available()


def onednn_pays() -> bool:
    """Whether float32 linear layers run through oneDNN on CPU: never where oneDNN is missing or
    turned off (``torch.backends.mkldnn.flags(enabled=False)``), or where this torch lacks what the checks
    use; else :data:`ONEDNN_LINEAR` when set, else timed on this machine at the current thread count (once per
    process and thread count, ~50 ms)."""
    if not (_INTROSPECTION and torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled):
        return False
    if ONEDNN_LINEAR is not None:
        return ONEDNN_LINEAR
    threads = torch.get_num_threads()
    if threads in _MEASURED:
        return _MEASURED[threads]
    if torch._C._len_torch_dispatch_stack() or torch.compiler.is_compiling():
        return False  # not timed where a FLOP counter or a tracer would see the probe; asked again later
    with _PROBE_LOCK:  # two threads' first calls would time each other
        if threads not in _MEASURED:
            _MEASURED[threads] = _measure()
    return _MEASURED[threads]


def _onednn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, matrix: bool = False) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` by oneDNN, computed on x as a matrix. Eager, the result is not a view in
    autograd's eyes (``_unsafe_view``, as ATen's own matmul returns), so that in-place ops on it stay allowed
    under :class:`_Linear`; ``matrix`` (inside ``torch.compile``): a plain view, the pattern inductor's freezing
    passes expect around oneDNN's linear."""
    out = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), weight, bias, "none", [], "")
    shape = (*x.shape[:-1], weight.shape[0])
    return out.view(shape) if matrix else torch.ops.aten._unsafe_view(out, shape)


class _Linear(torch.autograd.Function):
    """oneDNN's linear with a backward made of oneDNN linears (so that it is differentiable again: a gradient
    penalty's double backward works as with F.linear). Saves what F.linear saves: the input only when the
    weight needs a gradient, the weight only when the input does."""

    @staticmethod
    def forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return _onednn(x, weight, bias)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, weight, bias = inputs
        needs_x, needs_weight = ctx.needs_input_grad[:2]
        ctx.save_for_backward(x if needs_weight else None, weight if needs_x else None)
        ctx.has_bias = bias is not None

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad = grad.contiguous()  # e.g. the stride-0 gradient of a mean
        rows = grad.reshape(-1, grad.shape[-1])
        # The backward runs later, outside the pass: where something now observes aten ops (a FLOP counter
        # around the backward alone) or oneDNN was turned off, F.linear's own backward ops instead.
        onednn = torch.backends.mkldnn.enabled and torch._C._len_torch_dispatch_stack() == 0
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = _Linear.apply(grad, weight.t(), None) if onednn else grad.matmul(weight)
        if ctx.needs_input_grad[1]:
            inputs = x.reshape(-1, x.shape[-1])
            grad_weight = _Linear.apply(rows.t(), inputs.t(), None) if onednn else rows.t().mm(inputs)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = rows.sum(0)
        return grad_x, grad_weight, grad_bias


def _eligible(t: torch.Tensor | None) -> bool:
    return t is None or (
        type(t) in _PLAIN and t.dtype == torch.float32 and t.device.type == "cpu" and t.layout == torch.strided
    )


def _unobserved() -> bool:
    """Nothing would see or change what runs below F.linear: checked when the pass starts and again on every
    call (a user's submodule may enter autocast, a FLOP counter or a transform inside it)."""
    return (
        not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_compiling()
        and torch._C._get_tracing_state() is None
        and torch._C._functorch.peek_interpreter_stack() is None
        and torch.autograd.forward_ad._current_level == -1
        and torch._C._len_torch_dispatch_stack() == 0
        # Saved-tensor hooks: activation checkpointing compares what the forward saved with what its
        # recomputation (outside this pass, on F.linear) saves; offloading hooks expect autograd's own ops.
        and torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    )


class _OneDNNLinear(TorchFunctionMode):
    """F.linear through oneDNN where :func:`_eligible` (with autograd: :class:`_Linear`); every other call,
    unchanged. ``compiled``: inside a function torch.compile traces for inference (where tracing itself is
    what :func:`_unobserved` would refuse)."""

    def __init__(self, compiled: bool = False):
        super().__init__()
        self.compiled = compiled

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear and len(args) + len(kwargs) <= 3:
            call = dict(zip(("input", "weight", "bias"), args, strict=False)) | kwargs
            x, weight, bias = call.get("input"), call.get("weight"), call.get("bias")
            if (
                isinstance(x, torch.Tensor)
                and isinstance(weight, torch.Tensor)
                and (bias is None or isinstance(bias, torch.Tensor))
                and x.dim() >= 2
                and weight.dim() == 2
                and x.shape[-1] == weight.shape[1]
                and x.numel() > 0
                and weight.shape[0] > 0
                and (bias is None or (tuple(bias.shape) == (weight.shape[0],) and bias.is_contiguous()))
                and _eligible(x)
                and _eligible(weight)
                and _eligible(bias)
            ):
                tracked = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias))
                if self.compiled:
                    if not tracked and not torch.is_autocast_enabled("cpu"):
                        return _onednn(x, weight, bias, matrix=True)
                elif _unobserved():
                    return _Linear.apply(x, weight, bias) if tracked else _onednn(x, weight, bias)
        return func(*args, **kwargs)


def _applies(x: torch.Tensor) -> bool:
    # users_code_around: a torch-function mode of the user's would sit below ours and never see F.linear, and a
    # replaced torch.nn.functional function would run twice (a Python one, F.layer_norm, hands our mode the name
    # it finds in torch.nn.functional, the user's function, which our mode would call again).
    from .execution import users_code_around

    return (
        _INTROSPECTION
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and _unobserved()
        and not users_code_around()
        and onednn_pays()
    )


@contextlib.contextmanager
def linear_kernels(x: torch.Tensor) -> Iterator[None]:
    """Around one forward pass on ``x`` (inference or training): float32 linear layers through oneDNN where
    that applies (module docstring); otherwise nothing changes."""
    if not _applies(x):
        yield
        return
    with _OneDNNLinear():
        yield


def compiled_linear_kernels(enabled: bool) -> contextlib.AbstractContextManager:
    """Inside a function that ``torch.compile`` traces (``swin.optimize`` in float32 on CPU, where the caller
    checked :func:`onednn_pays`): the graph calls oneDNN's linear, as eager inference does, instead of the
    MKL-packed sgemm inductor's freezing would choose. ``enabled=False``: nothing changes."""
    return _OneDNNLinear(compiled=True) if enabled else contextlib.nullcontext()
