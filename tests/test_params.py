"""Parameter counts with the 1000-class head: the published figures (paper, timm, torchvision agree)."""

import pytest

import swin

PUBLISHED = {
    "swin_t": 28_288_354,
    "swin_s": 49_606_258,
    "swin_b": 87_768_224,
    "swin_l": 196_532_476,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_count(name):
    model = swin.create_model(name)
    assert sum(p.numel() for p in model.parameters()) == PUBLISHED[name]


def test_derived_buffers_are_not_saved():
    keys = swin.create_model("swin_t").state_dict().keys()
    assert not [k for k in keys if "relative_position_index" in k or "attn_mask" in k]
    assert "layers.0.downsample.reduction.weight" in keys and "layers.3.downsample.reduction.weight" not in keys
    assert "head.weight" in keys and "layers.0.blocks.0.attn.relative_position_bias_table" in keys
