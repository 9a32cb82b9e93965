"""swin.optimize: the dtype each machine computes fastest in, exact float32, bf16 within 1e-2 of float32, and a
compiled (frozen) model that follows weight updates and leaves hooks and users' modules alone. Expected values
come from timm's model with the same weights."""

from __future__ import annotations

import copy

import pytest
import torch

import swin
from swin.optimized import OptimizedModel, cpu_features, fastest_dtype
from swin.weights import convert

from .conftest import timm_pair

AVX2 = {"name": "x", "isa": "AVX2", "avx2": True, "avx512": False, "avx512_bf16": False, "amx_bf16": False}


def relative_error(output: torch.Tensor, reference: torch.Tensor) -> float:
    return ((output.float() - reference).norm() / reference.norm()).item()


@pytest.fixture(scope="module")
def pair():
    """(timm, ours) with the same random weights: swin_t's widths, one block per stage."""
    return timm_pair("swin_t", depths=(1, 1, 1, 1))


def test_dtype_follows_the_hardware(monkeypatch):
    assert fastest_dtype("cpu", AVX2) == torch.float32  # bf16 is emulated there, ~8x slower
    assert fastest_dtype("cpu", {**AVX2, "avx512": True, "amx_bf16": True}) == torch.bfloat16
    assert fastest_dtype("cpu", {**AVX2, "avx512": True, "avx512_bf16": True}) == torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    capability = {"cuda": (9, 0), "cuda:1": (7, 0)}  # an H100, and a V100 in the second slot
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d: capability[str(d)])
    assert fastest_dtype("cuda") == torch.bfloat16
    assert fastest_dtype("cuda:1") == torch.float16  # bf16 there would be emulated
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="no CUDA device is available"):
        fastest_dtype("cuda")
    # this machine's answer agrees with what its CPU reports
    here = cpu_features()
    assert fastest_dtype("cpu") == (torch.bfloat16 if here["amx_bf16"] or here["avx512_bf16"] else torch.float32)


def test_float32_eager_is_exact_and_keeps_the_callers_dtype(pair):
    reference, ours = pair
    fast = swin.optimize(ours, dtype="float32", compile=False)
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        expected, eager = reference(x), ours(x)
    out = fast(x)
    assert out.dtype == torch.float32 and torch.equal(out, eager)
    assert (out - expected).abs().max().item() <= 1e-4


def test_bf16_logits_within_1e2_of_float32(pair):
    reference, _ = pair
    ours = swin.create_model("swin_t", depths=(1, 1, 1, 1))
    ours.load_state_dict(convert(reference.state_dict(), source="timm"))
    fast = swin.optimize(ours, dtype=torch.bfloat16, compile=False)
    assert next(ours.parameters()).dtype == torch.bfloat16  # cast in place: the optimized model is the model
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        expected = reference(x)
    out = fast(x)
    assert out.dtype == torch.float32
    assert relative_error(out, expected) <= 1e-2


@pytest.fixture(scope="module")
def frozen():
    """(timm, ours, ours optimized with a frozen compiled graph, input, its first output, oneDNN linear calls
    traced). One stage of a
    regular and a shifted block (whose window plan and shift mask swin.optimize pins, so that they are frozen
    into the graph); the first compile in a process takes ~20 s on two cores whatever the model's size
    (inductor's start-up and its C++ compiles). Float32 linear layers on oneDNN (chosen here instead of timed,
    see swin.layers.linear_kernel), so that the graph calls it on every machine; ``traced`` counts the calls
    dynamo traced."""
    from swin.layers import linear_kernel

    reference, ours = timm_pair("swin_t", shape={"depths": (2,), "num_heads": (3,)})
    fast = swin.optimize(ours, dtype="float32", compile="force")
    x = torch.randn(2, 3, 224, 224)
    traced = []
    original, chosen = linear_kernel._onednn, linear_kernel.ONEDNN_LINEAR

    def spy(*args, **options):
        traced.append(torch.compiler.is_compiling())
        return original(*args, **options)

    linear_kernel._onednn, linear_kernel.ONEDNN_LINEAR = spy, True
    try:
        with torch.inference_mode():  # as swin bench and swin validate call it (the update test below: no_grad)
            first = fast(x)
    finally:
        linear_kernel._onednn, linear_kernel.ONEDNN_LINEAR = original, chosen
    return reference, ours, fast, x, first, sum(traced)


def test_compiled_with_freezing_matches_timm(frozen):
    reference, _, fast, x, first, traced = frozen
    with torch.no_grad():
        assert (first - reference(x)).abs().max().item() <= 1e-4
    assert list(fast.compile_seconds) == [(2, 3, 224, 224)]
    assert traced == 2 * 4 + 1  # the graph calls oneDNN for the blocks' four linear layers each, and the head


def test_compiled_bf16_matches_timm_float32(monkeypatch):
    """The compiled bf16 path: pinned window plans frozen into the graph (the shift mask folded into the bias)
    and, on CPU without the fused kernel (a CPU without AVX512-BF16; here turned off), attention as two matmuls
    and a softmax instead of SDPA (swin.layers.execution): logits within 1e-2 relative error of timm's in
    float32, as eager bf16 (with the kernel: tests/layers/test_window_kernel.py). Per-token logits (no
    pooling), and position biases large enough to matter (at their initial std of 0.02, leaving the bias out
    changes pooled logits by 2e-3); leaving out the bias or the shift mask fails this test."""
    shape = {"depths": (2,), "num_heads": (2,), "embed_dim": 64, "global_pool": "", "num_classes": 16}
    # 112 pixels: a 28x28 map of 4x4 windows, 7 of 16 of them on the seam the shift mask cuts
    reference, ours = timm_pair("swin_t", shape=shape, position_bias_std=5.0, img_size=112)
    fast = swin.optimize(ours, dtype="bfloat16", compile="force")
    from swin.layers import execution, window_kernel

    monkeypatch.setattr(window_kernel, "ENABLED", False)
    traced = []  # the matmul path, seen while dynamo traces it (once per block)
    matmul_attention = execution._matmul_attention
    monkeypatch.setattr(execution, "_matmul_attention", lambda *a: traced.append(1) or matmul_attention(*a))
    x = torch.randn(2, 3, 112, 112)
    with torch.no_grad():
        expected = reference(x).permute(0, 3, 1, 2)  # timm keeps per-token logits NHWC, ours are NCHW
    assert relative_error(fast(x), expected) <= 1e-2
    assert len(traced) >= 2, "attention did not take the matmul path"


def test_frozen_graph_follows_weight_updates(frozen):
    """Freezing copies the weights into the graph; a step that changes them in place (as an optimizer,
    ``load_state_dict``'s ``copy_`` or an EMA update do) makes the next call build the graph again."""
    reference, ours, fast, x, first, _ = frozen
    built = fast._compiled
    with torch.no_grad():
        ours.head.weight.mul_(-2)
        reference.head.fc.weight.mul_(-2)
        assert (fast(x) - reference(x)).abs().max().item() <= 1e-4
    assert fast._compiled is not built and len(fast.compile_seconds) == 1  # rebuilt, and timed again


def test_hooks_and_users_modules_keep_it_eager(pair):
    _, ours = pair
    fast = swin.optimize(ours, dtype="float32")
    assert fast.compiled
    seen = []
    handle = ours.layers[1].blocks[0].mlp.register_forward_hook(lambda m, a, out: seen.append(out.shape))
    assert not fast.compiled
    with pytest.warns(UserWarning, match="running eager, not compiled"):
        fast(torch.randn(1, 3, 224, 224))
    assert seen == [torch.Size([1, 28, 28, 192])]
    handle.remove()

    class Scaled(torch.nn.Module):  # a user's wrapper, e.g. an adapter
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return 2 * self.inner(x)

    mlp = ours.layers[0].blocks[0].mlp
    mlp.fc2 = Scaled(mlp.fc2)
    assert not fast.compiled
    mlp.fc2 = mlp.fc2.inner  # the shared model as it was


def test_clear_errors(pair):
    _, ours = pair
    with pytest.raises(ValueError, match="dtype must be"):
        swin.optimize(ours, dtype="int8")
    with pytest.raises(ValueError, match="float16 is for CUDA"):
        swin.optimize(ours, dtype="float16")
    with pytest.raises(ValueError, match="compile must be"):
        swin.optimize(ours, compile="yes")
    fast = swin.optimize(ours, dtype="float32", compile=False)
    with pytest.raises(TypeError, match="already optimized"):
        swin.optimize(fast)
    with pytest.warns(UserWarning, match="for inference and stays in eval mode"):
        torch.nn.Sequential(fast).train()  # e.g. a parent module switched to training
    assert isinstance(fast, OptimizedModel) and not fast.training and not ours.training
    assert fast.num_classes == ours.num_classes and fast.pretrained_cfg == ours.pretrained_cfg  # the model's own
    fast.pretrained_cfg = {"crop_pct": 1.0}  # set through the wrapper: on the model
    assert ours.pretrained_cfg["crop_pct"] == 1.0 == swin.data_config(fast.model)["crop_pct"]
    ours.pretrained_cfg = None
    assert fast(torch.zeros(1, 3, 224, 224, dtype=torch.uint8)).dtype == torch.float32


def test_create_model_can_return_it():
    fast = swin.create_model("swin_t", depths=(1,), num_heads=(3,), optimize="float32")
    assert isinstance(fast, OptimizedModel) and fast.dtype == torch.float32 and fast.compile_mode is True
    assert fast.compile_seconds == {}  # nothing compiled before the first call
    assert swin.create_model("swin_t", depths=(1,), num_heads=(3,), optimize=True).dtype == fastest_dtype("cpu")


def test_backbone_levels_come_back_in_the_callers_dtype():
    """A backbone's four levels through optimize (bf16 weights, eager): each float32 again and within bf16
    error of the float32 backbone's (transformers' SwinBackbone is checked equal to ours elsewhere)."""
    torch.manual_seed(0)
    reference = swin.create_model("swin_t", features_only=True, depths=(1, 1, 1, 1)).eval()
    ours = swin.create_model("swin_t", features_only=True, depths=(1, 1, 1, 1))
    ours.load_state_dict(reference.state_dict())
    fast = swin.optimize(ours, dtype="bfloat16", compile=False)
    x = torch.randn(1, 3, 256, 320)
    with torch.no_grad():
        expected = reference(x)
    levels = fast(x)
    assert isinstance(levels, list) and len(levels) == 4
    for level, want in zip(levels, expected, strict=True):
        assert level.dtype == torch.float32 and level.shape == want.shape
        assert relative_error(level, want) <= 2e-2


def test_weight_signature_sees_every_kind_of_change():
    """What decides a rebuild of the frozen graph, checked before every call: in-place updates, a replaced
    parameter or buffer (``load_state_dict(assign=True)``, a user's assignment), ``.data`` replaced, a dtype
    change; nothing else."""
    from swin.optimized import _state_signature, _state_tensors

    model = swin.create_model("swin_t", depths=(2,), num_heads=(3,)).eval()
    block = model.layers[0].blocks[0]
    signature = _state_signature(_state_tensors(model))
    assert _state_signature(_state_tensors(model)) == signature
    assert len(signature) >= len(list(model.parameters())) + len(list(model.buffers()))
    changes = [
        lambda: block.mlp.fc1.weight.add_(0.0),  # in place: the version counter moves, the values need not
        lambda: setattr(block.mlp.fc2, "bias", torch.nn.Parameter(block.mlp.fc2.bias.detach().clone())),
        lambda: setattr(block.norm1.weight, "data", block.norm1.weight.detach().clone()),
        lambda: model.head.to(torch.float64),
    ]
    name, buffer = next(iter(block.attn.named_buffers(recurse=False)), (None, None))
    if buffer is not None:
        changes.append(lambda: block.attn.register_buffer(name, buffer.clone(), persistent=False))
    for change in changes:
        with torch.no_grad():
            change()
        now = _state_signature(_state_tensors(model))
        assert now != signature
        signature = now


class _CopyingCompiled(torch.nn.Module):
    """Stands in for FrozenCompiled without compiling: it copies the model when built, as freezing copies the
    weights into the graph, so a call that is not rebuilt after a weight change answers with the old weights."""

    builds = 0

    def __init__(self, model, mode=None, onednn_linear=False):
        super().__init__()

        type(self).builds += 1
        self.frozen = copy.deepcopy(model)

    def forward(self, x):
        return self.frozen(x)


def test_weights_made_under_inference_mode_are_followed(monkeypatch):
    """A model built (or loaded) under ``torch.inference_mode()`` has inference tensors as weights, which have
    no version counter: an in-place update there (``load_state_dict``, ``mul_``) must still reach the frozen
    graph. Expected: timm's model given the same update."""
    import swin.optimized as optimized

    monkeypatch.setattr(optimized, "FrozenCompiled", _CopyingCompiled)
    with torch.inference_mode():
        reference, ours = timm_pair("swin_t", depths=(1, 1, 1, 1))
        fast = swin.optimize(ours, dtype="float32", compile="force")
        x = torch.randn(1, 3, 224, 224)
        first = fast(x)
        assert (first - reference(x)).abs().max().item() <= 1e-4
        ours.head.weight.mul_(-2)
        reference.head.fc.weight.mul_(-2)
        second = fast(x)
        assert (second - reference(x)).abs().max().item() <= 1e-4
        ours.load_state_dict(convert(timm_pair("swin_t", depths=(1, 1, 1, 1))[0].state_dict(), source="timm"))
        assert (fast(x) - first).abs().max().item() <= 1e-4  # the first weights again
    assert _CopyingCompiled.builds == 3
    assert not any(t.is_inference() for t in [*ours.parameters(), *ours.buffers()])
    assert all(isinstance(p, torch.nn.Parameter) for _, p in ours.named_parameters())


def test_copies_and_bad_input(monkeypatch):
    """A copy or a pickle of an optimized model carries the model, not the compiled graph of the original's
    weights (nor its lock); a non-tensor input is refused with the message the model itself gives."""
    import io

    import swin.optimized as optimized

    monkeypatch.setattr(optimized, "FrozenCompiled", _CopyingCompiled)
    fast = swin.optimize(swin.create_model("swin_t", depths=(1,), num_heads=(3,), num_classes=5), dtype="float32")
    x = torch.randn(1, 3, 64, 64)
    fast(x)
    twin = copy.deepcopy(fast)
    assert twin._compiled is None and twin.compile_seconds == {}
    with torch.no_grad():
        twin.model.head.weight.mul_(-1)
        assert torch.equal(twin(x), twin.model(x))
    buffer = io.BytesIO()
    torch.save(fast, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    with torch.no_grad():
        assert torch.equal(loaded(x), fast.model(x))
    with pytest.raises(TypeError, match="expected a torch.Tensor of images"):
        fast(x.numpy())


def test_force_refuses_a_graph_break():
    """Frozen weights need one graph: after a graph break dynamo resumes in the model's own frames, whose graphs
    every rebuild would share, weights frozen in. A user's module that breaks the graph is an error under
    compile='force' (compile=True runs such a model eager)."""

    class Breaking(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            torch._dynamo.graph_break()
            return self.inner(x)

    model = swin.create_model("swin_t", depths=(1,), num_heads=(3,), num_classes=5)
    model.head = Breaking(model.head)
    fast = swin.optimize(model, dtype="float32", compile="force")
    with pytest.raises(RuntimeError, match="does not compile as one graph"):
        fast(torch.randn(1, 3, 64, 64))
    assert fast._compiled is None


def test_forward_methods_take_and_return_the_callers_dtype():
    """The model's forward_features, forward_head and forward_intermediates reached through the wrapper cast as
    a call does: inputs to the weights' bf16, outputs back to the input's float32 (eager, with the weights as
    they are now). Expected: the float32 model's own methods, within bf16 error."""
    torch.manual_seed(0)
    reference = swin.create_model("swin_t", depths=(1, 1, 1, 1)).eval()
    ours = swin.create_model("swin_t", depths=(1, 1, 1, 1))
    ours.load_state_dict(reference.state_dict())
    fast = swin.optimize(ours, dtype="bfloat16", compile=False)
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        features = reference.forward_features(x)
        expected = [
            features,
            reference.forward_head(features, pre_logits=True),
            reference.forward_head(features),
            *reference.forward_intermediates(x, indices=2, norm=True)[1],
        ]
    final, intermediates = fast.forward_intermediates(x, indices=2, norm=True)
    got = [fast.forward_features(x), fast.forward_head(features, pre_logits=True), fast.forward_head(features)]
    assert len(intermediates) == 2 and torch.equal(final, got[0])
    for output, want in zip([*got, *intermediates], expected, strict=True):
        assert output.dtype == torch.float32 and output.shape == want.shape and not output.requires_grad
        assert relative_error(output, want) <= 1e-2
    with pytest.raises(TypeError, match="forward_head takes a torch.Tensor"):
        fast.forward_head(features.numpy())
    assert fast.num_classes == 1000 and fast.forward_head.__doc__ == ours.forward_head.__doc__  # the model's own


def test_a_batchnorm_on_batch_statistics_is_still_compiled():
    """Such a BatchNorm keeps the batch whole (no chunks, no one-image pinning call), but it is torch's own layer:
    swin.optimize compiles the model as usual (it ran eager, warning about foreign modules)."""
    from swin.layers.execution import splittable
    from swin.optimized import _compilable

    model = swin.create_model("swin_t", depths=(1, 1, 1, 1)).eval()
    model.head = torch.nn.Sequential(torch.nn.BatchNorm1d(768, track_running_stats=False), model.head).eval()
    assert _compilable(model) and not splittable(model)


def test_a_dynamically_quantized_model_stays_float32():
    """quantize_dynamic's int8 linears take float32 activations: 'auto' keeps float32 (on a bf16 CPU it cast
    the model and failed with "expected scalar type Float but found BFloat16"), bfloat16 is refused, naming the
    module, before the model is changed."""
    torch.manual_seed(0)
    model = swin.create_model("swin_t", depths=(1, 1, 1, 1), num_classes=10).eval()
    quantized = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        expected = quantized(x)
    with pytest.raises(ValueError, match=r"layers\.0\.blocks\.0\.attn\.qkv .* is a quantized module.*'float32'"):
        swin.optimize(quantized, dtype="bfloat16", compile=False)
    assert quantized.head.weight().dtype == torch.qint8 and quantized.norm.weight.dtype == torch.float32
    fast = swin.optimize(quantized)
    with pytest.warns(UserWarning, match="running eager"):
        got = fast(x)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_shapes_compiled_stay_compiled_and_past_torchs_limit_calls_run_eager():
    """Each new shape pinned one more window plan and the graphs of earlier shapes were guarded on how many were
    pinned: going back to a shape compiled it again, and at torch's recompile limit (8) every call failed with
    dynamo's FailOnRecompileLimitHit, shapes compiled before included. Each compiled shape now stays compiled; a
    shape past the limit runs eager, said once. (Limit 2 here: two shapes compile.)"""
    import torch._dynamo

    with torch._dynamo.config.patch(recompile_limit=2):  # (monkeypatch's undo deletes the config's entry)
        _shapes_compiled_stay_compiled_and_past_torchs_limit_calls_run_eager()


def _shapes_compiled_stay_compiled_and_past_torchs_limit_calls_run_eager():
    _, ours = timm_pair("swin_t", shape={"depths": (2,), "num_heads": (2,), "embed_dim": 32})
    reference = copy.deepcopy(ours)  # eager, at any size (timm's model is built for one)
    fast = swin.optimize(ours, dtype="float32", compile="force")
    sizes = [(64, 64), (64, 96), (64, 64), (64, 96)]
    with torch.no_grad():
        for size in sizes:
            x = torch.randn(1, 3, *size)
            torch.testing.assert_close(fast(x), reference(x), atol=1e-4, rtol=1e-4)
        assert sorted(fast.compile_seconds) == [(1, 3, 64, 64), (1, 3, 64, 96)]
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        x = torch.randn(1, 3, 96, 96)
        with pytest.warns(UserWarning, match=r"2 input shapes are compiled, torch's recompile limit: calls of other"):
            torch.testing.assert_close(fast(x), reference(x), atol=1e-4, rtol=1e-4)
        fast(torch.randn(1, 3, 64, 64))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs  # nothing compiled again


def test_a_module_assigned_after_optimize_takes_the_models_dtype():
    """model.head = nn.Linear(...) after optimize cast the rest to bf16 kept its float32 weights, and the first
    call failed in a matmul of mixed dtypes."""
    _, ours = timm_pair("swin_t", shape={"depths": (1,), "num_heads": (2,), "embed_dim": 32})
    fast = swin.optimize(ours, dtype="bfloat16", compile=False)
    ours.head = torch.nn.Linear(ours.num_features, 5)
    out = fast(torch.randn(1, 3, 64, 64))
    assert out.dtype == torch.float32 and out.shape == (1, 5) and ours.head.weight.dtype == torch.bfloat16
