"""Float32 CPU forward passes run linear layers through oneDNN where that is faster (swin.layers.linear_kernel):
the outputs stay timm's and the gradients torch's, a user's wrapper and weight updates are seen, and it stays
out of the way of autocast, tracing, activation checkpointing and anything that observes aten ops.

Each test sets the choice (``ONEDNN_LINEAR``) instead of timing it, so they run the same on every machine, and
counts the oneDNN calls, so that a path that silently stopped applying (or applied where it must not) fails.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import swin
from swin.layers import linear_kernel

from ..conftest import timm_pair
from ..test_wrappers_and_weight_updates import _merge, _wrap

TOLERANCE = 1e-5
# Linear layers in a swin_t with depths (1, 1, 1, 1): qkv, proj, fc1, fc2 per block, 3 patch mergings.
LINEARS = 4 * 4 + 3


@pytest.fixture
def onednn(monkeypatch):
    """oneDNN chosen, and a record of the (input shape, weight shape) of every call it ran."""
    monkeypatch.setattr(linear_kernel, "ONEDNN_LINEAR", True)
    calls = []
    original = linear_kernel._onednn

    def spy(x, weight, bias, **options):
        calls.append((tuple(x.shape), tuple(weight.shape)))
        return original(x, weight, bias, **options)

    monkeypatch.setattr(linear_kernel, "_onednn", spy)
    return calls


def _model(**kwargs):
    torch.manual_seed(0)
    return swin.create_model("swin_t", depths=(1, 1, 1, 1), drop_path_rate=0.0, **kwargs).eval()


@pytest.mark.parametrize("batch", [1, 3])
def test_classifier_matches_timm(onednn, batch):
    reference, ours = timm_pair("swin_t", depths=(2, 2, 2, 2))
    x = torch.randn(batch, 3, 224, 224)
    with torch.inference_mode():
        expected = reference(x)
        got = ours(x)
    assert len(onednn) == 4 * 8 + 3  # every block's four linear layers and the three mergings; the head is not
    assert (got - expected).abs().max().item() <= TOLERANCE


def test_backbone_at_detection_size_matches_aten(onednn, monkeypatch):
    model = _model(features_only=True)
    x = torch.randn(1, 3, 800, 1333)
    with torch.no_grad():
        got = model(x)
        assert len(onednn) == LINEARS
        monkeypatch.setattr(linear_kernel, "ONEDNN_LINEAR", False)
        expected = model(x)  # MKL's sgemm through F.linear: the other library
    assert len(onednn) == LINEARS
    for level, want in zip(got, expected, strict=True):
        assert (level - want).abs().max().item() <= TOLERANCE


def test_a_wrapper_runs_and_weight_updates_are_seen(onednn):
    model = _model(num_classes=10)
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        before = model(x)
    _wrap(model, "attn.qkv")  # a LoRA adapter around every qkv: its two linear layers run through oneDNN too
    with torch.no_grad():
        wrapped = model(x)
        for adapter in (m for m in model.modules() if hasattr(m, "merged")):
            adapter.up.weight.mul_(3.0)  # an in-place update after a forward: nothing of the old weights is kept
        updated = model(x)
    assert len(onednn) == 3 * LINEARS + 2 * (2 * 4)  # three passes; two of them with 4 adapters of 2 layers
    _merge(model, "attn.qkv")  # the adapters folded into plain Linears: the expected outputs
    with torch.no_grad():
        expected = model(x)
    assert (wrapped - before).abs().max().item() > 1e-3
    assert (updated - wrapped).abs().max().item() > 1e-3
    assert (updated - expected).abs().max().item() <= 1e-4


def _gradients(model: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    out = model(x)
    (out.float() ** 2).mean().backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("checkpointing", [False, True])
def test_training_gradients_match_torchs(onednn, monkeypatch, checkpointing):
    """A training step's gradients of every parameter, against the same model on F.linear's autograd (MKL).
    With activation checkpointing the checkpointed blocks stay on F.linear (their recomputation runs outside
    the pass and must save what the forward saved), the rest runs on oneDNN."""
    model = _model(num_classes=10).train()
    model.set_grad_checkpointing(checkpointing)
    x = torch.randn(2, 3, 224, 224)
    got = _gradients(model, x)
    # forward, and backward for the input and the weight; with checkpointing only the three patch mergings
    assert len(onednn) == 3 * (3 if checkpointing else LINEARS)
    monkeypatch.setattr(linear_kernel, "ONEDNN_LINEAR", False)
    expected = _gradients(model, x)
    assert got.keys() == expected.keys() and len(got) > 40
    for name, grad in expected.items():
        error = (got[name] - grad).abs().max().item() / max(grad.abs().max().item(), 1e-12)
        assert error <= 1e-4, name


def test_double_backward_matches_torchs(onednn, monkeypatch):
    """A gradient penalty differentiates the backward again: the backward is made of oneDNN linears too."""
    torch.manual_seed(0)
    layer = nn.Linear(6, 5)
    x = torch.randn(3, 4, 6, requires_grad=True)

    def penalty() -> torch.Tensor:
        with linear_kernel.linear_kernels(x):
            y = layer(x).pow(2).sum()
        (grad_x,) = torch.autograd.grad(y, x, create_graph=True)
        return torch.autograd.grad(grad_x.pow(2).sum(), layer.weight)[0]

    got = penalty()
    assert len(onednn) > 3  # forward, its backward (x, weight), and the backward of that backward
    monkeypatch.setattr(linear_kernel, "ONEDNN_LINEAR", False)
    expected = penalty()
    assert (got - expected).abs().max().item() <= 1e-5 * expected.abs().max().item()


def test_frozen_weights_save_what_f_linear_saves(onednn, monkeypatch):
    """Bias-only or adapter tuning: with the weight frozen its input is not saved for backward, so changing
    that input in place after the forward is as legal as with F.linear, and the bias gets torch's gradient."""
    torch.manual_seed(0)
    layer = nn.Linear(6, 5).requires_grad_(False)
    layer.bias.requires_grad_(True)

    def step() -> torch.Tensor:
        h = torch.randn(3, 6, generator=torch.Generator().manual_seed(1))
        with linear_kernel.linear_kernels(h):
            y = layer(h)
        h.add_(1.0)  # the input changes after the forward: nothing of it was needed
        layer.bias.grad = None
        (y**2).sum().backward()
        return layer.bias.grad

    got = step()
    assert len(onednn) == 1
    monkeypatch.setattr(linear_kernel, "ONEDNN_LINEAR", False)
    assert (got - step()).abs().max().item() <= TOLERANCE


def test_backward_under_a_flop_counter_counts_torchs_ops(onednn):
    """The backward runs later, outside the pass: a FLOP counter around it alone sees aten's matmuls."""
    layer = nn.Linear(6, 5)
    x = torch.randn(4, 6, requires_grad=True)
    with linear_kernel.linear_kernels(x):
        y = layer(x)
    with FlopCounterMode(display=False) as counter:
        y.sum().backward()
    assert len(onednn) == 1 and counter.get_total_flops() == 2 * (2 * 4 * 6 * 5)  # grad of x and of weight


def test_zero_width_layer(onednn):
    layer = nn.Linear(6, 0)
    x = torch.randn(4, 6, requires_grad=True)
    with linear_kernel.linear_kernels(x):
        y = layer(x)
    (y.sum() + x.sum()).backward()
    assert y.shape == (4, 0) and onednn == []


@pytest.mark.parametrize(
    "setting",
    ["saved tensor hooks", "autocast", "flop counter", "vmap", "jit trace", "compile", "bfloat16", "not chosen"],
)
def test_not_used_where_it_would_change_what_runs(onednn, monkeypatch, setting):
    model = _model(num_classes=10)
    x = torch.randn(1, 3, 224, 224)
    if setting == "saved tensor hooks":  # e.g. activation offloading, or a checkpoint around the whole model
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            model(x).sum().backward()
        assert model.head.weight.grad is not None
    elif setting == "autocast":  # autocast casts F.linear's inputs below the torch-function layer
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            assert model(x).dtype == torch.bfloat16
    elif setting == "flop counter":  # counters see aten ops; torch's formulas give swin_t's linear MACs
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(x)
        assert counter.get_flop_counts()["Global"][torch.ops.aten.addmm] > 0
    elif setting == "vmap":
        with torch.no_grad():
            torch.vmap(model, in_dims=0)(x.unsqueeze(1))
    elif setting == "jit trace":
        with torch.no_grad():
            traced = torch.jit.trace(model, x, check_trace=False)
        assert "mkldnn" not in str(traced.inlined_graph)
    elif setting == "compile":
        pytest.importorskip("torch._dynamo")
        with torch.no_grad():
            torch.compile(model, backend="eager")(x)
    elif setting == "bfloat16":
        model.to(torch.bfloat16)
        with torch.no_grad():
            model(x.bfloat16())
    else:
        monkeypatch.setattr(linear_kernel, "ONEDNN_LINEAR", False)
        with torch.no_grad():
            model(x)
    assert onednn == []


def test_other_tensors_go_to_f_linear(onednn):
    """Inside the pass, a call with anything but plain float32 CPU tensors is F.linear's, errors included."""

    class Wrapped(torch.Tensor):
        pass

    x = torch.randn(4, 8)
    weight = torch.randn(5, 8)
    table = torch.randn(5, 3)
    linear = torch.nn.functional.linear
    with torch.no_grad(), linear_kernel.linear_kernels(x):
        plain = linear(x, weight)
        linear(x, weight.as_subclass(Wrapped))
        linear(x.double(), weight.double())
        linear(x[0], weight)  # 1-D input
        strided = linear(x, weight, table[:, 1])  # a bias that is a column of a table
        expanded = linear(x, weight, torch.tensor([1.5]).expand(5))  # stride 0
        with torch.autocast("cpu", dtype=torch.bfloat16):  # entered inside the pass, e.g. by a user's module
            assert linear(x, weight).dtype == torch.bfloat16
        with FlopCounterMode(display=False) as counter:
            linear(x, weight)
        with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
            linear(x, weight.t())
    assert onednn == [((4, 8), (5, 8))]
    assert counter.get_total_flops() == 2 * 4 * 8 * 5
    assert (plain - x @ weight.t()).abs().max().item() <= TOLERANCE
    assert (strided - (x @ weight.t() + table[:, 1])).abs().max().item() <= TOLERANCE
    assert (expanded - (x @ weight.t() + 1.5)).abs().max().item() <= TOLERANCE


def test_a_users_torch_function_mode_sees_every_linear_call(onednn):
    from torch.overrides import TorchFunctionMode

    class CountLinear(TorchFunctionMode):
        calls = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.nn.functional.linear:
                CountLinear.calls += 1
            return func(*args, **(kwargs or {}))

    model = _model(num_classes=10)
    with torch.no_grad(), CountLinear():
        model(torch.randn(1, 3, 224, 224))
    assert CountLinear.calls == LINEARS + 1 and onednn == []  # the head too


def test_onednn_without_a_kernel_for_this_cpu_leaves_linear_to_aten(monkeypatch):
    """A oneDNN that cannot build a float32 inner product on this CPU makes the probe say ATen (it raised from
    the first forward of every model instead), and the model still computes F.linear's function."""

    def no_kernel(*args, **kwargs):
        raise RuntimeError("could not create a primitive descriptor for the inner product forward propagation")

    model = _model(num_classes=10).eval()
    x = torch.randn(1, 3, 224, 224)
    monkeypatch.setattr(linear_kernel, "ONEDNN_LINEAR", False)  # F.linear throughout
    with torch.no_grad():
        expected = model(x)
    monkeypatch.setattr(linear_kernel, "ONEDNN_LINEAR", None)
    monkeypatch.setattr(linear_kernel, "_MEASURED", {})
    monkeypatch.setattr(linear_kernel, "_onednn", no_kernel)
    assert linear_kernel.onednn_pays() is False
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected, rtol=0, atol=0)


def test_choice_is_timed_once_leaving_no_trace_and_can_be_set(monkeypatch):
    monkeypatch.setattr(linear_kernel, "ONEDNN_LINEAR", None)
    monkeypatch.setattr(linear_kernel, "_MEASURED", {})
    timings = []
    measure = linear_kernel._measure
    monkeypatch.setattr(linear_kernel, "_measure", lambda: timings.append(1) or measure())
    with FlopCounterMode(display=False) as counter:  # not timed where a counter would see it
        assert linear_kernel.onednn_pays() is False
    assert counter.get_total_flops() == 0 and timings == []
    rng = torch.get_rng_state()
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # the probe makes its own float32 CPU tensors whatever the defaults
    try:
        with torch.device("meta"):
            first = linear_kernel.onednn_pays()
    finally:
        torch.set_default_dtype(default)
    assert isinstance(first, bool)
    assert torch.equal(torch.get_rng_state(), rng)  # a seeded program draws the same numbers after it
    assert linear_kernel.onednn_pays() is first and timings == [1]
    monkeypatch.setattr(linear_kernel, "ONEDNN_LINEAR", False)
    assert linear_kernel.onednn_pays() is False
    monkeypatch.setattr(linear_kernel, "ONEDNN_LINEAR", True)
    assert linear_kernel.onednn_pays() is torch.backends.mkldnn.is_available()
    with torch.backends.mkldnn.flags(enabled=False):
        assert linear_kernel.onednn_pays() is False
    # A torch without one of the private functions the checks use: F.linear everywhere, no error.
    monkeypatch.delattr(torch._C._autograd, "_top_saved_tensors_default_hooks")
    monkeypatch.setattr(linear_kernel, "_INTROSPECTION", linear_kernel._introspection_available())
    assert linear_kernel.onednn_pays() is False
    with torch.no_grad():
        _model(num_classes=10)(torch.randn(1, 3, 224, 224))


def test_model_still_runs_a_linear_module_through_its_forward(onednn):
    """A module the user substituted (not calling F.linear at all) is called as it is."""

    class Doubling(nn.Module):
        def __init__(self, base: nn.Linear):
            super().__init__()
            self.base = base
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            return 2 * self.base(x)

    model = _model(num_classes=10)
    block = model.layers[0].blocks[0]
    block.mlp.fc2 = Doubling(block.mlp.fc2)
    with torch.no_grad():
        model(torch.randn(1, 3, 224, 224))
    assert block.mlp.fc2.calls == 1 and len(onednn) == LINEARS


def test_in_place_ops_on_the_output_under_autograd(onednn):
    """Swin V2's position-bias MLP applies ReLU in place to a linear layer's output: allowed, as on F.linear
    (autograd forbids it on a view made inside a custom Function)."""
    torch.manual_seed(0)
    layers = nn.Sequential(nn.Linear(4, 8), nn.ReLU(inplace=True), nn.Linear(8, 2))
    x = torch.randn(5, 3, 4)
    with linear_kernel.linear_kernels(x):
        layers(x).sum().backward()
    got = [p.grad.clone() for p in layers.parameters()]
    assert len(onednn) == 2 * 3 - 1  # two forwards, two weight gradients, one input gradient (x needs none)
    layers.zero_grad()
    layers(x).sum().backward()
    for grad, p in zip(got, layers.parameters(), strict=True):
        assert (grad - p.grad).abs().max().item() <= TOLERANCE
