"""Robustness: fuzzed inputs, caches under threads and bounded, determinism, non-strict loading.

(A checkpoint of another architecture: tests/weights/test_adapt.py and tests/weights/test_wrong_architecture.py.)"""

from __future__ import annotations

import threading

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import swin


def tiny_backbone(window: int, in_chans: int, dtype: torch.dtype):
    torch.manual_seed(0)
    model = swin.create_model(
        "swin_t",
        features_only=True,
        depths=(2, 2, 2, 2),
        embed_dim=16,
        num_heads=(1, 2, 4, 8),
        window_size=window,
        in_chans=in_chans,
        drop_path_rate=0.0,
    )
    return model.to(dtype).eval()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batch=st.integers(1, 3),
    height=st.integers(32, 300),
    width=st.integers(32, 300),
    window=st.integers(4, 12),
    in_chans=st.integers(1, 4),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
)
def test_backbone_fuzz(batch, height, width, window, in_chans, dtype):
    """Any size, window and channel count: correctly shaped, finite outputs (ceil(H/4), then halved)."""
    model = tiny_backbone(window, in_chans, dtype)
    with torch.no_grad():
        levels = model(torch.randn(batch, in_chans, height, width, dtype=dtype))
    h, w = -(-height // 4), -(-width // 4)
    for i, level in enumerate(levels):
        assert level.shape == (batch, 16 * 2**i, h, w) and level.dtype == dtype
        assert torch.isfinite(level).all()
        h, w = -(-h // 2), -(-w // 2)


@settings(max_examples=10, deadline=None)
@given(height=st.integers(1, 3), width=st.integers(1, 40), channels=st.sampled_from([2, 3]))
def test_backbone_fuzz_invalid_inputs_raise_value_error(height, width, channels):
    model = tiny_backbone(7, 3, torch.float32)
    with pytest.raises(ValueError, match="smaller than one 4x4 patch|expected 3 input channels"):
        model(torch.randn(1, channels, height, width))


def test_threads_give_serial_results():
    model = tiny_backbone(7, 3, torch.float32)
    sizes = [(64 + 8 * i, 96 + 12 * i) for i in range(6)]
    inputs = [torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(i)) for i, size in enumerate(sizes)]
    with torch.no_grad():
        serial = [model(x) for x in inputs]
    for stage in model.layers:  # the threads build the window plans afresh, concurrently
        stage.blocks[0].plans.clear()
    results, errors = {}, []

    def work(thread: int) -> None:
        try:
            for step in range(len(inputs)):
                i = (thread + step) % len(inputs)
                with torch.no_grad():
                    results[(thread, i)] = model(inputs[i])
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for (_, i), levels in results.items():
        for got, expected in zip(levels, serial[i], strict=True):
            assert torch.equal(got, expected)


def test_caches_are_bounded_for_a_stream_of_sizes():
    model = tiny_backbone(7, 3, torch.float32)
    with torch.no_grad():
        for i in range(40):
            model(torch.randn(1, 3, 64 + 4 * i, 64 + 4 * i))
    caches = {id(block.plans): block.plans for stage in model.layers for block in stage.blocks}
    assert len(caches) == len(model.layers)  # one per stage, shared by its blocks
    assert max(len(c) for c in caches.values()) <= 16
    assert max(c.nbytes for c in caches.values()) <= 64 << 20


def test_deterministic_across_calls_and_modes():
    model = swin.create_model("swin_t", depths=(2, 2, 2, 2)).eval()
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        first, second = model(x), model(x)
    with torch.inference_mode():
        third = model(x)
    assert torch.equal(first, second) and torch.equal(first, third)


def test_load_state_dict_non_strict_reports_missing_and_unexpected():
    model = swin.create_model("swin_t")
    state = model.state_dict()
    state.pop("head.weight")
    state["extra.weight"] = torch.zeros(1)
    result = model.load_state_dict(state, strict=False)
    assert result.missing_keys == ["head.weight"] and result.unexpected_keys == ["extra.weight"]


def test_training_after_inference_mode_at_the_same_size():
    """Plans cached during torch.inference_mode() must not poison a later training step."""
    model = tiny_backbone(7, 3, torch.float32)
    x = torch.randn(1, 3, 72, 88)
    with torch.inference_mode():
        model(x)
    model.train()
    sum(level.mean() for level in model(x)).backward()
    assert model.layers[0].blocks[1].attn.qkv.weight.grad is not None


def test_torch_func_transforms_of_the_input_match_timm():
    """jacrev, jacfwd and grad with respect to the image (saliency, robustness): ATen's fused CPU attention has
    no derivative for its mask under torch.func and no forward AD; each failed. timm's unfused attention is the
    reference."""
    import timm
    from torch.func import grad, jacfwd, jacrev

    tiny = dict(depths=(1, 1, 1, 1), embed_dim=32, num_heads=(1, 1, 1, 1), num_classes=10)
    torch.manual_seed(0)
    reference = timm.create_model("swin_tiny_patch4_window7_224", img_size=32, window_size=2, **tiny).eval()
    model = swin.create_model("swin_t", img_size=32, window_size=2, pretrained=reference.state_dict(), **tiny).eval()
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    expected = jacrev(reference)(x)
    assert expected.abs().max() > 1e-3
    assert (jacrev(model)(x) - expected).abs().max().item() <= 1e-6
    assert (jacfwd(model)(x) - expected).abs().max().item() <= 1e-6
    saliency = grad(lambda image: model(image)[0, 3])(x)
    assert (saliency - expected[0, 3]).abs().max().item() <= 1e-6
