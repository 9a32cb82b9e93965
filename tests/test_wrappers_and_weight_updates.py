"""A user's wrapper, quantization or weight update is never bypassed: every way of running gives the outputs
of the math with those modules and weights (issue: one boundary between the math and how it runs).

Expected values come from an independent route: a wrapper's update merged into a plain Linear, or a freshly
built model loading the new weights.
"""

from __future__ import annotations

import contextlib
import copy
import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import swin
from swin.layers import execution


class LoRA(nn.Module):
    """A low-rank adapter around a Linear: base(x) + B(A(x)), with a non-zero update."""

    def __init__(self, base: nn.Linear, rank: int = 4):
        super().__init__()
        self.base = base
        self.down = nn.Linear(base.in_features, rank, bias=False)
        self.up = nn.Linear(rank, base.out_features, bias=False)
        nn.init.normal_(self.down.weight, std=0.1)
        nn.init.normal_(self.up.weight, std=0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.up(self.down(x))

    def merged(self) -> nn.Linear:
        linear = nn.Linear(self.base.in_features, self.base.out_features, bias=self.base.bias is not None)
        with torch.no_grad():
            linear.weight.copy_(self.base.weight + self.up.weight @ self.down.weight)
            if self.base.bias is not None:
                linear.bias.copy_(self.base.bias)
        return linear


TARGETS = ("attn.proj", "attn.qkv", "mlp.fc1")

MODES = {
    "train": lambda model: (model.train(), contextlib.nullcontext()),
    "eval with grad": lambda model: (model.eval(), contextlib.nullcontext()),
    "no_grad": lambda model: (model.eval(), torch.no_grad()),
    "inference_mode": lambda model: (model.eval(), torch.inference_mode()),
}


def _wrap(model: nn.Module, target: str) -> list[LoRA]:
    adapters = []
    for stage in model.layers:
        for block in stage.blocks:
            parent = block.get_submodule(target.rsplit(".", 1)[0])
            leaf = target.rsplit(".", 1)[1]
            adapter = LoRA(getattr(parent, leaf))
            setattr(parent, leaf, adapter)
            adapters.append(adapter)
    return adapters


def _merge(model: nn.Module, target: str) -> None:
    for stage in model.layers:
        for block in stage.blocks:
            parent = block.get_submodule(target.rsplit(".", 1)[0])
            leaf = target.rsplit(".", 1)[1]
            setattr(parent, leaf, getattr(parent, leaf).merged())


def _run(model: nn.Module, x: torch.Tensor, mode: str):
    _, context = MODES[mode](model)
    with context:
        out = model(x)
    out = out if isinstance(out, list) else [out]
    return [o.detach().clone() for o in out]


@pytest.fixture
def small_pieces(monkeypatch):
    """A budget that makes inference run one image at a time, so the pieces are exercised too."""
    monkeypatch.setattr(execution, "CHUNK_BYTES", 64 * 2**10)


@pytest.mark.parametrize("target", TARGETS)
def test_wrapper_changes_outputs_identically_in_every_mode_classifier(small_pieces, target):
    torch.manual_seed(0)
    model = swin.create_model("swin_t", depths=(2, 2, 2, 2), drop_path_rate=0.0, num_classes=10)
    x = torch.randn(2, 3, 224, 224)
    plain = _run(model, x, "no_grad")
    _wrap(model, target)
    outputs = {mode: _run(model, x, mode) for mode in MODES}
    _merge(model, target)  # the adapters' update folded into plain Linears: the expected outputs
    expected = _run(model, x, "no_grad")
    assert (plain[0] - expected[0]).abs().max().item() > 1e-3  # the adapter changes the outputs
    for mode, out in outputs.items():
        assert (out[0] - expected[0]).abs().max().item() <= 1e-4, mode


# The detection size once; the other wrapped layers at a smaller size that is not a window multiple either.
BACKBONE_CASES = [(target, (800, 1333) if i == 0 else (352, 544)) for i, target in enumerate(TARGETS)]


@pytest.mark.parametrize("target, size", BACKBONE_CASES)
def test_wrapper_changes_outputs_identically_in_every_mode_backbone(target, size):
    torch.manual_seed(0)
    model = swin.create_model("swin_t", features_only=True, depths=(2, 2, 2, 2), drop_path_rate=0.0)
    x = torch.randn(1, 3, *size)
    _wrap(model, target)
    outputs = {mode: _run(model, x, mode) for mode in ("train", "no_grad", "inference_mode")}
    _merge(model, target)
    expected = _run(model, x, "no_grad")
    for mode, levels in outputs.items():
        for got, want in zip(levels, expected, strict=True):
            assert got.shape == want.shape
            assert (got - want).abs().max().item() <= 1e-4, mode


def test_dynamic_quantization_same_under_inference_mode_and_grad(small_pieces):
    """Dynamic quantization takes each call's activation range, so a quantized model's outputs depend on the
    whole batch: it must run the batch at once in inference too. (The float parameters left, the position
    bias tables, are frozen as for any deployed model: a bias that needs a gradient sends torch's SDPA to
    another kernel, whose last-bit differences int8 re-quantization then amplifies.)"""
    torch.manual_seed(0)
    model = swin.create_model("swin_t", depths=(2, 2, 2, 2), num_classes=10).eval()
    quantized = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8).requires_grad_(False)
    assert isinstance(quantized.layers[0].blocks[0].attn.proj, torch.ao.nn.quantized.dynamic.Linear)
    x = torch.randn(2, 3, 224, 224)
    with torch.inference_mode():
        fast = quantized(x)
    with torch.enable_grad():
        reference = quantized(x)
    assert (fast - reference).abs().max().item() <= 1e-6


def _small(name: str = "swin_t", **kwargs) -> nn.Module:
    return swin.create_model(name, depths=(2, 2, 2, 2), num_classes=10, **kwargs).eval()


def _fresh(state_dict: dict, name: str = "swin_t") -> nn.Module:
    model = _small(name)
    model.load_state_dict(state_dict)
    return model


@pytest.mark.parametrize("name", ["swin_t", "swinv2_t_w8"])
def test_data_writes_after_a_forward(name):
    torch.manual_seed(0)
    model, other = _small(name), _small(name)
    size = swin.get_config(name).img_size
    x = torch.randn(2, 3, *size)
    with torch.no_grad():
        model(x)
        for p, q in zip(model.parameters(), other.parameters(), strict=True):
            p.data.copy_(q.data)
        got = model(x)
        want = _fresh(other.state_dict(), name)(x)
    assert (got - want).abs().max().item() <= 1e-6


def test_ema_teacher_updates_through_data():
    torch.manual_seed(0)
    teacher, student = _small(), _small()
    x = torch.randn(1, 3, 224, 224)
    momentum = 0.9
    # Two rounds: the first updates after a forward filled the caches, the second after they were refilled
    # from updated weights (more rounds repeat the second).
    for _ in range(2):
        with torch.no_grad():
            teacher(x)
            for p in student.parameters():
                p.data.add_(torch.randn_like(p) * 0.01)
            for p, q in zip(teacher.parameters(), student.parameters(), strict=True):
                p.data.mul_(momentum).add_(q.data, alpha=1 - momentum)
            got = teacher(x)
            want = _fresh(teacher.state_dict())(x)
        assert (got - want).abs().max().item() <= 1e-6


def test_functional_call_with_new_parameters_each_call():
    torch.manual_seed(0)
    model = _small()
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        model(x)
        for seed in range(3):
            torch.manual_seed(100 + seed)
            donor = _small()
            params = dict(donor.named_parameters())
            got = torch.func.functional_call(model, params, (x,))
            want = donor(x)
            assert (got - want).abs().max().item() <= 1e-6


def test_vmap_over_stacked_parameters_of_three_models():
    torch.manual_seed(0)
    models = [_small() for _ in range(3)]
    params, buffers = torch.func.stack_module_state(models)
    base = _small()
    x = torch.randn(1, 3, 224, 224)

    def run(p, b):
        return torch.func.functional_call(base, (p, b), (x,))

    with torch.no_grad():
        base(x)
        outputs = torch.vmap(run)(params, buffers)
        for model, out in zip(models, outputs, strict=True):
            assert (out - model(x)).abs().max().item() <= 1e-6


def test_swin_v2_runs_dynamically_quantized():
    """V2's position-bias MLP read its first layer's weight for a dtype: a quantized Linear (whose weight is a
    method) or a user's wrapper there crashed the forward (timm 1.0.31's V2 crashes the same way, so the
    reference is the float model: int8 weights and activations keep the logits within a few percent)."""
    torch.manual_seed(0)
    model = swin.create_model("swinv2_t_w8", depths=(1, 1, 1, 1), num_classes=10).eval()
    quantized = torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {nn.Linear}, dtype=torch.qint8)
    assert isinstance(quantized.layers[0].blocks[0].attn.cpb_mlp[0], torch.ao.nn.quantized.dynamic.Linear)
    x = torch.randn(2, 3, 256, 256)
    with torch.no_grad():
        reference, got = model(x), quantized(x)
    assert ((got - reference).norm() / reference.norm()).item() <= 0.05


def test_a_batchnorm_without_running_statistics_is_not_chunked(monkeypatch):
    """Such a BatchNorm normalizes by the batch's statistics in eval too, so the batch must run whole: in
    pieces, the logits differed by 7e-3."""
    torch.manual_seed(0)
    model = swin.create_model("swin_t", depths=(1, 1, 1, 1), num_classes=10).eval()
    model.patch_embed.proj = nn.Sequential(model.patch_embed.proj, nn.BatchNorm2d(96, track_running_stats=False))
    model.eval()  # the new modules too: a module left in training mode keeps the batch whole anyway
    x = torch.randn(4, 3, 224, 224)
    with torch.no_grad():
        monkeypatch.setattr(execution, "ENABLED", False)
        whole = model(x)
        monkeypatch.setattr(execution, "ENABLED", True)
        monkeypatch.setattr(execution, "CHUNK_BYTES", 1)  # one image per piece, were pieces allowed
        chunked = model(x)
        pieces = torch.cat([model(x[i : i + 1]) for i in range(4)])
    assert not torch.allclose(pieces, whole, atol=1e-4)  # the batch's statistics matter here
    torch.testing.assert_close(chunked, whole)


def _batch_centered_norm(norm: nn.LayerNorm):
    """A forward that depends on the whole batch (its mean over images), as a user may patch one in."""

    def forward(x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x - x.mean(0), norm.normalized_shape, norm.weight, norm.bias, norm.eps)

    return forward


@pytest.mark.parametrize("where", ["instance", "class"])
def test_a_patched_forward_sees_the_whole_batch(monkeypatch, where):
    """A forward patched onto a module or its class (code capturing attention outputs does this) is the user's
    code, as a hook is: it must see the batch once, whole (in pieces it saw 4 images at a time)."""
    torch.manual_seed(0)
    model = swin.create_model("swin_t", depths=(1, 1, 1, 1), num_classes=10).eval()
    norm = model.layers[0].blocks[0].norm1
    seen = []
    if where == "instance":
        monkeypatch.setattr(norm, "forward", _batch_centered_norm(norm), raising=False)
    else:
        layer_norm = nn.LayerNorm.forward

        @functools.wraps(layer_norm)
        def recording(self, x):
            seen.append(x.shape[0])
            return layer_norm(self, x)

        monkeypatch.setattr(nn.LayerNorm, "forward", recording)
    monkeypatch.setattr(execution, "CHUNK_BYTES", 1)  # one image per piece, were pieces allowed
    x = torch.randn(4, 3, 64, 64)
    with torch.no_grad():
        got = model(x)
        monkeypatch.setattr(execution, "ENABLED", False)
        whole = model(x)
    torch.testing.assert_close(got, whole, rtol=0, atol=0)
    assert set(seen) <= {4}


@pytest.mark.parametrize("name", ["swin_t", "swinv2_t_w8"])
def test_a_hook_on_attn_softmax_gets_the_attention_maps(monkeypatch, name):
    """The official code's way to read attention maps, a forward hook on ``attn.softmax``, gets them (the fused
    kernels never call that module): rows that sum to one, (B*nW, heads, N, N) as the official code's, and the
    same logits as without the hook; without a hook the module path is not taken."""
    torch.manual_seed(0)
    model = swin.create_model(name, depths=(1, 1, 1, 1), num_classes=10).eval()
    x = torch.randn(2, 3, 64, 64)
    taken = []
    original = execution.module_attention
    monkeypatch.setattr(
        execution, "module_attention", lambda *args, **kwargs: taken.append(1) or original(*args, **kwargs)
    )
    monkeypatch.setattr(swin.layers.attention, "module_attention", execution.module_attention)
    with torch.no_grad():
        expected = model(x)
        assert not taken
        maps = []
        handle = model.layers[0].blocks[0].attn.softmax.register_forward_hook(lambda m, args, out: maps.append(out))
        got = model(x)
        handle.remove()
    assert taken and len(maps) == 1
    wh, ww = model.layers[0].window
    windows = -(-16 // wh) * -(-16 // ww)  # 64 px: a 16x16 map in the first stage, padded to window multiples
    assert maps[0].shape == (2 * windows, 3, wh * ww, wh * ww)
    torch.testing.assert_close(maps[0].sum(-1), torch.ones_like(maps[0].sum(-1)))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_a_replaced_attn_drop_is_called_in_training():
    """A user's module in place of attn_drop (here one that zeroes the probabilities) is called in the forward and
    the backward, as the official code calls it: the attention's output is then its projection's bias alone."""
    torch.manual_seed(0)
    model = swin.create_model("swin_t", depths=(1, 1, 1, 1), num_classes=10).train()
    attention = model.layers[0].blocks[0].attn
    attention.attn_drop = ZeroProbabilities()
    x = torch.randn(1, 3, 64, 64)
    windows = torch.randn(1, 4, 49, 96, requires_grad=True)
    out = attention(windows)
    torch.testing.assert_close(out, attention.proj.bias.expand_as(out))
    model(x).sum().backward()
    assert attention.attn_drop.calls == 2  # the block's call and the direct one


class ZeroProbabilities(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, probs: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return probs * 0


def test_torch_modules_in_place_of_softmax_or_attn_drop_are_called():
    """A deploy script's nn.Identity in place of every Dropout crashed (the fused path read attn_drop.p); another
    torch module in place of softmax (here over queries) was skipped: the kernels do only a softmax over keys
    and a dropout. Expected values: the same attention with the replacement applied by hand."""
    torch.manual_seed(0)
    model = swin.create_model("swin_t", depths=(1, 1, 1, 1), num_classes=10).eval()
    attention = model.layers[0].blocks[0].attn
    windows = torch.randn(1, 4, 49, 96)
    with torch.no_grad():
        expected = attention(windows)
        attention.attn_drop = nn.Identity()
        torch.testing.assert_close(attention(windows), expected, atol=1e-6, rtol=1e-6)
        attention.softmax = nn.Softmax(dim=-2)
        got = attention(windows)
        q, k, v = attention.qkv(windows).view(1, 4, 49, 3, 3, 32).permute(3, 0, 1, 4, 2, 5).unbind(0)
        scores = (q * 32**-0.5) @ k.transpose(-2, -1) + attention.position_bias()
        by_hand = (scores.softmax(-2) @ v).transpose(2, 3).reshape(1, 4, 49, 96)
        torch.testing.assert_close(got, attention.proj(by_hand), atol=1e-5, rtol=1e-5)


def test_a_model_pickled_before_the_attention_modules_runs():
    """torch.save(model) from before the attention had its softmax and attn_drop modules (attn_drop was its
    rate): loaded, it runs as before (it failed: no attribute 'softmax')."""
    import io

    torch.manual_seed(0)
    model = swin.create_model("swin_t", depths=(1, 1, 1, 1), num_classes=10, attn_drop_rate=0.1).eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        expected = model(x)
    for module in model.modules():
        if hasattr(module, "softmax"):  # as the module was then
            rate = module.attn_drop.p
            del module.softmax, module.attn_drop
            module.__dict__["attn_drop"] = rate
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert loaded.layers[0].blocks[0].attn.attn_drop.p == 0.1
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), expected, rtol=0, atol=0)


def _forced_fast_paths(monkeypatch) -> None:
    """oneDNN's float32 linear layers and one image per piece, whatever this machine's timing would choose."""
    from swin.layers import linear_kernel

    monkeypatch.setattr(linear_kernel, "ONEDNN_LINEAR", True)
    monkeypatch.setattr(execution, "CHUNK_BYTES", 1)


def _plain_paths(monkeypatch) -> None:
    from swin.layers import linear_kernel

    monkeypatch.setattr(linear_kernel, "ONEDNN_LINEAR", False)
    monkeypatch.setattr(execution, "ENABLED", False)


def test_a_replaced_functional_runs_once_per_call(monkeypatch):
    """A user's F.layer_norm (calibration, a tweak) runs once per LayerNorm, as without the fast paths: under
    the oneDNN linear mode it ran twice per call (a Python F function hands the mode the name it finds in
    torch.nn.functional: the user's function, which the mode called again); logits were 0.07 off."""
    torch.manual_seed(0)
    model = swin.create_model("swin_t", depths=(1, 1, 1, 1), num_classes=10).eval()
    norms = sum(isinstance(m, nn.LayerNorm) for m in model.modules())
    original, calls = F.layer_norm, []

    def scaled(x, *args, **kwargs):
        calls.append(x.shape[0])
        return original(x, *args, **kwargs) * 1.1

    monkeypatch.setattr(F, "layer_norm", scaled)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        _forced_fast_paths(monkeypatch)
        got = model(x)
        assert calls == [2] * norms  # once per LayerNorm, on the whole batch
        _plain_paths(monkeypatch)
        expected = model(x)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


class _LinearBatches(torch.overrides.TorchFunctionMode):
    """A user's mode that sees every F.linear, recording the batch it got (as a per-call quantizer would)."""

    def __init__(self):
        super().__init__()
        self.batches = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.linear:
            self.batches.append(args[0].shape[0])
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("how", ["torch-function mode", "patched F.linear", "patched block method"])
def test_users_code_outside_the_modules_sees_the_whole_batch(monkeypatch, how):
    """Code of the user's that is not a module (a torch-function mode, a replaced F function, a method other than
    forward patched onto a class of ours) is the user's code as a hook is: it sees the batch whole (it saw one
    image at a time)."""
    torch.manual_seed(0)
    model = swin.create_model("swin_t", depths=(1, 1, 1, 1), num_classes=10).eval()
    batches = []
    context = contextlib.nullcontext()
    if how == "torch-function mode":
        context = _LinearBatches()
        batches = context.batches
    elif how == "patched F.linear":
        linear = F.linear
        monkeypatch.setattr(F, "linear", lambda x, *args: batches.append(x.shape[0]) or linear(x, *args))
    else:
        block_class = type(model.layers[0].blocks[0])
        method = block_class.shifted_window_attention
        monkeypatch.setattr(
            block_class, "shifted_window_attention", lambda self, x: batches.append(x.shape[0]) or method(self, x)
        )
    _forced_fast_paths(monkeypatch)
    x = torch.randn(4, 3, 64, 64)
    with torch.no_grad(), context:
        model(x)
    assert batches and set(batches) == {4}


def test_a_replaced_functional_softmax_is_called():
    """F.softmax replaced by the user is what nn.Softmax calls: the attention goes through the module (the fused
    kernels skipped it), with the outputs of a softmax module of the user's doing the same."""
    torch.manual_seed(0)
    model = swin.create_model("swin_t", depths=(1, 1, 1, 1), num_classes=10).eval()
    x = torch.randn(2, 3, 64, 64)
    original, calls = F.softmax, []

    def tempered(x, dim=None, *args, **kwargs):
        calls.append(1)
        return original(x / 2, dim, *args, **kwargs)

    class Tempered(nn.Module):
        def forward(self, x):
            return original(x / 2, -1)

    with torch.no_grad():
        F.softmax = tempered
        try:
            got = model(x)
        finally:
            F.softmax = original
        assert len(calls) == 4  # one per block
        reference = copy.deepcopy(model)
        for stage in reference.layers:
            for block in stage.blocks:
                block.attn.softmax = Tempered()
        expected = reference(x)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_a_users_mode_sees_bf16_attention_ops():
    """A torch-function mode sees the ops of bf16 attention (the fused kernel, one call through ctypes, hid
    them: the mode saw no softmax where the CPU has AVX512-BF16)."""
    torch.manual_seed(0)
    model = swin.create_model("swin_t", depths=(1, 1, 1, 1), num_classes=10).eval().to(torch.bfloat16)
    seen = []

    class Recording(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(getattr(func, "__name__", ""))
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), Recording():
        model(torch.randn(1, 3, 64, 64, dtype=torch.bfloat16))
    assert sum("softmax" in name or "scaled_dot_product" in name for name in seen) == 4


def test_the_linear_library_probe_never_calls_a_replaced_f_linear(monkeypatch):
    """The probe that times the GEMM libraries times ATen's linear, not a user's F.linear (which counted the
    probe's shapes as the model's MACs)."""
    from swin.layers import linear_kernel

    calls = []
    monkeypatch.setattr(F, "linear", lambda *args, **kwargs: calls.append(1))
    linear_kernel._measure()
    assert calls == []


def test_a_functional_replaced_before_swin_is_imported_runs_once_per_call():
    """The same with F.layer_norm replaced before ``import swin`` (a library that patches at import)."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import torch, torch.nn.functional as F
        original, calls = F.layer_norm, []
        F.layer_norm = lambda x, *a, **k: calls.append(1) or original(x, *a, **k) * 1.1
        import swin
        from swin.layers import linear_kernel
        linear_kernel.ONEDNN_LINEAR = True
        model = swin.create_model("swin_t", depths=(1, 1, 1, 1), num_classes=10).eval()
        with torch.no_grad():
            model(torch.randn(2, 3, 64, 64))
        print(len(calls), sum(isinstance(m, torch.nn.LayerNorm) for m in model.modules()))
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=300)
    calls, norms = result.stdout.split()
    assert calls == norms


def test_torchs_device_context_keeps_the_fast_paths(monkeypatch):
    """``with torch.device('cpu')`` (and torch.set_default_device) is a torch-function mode of torch's own that
    only sets where new tensors go: batches still run in pieces under it (it counted as the user's code)."""
    torch.manual_seed(0)
    model = swin.create_model("swin_t", depths=(1, 1, 1, 1), num_classes=10).eval()
    pieces = []
    run_in_pieces = execution.run_in_image_chunks
    monkeypatch.setattr(execution, "CHUNK_BYTES", 1)
    monkeypatch.setattr(
        swin.trunk, "run_in_image_chunks", lambda run, x, images: pieces.append(images) or run_in_pieces(run, x, images)
    )
    with torch.no_grad(), torch.device("cpu"):
        model(torch.randn(2, 3, 64, 64))
    assert pieces == [1]


def test_a_replaced_sdpa_is_the_attention_call(monkeypatch):
    """A user's F.scaled_dot_product_attention (another kernel, a recorder) is what attention calls, in bf16 too
    (the matmul path and the fused kernel went around it)."""
    torch.manual_seed(0)
    model = swin.create_model("swin_t", depths=(1, 1, 1, 1), num_classes=10).eval()
    sdpa, calls = F.scaled_dot_product_attention, []
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: calls.append(a[0].dtype) or sdpa(*a, **k))
    with torch.no_grad():
        for dtype in (torch.float32, torch.bfloat16):
            model.to(dtype)(torch.randn(1, 3, 64, 64, dtype=dtype))
    assert calls == [torch.float32] * 4 + [torch.bfloat16] * 4
