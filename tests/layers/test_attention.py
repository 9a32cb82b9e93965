"""Relative position bias index, and the bias following the weights."""

from __future__ import annotations

import torch

import swin
from swin.layers import WindowAttention, relative_position_index


def test_index_equals_timm():
    from timm.models.swin_transformer import get_relative_position_index

    for window in [(7, 7), (12, 12), (5, 7)]:
        assert torch.equal(relative_position_index(window), get_relative_position_index(*window))


def test_cached_bias_follows_new_weights():
    model = swin.create_model("swin_t").eval()
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        before = model(x)
        model.layers[0].blocks[1].attn.relative_position_bias_table.add_(1.0)
        after = model(x)
    assert not torch.allclose(before, after)
    fresh = swin.create_model("swin_t").eval()
    fresh.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert torch.equal(fresh(x), after)


def test_derived_buffers_are_not_saved():
    attention = WindowAttention(8, 2, (4, 4))
    assert set(attention.state_dict()) == {
        "qkv.weight",
        "qkv.bias",
        "proj.weight",
        "proj.bias",
        "relative_position_bias_table",
    }


def test_v2_coordinates_table_survives_a_dtype_round_trip():
    """The table is derived: after ``.bfloat16().float()`` it must be what a fresh model computes (it stayed
    rounded to bf16, and the position bias moved by 0.03), as the official construction gives it."""
    torch.manual_seed(0)
    model = swin.create_model("swinv2_t_w8", depths=(1, 1, 1, 1)).eval()
    fresh = swin.create_model("swinv2_t_w8", depths=(1, 1, 1, 1)).eval()
    fresh.load_state_dict(model.state_dict())
    model.bfloat16().float()
    for ours, theirs in zip(model.modules(), fresh.modules(), strict=True):
        if hasattr(ours, "relative_coords_table"):
            assert ours.relative_coords_table.dtype == torch.float32
            assert torch.equal(ours.relative_coords_table, theirs.relative_coords_table)


def test_derived_buffers_after_assigning_weights_to_a_meta_model():
    """``load_state_dict(assign=True)`` into a model built on ``meta`` leaves the derived buffers there; the
    method timm names for rebuilding them must make them on the weights' device (the forward failed)."""
    source = swin.create_model("swinv2_t_w8", depths=(1, 1, 1, 1)).eval()
    with torch.device("meta"):
        model = swin.create_model("swinv2_t_w8", depths=(1, 1, 1, 1))
    model.load_state_dict(source.state_dict(), assign=True)
    model.init_non_persistent_buffers()
    x = torch.randn(1, 3, 256, 256)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x), source(x))
