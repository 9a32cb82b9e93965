"""The fastest inference model for the machine it runs on: :func:`optimize` (``swin.optimize``).

>>> fast = swin.optimize(swin.create_model("swin_t", pretrained=True))  # dtype and compile chosen for the machine
>>> logits = fast(images)  # float32 in, float32 out

What it does, in order of what pays:

- **dtype** (``"auto"``): bfloat16 where the hardware multiplies it (CPUs with AMX-BF16 or AVX512-BF16, CUDA
  devices with bf16; float16 on older CUDA devices), float32 elsewhere: on a CPU without bf16 arithmetic (AVX2
  only) a bf16 matmul runs about 8x slower than float32. The weights are cast in place; inputs are cast to that
  dtype and outputs back to the input's dtype, so the caller keeps passing float32 images; the same for the
  model's ``forward_features``, ``forward_head`` and ``forward_intermediates`` called on the optimized model
  (those run eager).
- **compile** (``True``): ``torch.compile`` with inductor's ``freezing``: the weights become constants of the
  graph, so linear weights are pre-packed (MKL or oneDNN on CPU) and pointwise work (bias + GELU, residual
  adds, LayerNorm) fuses into generated kernels. In float32 on a CPU where oneDNN's GEMM is the faster one (as
  in eager inference, :mod:`swin.layers.linear_kernel`), the graph calls oneDNN's linear on the frozen weights
  instead of the MKL-packed sgemm inductor would choose. Compiling happens on the first call for each input shape, never
  on import; its time is in :attr:`OptimizedModel.compile_seconds` (with freezing, inductor bypasses its FX
  graph cache, so each process compiles again; its C++ kernel cache still shortens that). Before compiling a
  shape, one image runs eagerly to pin the window plans of that size, which the graph then holds as constants
  (the shift masks folded into the attention bias). Reading them fixes the size, so each new input shape
  compiles a graph of its own: give one optimized model one input shape, or few.

Not done here, because it is the whole process's choice: with glibc's malloc (Linux), the memory a call at
batch 8 or at detection sizes frees can go back to the OS, and later calls fault it in again page by page,
eager and compiled, ours and the peers alike (docs/PERFORMANCE.md, "memory handed back between calls").
Starting Python with ``MALLOC_MMAP_THRESHOLD_=1000000000 MALLOC_TRIM_THRESHOLD_=1000000000`` (both: setting
one turns off glibc's adjustment of the other; a glibc that caps the mmap threshold at 32 MiB needs
``33554432``) or with jemalloc or tcmalloc preloaded keeps it in the process; ``swin bench`` names the
allocator it started with and counts page faults per call.

Freezing copies the weights into the compiled graph, so the compiled graph would go stale when they change.
:class:`OptimizedModel` compares every parameter's and buffer's identity, storage and version counter before
each call and compiles again after any change (an optimizer step, ``load_state_dict``, ``copy_``, ``.to()``);
weights made under ``torch.inference_mode()``, which have no version counter, are replaced by ordinary copies
when it builds.
Writes through ``.data`` bypass version counters by design (torch's own autograd cannot see them either); after
such a write call :meth:`OptimizedModel.refresh`. Hooks and wrappers a user adds to submodules are seen: a
model holding any forward hook, or a module that is not ours or torch's, runs uncompiled (hooks must see every
call) unless ``compile="force"``.
"""

from __future__ import annotations

import collections
import functools
import itertools
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map_only

from .layers.execution import functional_patched, plain, splittable
from .layers.linear_kernel import compiled_linear_kernels, onednn_pays
from .layers.window import pinning_window_plans, unpin_window_plans

__all__ = ["FrozenCompiled", "OptimizedModel", "cpu_features", "fastest_dtype", "optimize"]

_BUILDS = itertools.count()
# The model's forward-like methods besides forward: reached through an OptimizedModel they take and return the
# caller's dtype as a call does (timm's interface; a model without one of them still says so itself).
_FORWARD_METHODS = ("forward_features", "forward_head", "forward_intermediates")
_DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def cpu_features() -> dict[str, Any]:
    """What this CPU has, from torch's own detection (``torch.cpu.get_capabilities``): ``name``, ``isa``
    (AVX2 / AVX512 / ..., the kernels ATen picked), ``avx2``, ``avx512``, ``avx512_bf16``, ``amx_bf16``,
    ``cores``."""
    caps: dict[str, Any] = {}
    getter = getattr(torch.cpu, "get_capabilities", None)
    if getter is not None:
        caps = dict(getter())
    return {
        "name": caps.get("cpu_name") or "unknown CPU",
        "isa": torch.backends.cpu.get_cpu_capability(),
        "avx2": bool(caps.get("avx2")),
        "avx512": bool(caps.get("avx512_f")),
        "avx512_bf16": bool(caps.get("avx512_bf16")),
        "amx_bf16": bool(caps.get("amx_bf16")),
        "cores": caps.get("num_physical_cores"),
    }


def fastest_dtype(device: str | torch.device = "cpu", features: dict[str, Any] | None = None) -> torch.dtype:
    """The dtype inference runs fastest in on ``device``: bfloat16 on CPUs with AMX-BF16 or AVX512-BF16 and on
    CUDA devices with bf16 arithmetic (compute capability 8.0 and later), float16 on older CUDA devices (where
    bf16 would be emulated), float32 elsewhere. ``features``: a :func:`cpu_features` result to decide from
    (default: this machine's)."""
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"{device} was asked for but no CUDA device is available")
        return torch.bfloat16 if torch.cuda.get_device_capability(device) >= (8, 0) else torch.float16
    if device.type == "cpu":
        features = features if features is not None else cpu_features()
        return torch.bfloat16 if features["amx_bf16"] or features["avx512_bf16"] else torch.float32
    return torch.float32


def _resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        chosen = dtype
    elif dtype in _DTYPES:
        chosen = _DTYPES[dtype] or fastest_dtype(device)
    else:
        raise ValueError(f"dtype must be 'auto', 'float32', 'bfloat16', 'float16' or a torch.dtype, got {dtype!r}")
    if chosen not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"dtype must be a floating point type torch computes Swin in, got {chosen}")
    if chosen == torch.float16 and device.type == "cpu":
        raise ValueError("float16 is for CUDA; on CPU use dtype='auto' (bfloat16 where the CPU has it)")
    return chosen


def _quantized_module(model: nn.Module) -> str | None:
    """A description of the first quantized module of ``model`` (``torch.ao.quantization.quantize_dynamic``'s
    linears and the like), or None."""
    for name, module in model.named_modules():
        if type(module).__module__.startswith(("torch.ao.nn.quantized", "torch.nn.quantized")):
            return f"{name or 'the model'} ({type(module).__module__}.{type(module).__name__})"
    return None


def _state_tensors(model: nn.Module) -> list[torch.Tensor]:
    """Every parameter and buffer, by one walk over the modules' own tables (a shared tensor is listed once per
    module holding it): checked before every call, so not ``parameters()`` and ``buffers()``, which walk twice
    and deduplicate."""
    return [
        t
        for module in model.modules()
        for table in (module._parameters, module._buffers)
        for t in table.values()
        if t is not None
    ]


def _state_signature(tensors: list[torch.Tensor]) -> tuple:
    """What freezing depends on: each parameter's and buffer's identity, storage, version, dtype and device.
    (The caller holds the tensors of the signature it compiled for, so no id or address in it can be reused by
    a new tensor. Inference tensors have no version counter: :func:`_versioned` replaces them before a build.)"""
    return tuple((id(t), t.data_ptr(), -1 if t.is_inference() else t._version, t.dtype, t.device) for t in tensors)


def _versioned(model: nn.Module) -> None:
    """Replace inference tensors among the weights (a model built or loaded under ``torch.inference_mode()``)
    with ordinary copies, whose version counters see in-place changes (``load_state_dict``, ``mul_``), so the
    frozen graph cannot go stale unseen. Parameters stay parameters, with their ``requires_grad``."""
    with torch.inference_mode(False):
        for module in model.modules():
            for table in (module._parameters, module._buffers):
                for name, t in table.items():
                    if t is not None and t.is_inference():
                        copy = t.clone()
                        table[name] = nn.Parameter(copy, t.requires_grad) if isinstance(t, nn.Parameter) else copy


def _compilable(model: nn.Module) -> bool:
    """No forward hooks on or below ``model`` and only our modules and torch's own layers (the execution
    layer's rule for chunking, :func:`swin.layers.execution.plain`): a hook or a user's module (a LoRA adapter,
    a quantized linear) must see every call as written."""
    return not (model._forward_hooks or model._forward_pre_hooks) and plain(model)


def _map_tensors(out: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``fn`` on every tensor of a model's output (a tensor, or lists, tuples and dicts of them)."""
    return tree_map_only(torch.Tensor, fn, out)


def _recompile_limit() -> int:
    """How many graphs dynamo keeps per function (``recompile_limit``; ``cache_size_limit`` before torch 2.6)."""
    config = torch._dynamo.config
    return getattr(config, "recompile_limit", None) or getattr(config, "cache_size_limit", 8)


class _NeverRaised(Exception):
    pass


@functools.cache
def _limit_hit() -> tuple[type[BaseException], ...]:
    """What a call past that limit raises under fullgraph=True (its name before torch 2.6 too; torch versions
    without either run such calls eager themselves)."""
    import torch._dynamo.exc

    names = ("FailOnRecompileLimitHit", "FailOnCacheLimitHit")
    return tuple(getattr(torch._dynamo.exc, name) for name in names if hasattr(torch._dynamo.exc, name)) or (
        _NeverRaised,
    )


class FrozenCompiled(nn.Module):
    """``torch.compile(model)`` whose graphs are compiled with inductor's ``freezing`` on (set while it runs:
    in torch 2.14 ``torch.compile(options={"freezing": True})`` does not freeze). Frozen weights are copies:
    :class:`OptimizedModel` rebuilds this when the weights change. Call it under ``torch.no_grad()``.
    ``onednn_linear``: float32 linear layers through oneDNN in the graph
    (:func:`swin.layers.linear_kernel.compiled_linear_kernels`)."""

    def __init__(self, model: nn.Module, mode: str | None = None, onednn_linear: bool = False):
        super().__init__()
        self.model = model

        def run(x: torch.Tensor) -> Any:
            with compiled_linear_kernels(onednn_linear):
                return model(x)

        # Dynamo keeps compiled graphs per code object and would serve the previous, stale frozen graph to a
        # new torch.compile of the same model (its guards do not look at weight values); each build gets a
        # code object of its own, so its graphs are new, and are freed with it.
        run.__code__ = run.__code__.replace(co_name=f"frozen_swin_{next(_BUILDS)}")
        # One graph, or an error: after a graph break the frames dynamo resumes in are the model's own, shared
        # by every build, and their graphs (with the weights frozen into them) would outlive a rebuild.
        self.compiled = torch.compile(run, mode=mode, fullgraph=True, dynamic=False)

    def forward(self, x: torch.Tensor) -> Any:
        import torch._inductor.config as inductor_config

        with inductor_config.patch(freezing=True):
            return self.compiled(x)


class OptimizedModel(nn.Module):
    """Inference wrapper made by :func:`optimize`; ``self.model`` is the model itself (its weights cast to
    :attr:`dtype`), so a weight update on it is seen (see the module docstring for how)."""

    def __init__(self, model: nn.Module, compile: bool | str, mode: str | None):
        super().__init__()
        self.model = model
        self.compile_mode = compile
        self.mode = mode
        self._warned = False
        self._warned_shapes = False
        self._eager_shapes: set[tuple[int, ...]] = set()  # shapes past the recompile limit: run eager
        self.compile_seconds: dict[tuple[int, ...], float] = {}  # input shape -> seconds its first call took
        self._compiled: Callable | None = None
        self._signature: tuple | None = None
        self._held: list[torch.Tensor] = []
        self._lock = threading.RLock()

    def __getstate__(self) -> dict:
        """Copies and pickles leave the compiled graph and the lock behind (derived state): a copy compiles on
        its first call, for its own weights."""
        state = dict(
            super().__getstate__(),
            _compiled=None,
            _signature=None,
            _held=[],
            compile_seconds={},
            _warned_shapes=False,
            _eager_shapes=set(),
        )
        state.pop("_lock", None)
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._lock = threading.RLock()

    def refresh(self) -> None:
        """Compile again on the next call (after writes through ``.data``, which version counters miss)."""
        self._compiled = None
        self._signature = None
        self._held = []
        self.compile_seconds.clear()
        self._warned_shapes = False
        self._eager_shapes = set()
        unpin_window_plans(self.model)  # the next build pins what it needs, on the device the weights are on now

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the model computes in (its weights'; follows a later ``.to(dtype)``)."""
        parameter = next(self.model.parameters(), None)
        return parameter.dtype if parameter is not None else torch.float32

    def __getattr__(self, name: str) -> Any:
        """The model's own attributes (``num_classes``, ``pretrained_cfg``, ``feature_info``, ...); its
        ``forward_features``, ``forward_head`` and ``forward_intermediates`` cast as a call does (see
        :meth:`_eager_method`)."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "model":
                raise
            attribute = getattr(self.model, name)
            if name in _FORWARD_METHODS and callable(attribute):
                return self._eager_method(name, attribute)
            return attribute

    def _eager_method(self, name: str, method: Callable) -> Callable:
        """``method`` of the model taking the caller's dtype as a call does: its tensor argument cast to the
        weights' dtype, its outputs back to that argument's float dtype, without autograd. Eager, always: the
        compiled graph is the model's ``forward``, so nothing frozen can go stale here, and hooks on submodules
        see every call."""

        @functools.wraps(method)
        def run(x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"{name} takes a torch.Tensor as its first argument, got {type(x).__name__}")
            self._one_dtype()
            x, cast = self._cast_input(x)
            with torch.no_grad():
                return _map_tensors(method(x, *args, **kwargs), cast)

        return run

    def _cast_input(self, x: torch.Tensor) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
        """``x`` in the weights' dtype, and the cast of outputs back to its float dtype (float32 for integer
        images), so that callers keep passing and receiving float32 whatever the model computes in."""
        out_dtype = x.dtype if x.is_floating_point() else torch.float32

        def cast(t: torch.Tensor) -> torch.Tensor:
            return t.to(out_dtype) if t.is_floating_point() else t

        return x.to(self.dtype), cast

    @property
    def pretrained_cfg(self) -> dict:
        """The model's (set on it too: ``swin.data_config`` and timm read the same values from either)."""
        return self.model.pretrained_cfg

    @pretrained_cfg.setter
    def pretrained_cfg(self, values: dict | None) -> None:
        self.model.pretrained_cfg = values

    def train(self, mode: bool = True) -> OptimizedModel:
        """Stays in eval mode: it runs without autograd, possibly on bf16 and frozen weights. To train, train
        the model itself (``.model``) and optimize it again afterwards."""
        if mode:
            warnings.warn(
                "an optimized model is for inference and stays in eval mode; train its .model and call "
                "swin.optimize again afterwards",
                stacklevel=2,
            )
        return super().train(False)

    @property
    def compiled(self) -> bool:
        """Whether calls run compiled now (False when hooks or foreign modules keep the model eager)."""
        return self.compile_mode == "force" or (bool(self.compile_mode) and _compilable(self.model))

    def _one_dtype(self) -> None:
        """Weights of one dtype: a module assigned after optimize (``model.head = nn.Linear(...)``) keeps its own
        and failed inside the first matmul; it is cast to the dtype the rest of the model computes in, as
        optimize cast the model."""
        dtypes = collections.Counter(p.dtype for p in self.model.parameters() if p.is_floating_point())
        if len(dtypes) > 1:
            with torch.inference_mode(False):
                self.model.to(dtypes.most_common(1)[0][0])

    def _eager_beyond_the_shapes(self, x: torch.Tensor, cast: Callable, reason: str) -> Any:
        """The call eager (in the model's dtype), where one more compiled shape would pass torch's recompile
        limit; said once."""
        if not self._warned_shapes:
            self._warned_shapes = True
            warnings.warn(
                f"swin.optimize: {reason}: calls of other shapes run eager ({self.dtype}, slower). Resize or pad "
                "images to a few sizes, raise torch._dynamo.config.recompile_limit, or call .refresh() to compile "
                "anew",
                stacklevel=3,
            )
        return _map_tensors(self.model(x), cast)

    def forward(self, x: torch.Tensor) -> Any:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"expected a torch.Tensor of images (B, C, H, W), got {type(x).__name__}")
        self._one_dtype()
        x, cast = self._cast_input(x)
        with torch.no_grad():
            if not self.compiled:
                if self.compile_mode and not self._warned:
                    self._warned = True
                    warnings.warn(
                        "swin.optimize: running eager, not compiled: the model has forward hooks or modules "
                        "other than swin's and torch's, which must see every call (compile='force' compiles "
                        "anyway)",
                        stacklevel=2,
                    )
                return _map_tensors(self.model(x), cast)
            # The weights, and which library runs float32 linear layers (settings and thread count can change).
            # (not with a torch.nn.functional function replaced: the graph's linear mode would call it twice)
            onednn = (
                self.dtype == torch.float32 and x.device.type == "cpu" and not functional_patched() and onednn_pays()
            )
            with self._lock:  # one build at a time; another thread's call waits for it rather than compiling too
                tensors = _state_tensors(self.model)
                signature = (_state_signature(tensors), onednn)
                if self._compiled is None or signature != self._signature:
                    self.refresh()
                    _versioned(self.model)
                    tensors = _state_tensors(self.model)
                    # not a submodule: the state dict and .modules() stay the model's own, once
                    object.__setattr__(self, "_compiled", FrozenCompiled(self.model, self.mode, onednn))
                    self._signature = (_state_signature(tensors), onednn)
                    self._held = tensors  # their ids and addresses stay theirs while the signature names them
                compiled = self._compiled
                key = tuple(x.shape)
                start = time.perf_counter()
                first = key not in self.compile_seconds
                if key in self._eager_shapes:
                    return self._eager_beyond_the_shapes(x, cast, "")
                if first and len(self.compile_seconds) >= _recompile_limit():  # each shape is one graph entry
                    self._eager_shapes.add(key)
                    return self._eager_beyond_the_shapes(
                        x, cast, f"{len(self.compile_seconds)} input shapes are compiled, torch's recompile limit"
                    )
                if first and not self.model.training and _compilable(self.model) and splittable(self.model):
                    # One eager image first, so that the window plans of this size (index tensors, shift masks)
                    # are pinned and the compiled graph reads them as constants, which freezing folds. (Not where
                    # a hook would see the extra call, nor in training mode, where it would draw random numbers, nor
                    # where a BatchNorm normalizes by the batch's statistics: one image is not the batch.)
                    with pinning_window_plans():
                        self.model(x[:1])
                if first:  # the first call of a shape compiles it: under the lock
                    try:
                        out = compiled(x)
                    except _limit_hit():  # other strides or dtypes took the entries
                        self._eager_shapes.add(key)
                        return self._eager_beyond_the_shapes(x, cast, "torch's recompile limit is reached")
                    except torch._dynamo.exc.Unsupported as error:
                        self.refresh()
                        raise RuntimeError(
                            "swin.optimize: the model does not compile as one graph "
                            f"({str(error).splitlines()[0]}), which frozen weights need so that a weight update "
                            "reaches every compiled part; use compile=True (models holding modules of your own or "
                            "hooks then run eager) or compile=False"
                        ) from error
                    self.compile_seconds[key] = time.perf_counter() - start
            if not first:
                try:
                    out = compiled(x)
                except _limit_hit():  # a known shape in another stride or dtype
                    return self._eager_beyond_the_shapes(x, cast, "torch's recompile limit is reached")
        if self.mode == "reduce-overhead":  # CUDA graphs reuse their output buffers on the next call
            out = _map_tensors(out, torch.Tensor.clone)
        return _map_tensors(out, cast)


def optimize(
    model: nn.Module,
    dtype: str | torch.dtype = "auto",
    compile: bool | str = True,
    mode: str | None = None,
) -> OptimizedModel:
    """The fastest inference version of ``model`` on the device its weights are on (see the module docstring).

    Args:
        model: a swin model (or any module); put it on its device first. It is switched to eval mode and its
            weights are cast to ``dtype`` in place.
        dtype: ``"auto"`` (:func:`fastest_dtype`; float32 for a model holding quantized modules, whose kernels
            take float32), ``"float32"``, ``"bfloat16"``, ``"float16"`` (CUDA) or a ``torch.dtype``.
        compile: ``True``: ``torch.compile`` with freezing, unless forward hooks or modules other than ours and
            torch's are present (then eager, so they see every call); ``"force"``: compile anyway (as one
            graph: a module that breaks it is an error); ``False``: eager in ``dtype``.
        mode: ``torch.compile`` mode (``None``, ``"max-autotune"``, ``"reduce-overhead"`` for CUDA graphs).

    Returns:
        An :class:`OptimizedModel`: call it with images in any dtype; outputs come back in the input's float
        dtype (float32 for integer images). Each input shape compiles on its first call, up to torch's
        recompile limit (``torch._dynamo.config.recompile_limit``); further shapes run eager, with a warning.
        Float32 eager is bit-exact, float32 compiled within ~1e-5 of eager; bf16 logits are within ~1e-2
        relative error of float32.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"swin.optimize takes a torch.nn.Module, got {type(model).__name__}")
    if isinstance(model, OptimizedModel):
        raise TypeError("this model is already optimized; pass its .model to optimize it again")
    if compile not in (True, False, "force"):
        raise ValueError(f"compile must be True, False or 'force', got {compile!r}")
    parameter = next(model.parameters(), None)
    device = parameter.device if parameter is not None else torch.device("cpu")
    quantized = _quantized_module(model)
    chosen = torch.float32 if quantized and dtype == "auto" else _resolve_dtype(dtype, device)
    if quantized and chosen != torch.float32:
        raise ValueError(
            f"{quantized} is a quantized module, whose int8 kernels take float32 activations: it cannot run in "
            f"{chosen}; pass dtype='float32' (or 'auto', which keeps float32 for quantized models)"
        )
    with torch.inference_mode(False):  # weights made here stay usable (and versioned) outside inference mode
        model.eval().to(chosen)
    return OptimizedModel(model, compile, mode).eval()
