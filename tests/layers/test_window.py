"""Shift masks against timm's block (an independent implementation)."""

from __future__ import annotations

import pytest
import torch

from swin.layers import MASK_VALUE, shift_mask


@pytest.mark.parametrize("resolution, window", [((56, 56), 7), ((28, 28), 7), ((24, 24), 12), ((14, 21), 7)])
def test_shift_mask_equals_timm(resolution, window):
    from timm.models.swin_transformer import SwinTransformerBlock

    block = SwinTransformerBlock(
        dim=8, input_resolution=resolution, num_heads=2, window_size=window, shift_size=window // 2
    )
    expected = block.attn_mask  # (nW, N, N), 0 / -100
    got = shift_mask(*resolution, (window, window), (window // 2, window // 2), torch.device("cpu"))
    assert torch.equal(got, expected)
    assert set(got.unique().tolist()) == {0.0, MASK_VALUE}


def _compile_recording(model):
    """torch.compile(model) with torch's test backend that keeps each graph dynamo makes (and runs it eagerly)."""
    from torch._dynamo.testing import EagerAndRecordGraphs

    torch._dynamo.reset()
    backend = EagerAndRecordGraphs()
    return torch.compile(model, backend=backend), backend.graphs


def test_pinned_window_plans_are_constants_of_a_compiled_graph_and_never_evicted():
    """swin.optimize pins the plans of the size it compiles for (an eager image under pinning_window_plans),
    so that the graph reads them as constants (inductor's freezing then folds the shift masks) instead of
    computing them from an arange on every call. Compiled outputs stay those of eager, and eager calls at
    other sizes (which fill and evict the bounded plan cache) must not make dynamo compile again: its guards
    hold every plan the graph read."""
    import swin
    from swin.layers import pinning_window_plans

    torch.manual_seed(0)
    model = swin.create_model("swin_t", depths=(2, 2), num_heads=(1, 2), embed_dim=32).eval()
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        expected = model(x)
        unpinned, graphs = _compile_recording(model)
        assert torch.allclose(unpinned(x), expected, atol=1e-5)
        assert any(node.target is torch.arange for node in graphs[0].graph.nodes), "plans expected in the graph"

        with pinning_window_plans():
            model(x[:1])
        compiled, graphs = _compile_recording(model)
        assert torch.allclose(compiled(x), expected, atol=1e-5)
        assert len(graphs) == 1
        assert not any(node.target is torch.arange for node in graphs[0].graph.nodes), "plans built in the graph"
        for side in range(160, 500, 32):  # 11 sizes x 3 plans: more than the cache keeps (16)
            model(torch.randn(1, 3, side, side))
        assert torch.allclose(compiled(x), expected, atol=1e-5)
        assert len(graphs) == 1, "compiled again after the plan cache evicted"


def test_pinned_plans_have_a_byte_budget_and_are_dropped_on_unpin():
    """Pins are kept apart from the LRU's entries, within a budget of their own; unpinning (swin.optimize does
    when it compiles again) frees them."""
    from swin.layers import WindowPlans, build_window_plan, pinning_window_plans, unpin_window_plans
    from swin.layers.lru import BoundedLRU

    plan = build_window_plan(56, 56, (7, 7), (3, 3), False, torch.device("cpu"))
    cache = BoundedLRU(max_items=16, max_bytes=2 * plan.nbytes)
    assert cache.pin("a", plan) and cache.pin("b", plan) and cache.pin("a", plan)  # (the same key: no more)
    assert not cache.pin("c", plan), "pinned past the byte budget"
    assert cache.pinned("a") is plan and cache.pinned("c") is None and cache.pinned_nbytes == 2 * plan.nbytes
    assert len(cache) == 0  # pins are not LRU entries
    cache.unpin_all()
    assert cache.pinned("a") is None and cache.pinned_nbytes == 0

    import swin

    model = swin.create_model("swin_t", depths=(2, 2), num_heads=(1, 2), embed_dim=32).eval()
    with torch.no_grad(), pinning_window_plans():
        model(torch.randn(1, 3, 224, 224))
    plans = [block.plans for stage in model.layers for block in stage.blocks]
    assert all(isinstance(p, WindowPlans) and p._cache.pinned_nbytes > 0 for p in plans)
    unpin_window_plans(model)
    assert all(p._cache.pinned_nbytes == 0 for p in plans)


def test_a_forward_under_fake_tensors_leaves_real_plans():
    """Shape inference under ``FakeTensorMode`` (as tools that trace do) must not leave fake window plans in the
    cache: the next real forward computes real values, timm's for the same weights."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ..conftest import timm_pair

    reference, ours = timm_pair("swin_t", shape={"depths": (2,), "num_heads": (3,)}, img_size=(112, 112))
    x = torch.randn(1, 3, 112, 112)
    with torch.no_grad():
        with FakeTensorMode(allow_non_fake_inputs=True) as fake:
            ours(fake.from_tensor(x))
        out = ours(x)
        assert type(out) is torch.Tensor
        assert (out - reference(x)).abs().max().item() <= 1e-5


def test_a_model_moved_to_another_device_lets_go_of_the_plans_of_the_one_it_left():
    """Plans are cached per device: after ``.to(device)`` those of the old device held its memory (19 MB of CPU
    plans after a move to ``meta``; on a GPU -> CPU move, GPU memory) until enough new sizes evicted them."""
    import swin

    model = swin.create_model("swin_t", depths=(1, 1, 1, 1)).eval()
    cache = model.layers[0].blocks[0].plans._cache
    with torch.no_grad():
        model(torch.randn(1, 3, 224, 224))
        assert {key[-1].type for key in cache._entries} == {"cpu"}
        model.to("meta")
        model(torch.empty(1, 3, 224, 224, device="meta"))
    assert {key[-1].type for key in cache._entries} == {"meta"}


def test_dynamic_sizes_make_one_graph_when_nothing_is_pinned():
    """A user's torch.compile(dynamic=True) builds the plans in one graph for every size: the pinned-plan lookup
    (swin.optimize's) hashed the symbolic size and fixed it, so each new size compiled again (35 s each for a
    one-block swin_t)."""
    from torch._dynamo.testing import EagerAndRecordGraphs

    from swin.layers import WindowPlans

    plans = WindowPlans()

    def attend(x: torch.Tensor) -> torch.Tensor:
        batch, height, width, channels = x.shape
        plan = plans.get(height, width, (7, 7), (3, 3), False, x.device)
        return x.reshape(batch, height * width, channels).index_select(1, plan.gather)

    torch._dynamo.reset()
    backend = EagerAndRecordGraphs()
    compiled = torch.compile(attend, backend=backend, dynamic=True)
    for side in (14, 21, 28):
        x = torch.randn(1, side, side, 2)
        torch.testing.assert_close(compiled(x), attend(x))
    assert len(backend.graphs) == 1
