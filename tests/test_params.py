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


@pytest.mark.parametrize(
    "name,overrides,features_only",
    [
        ("swin_t", {}, False),
        ("swin_b_384", {"num_classes": 21841}, False),
        ("swinv2_t_w8", {}, False),
        ("swinv2_b_w12to24_384", {}, False),
        ("swinv2_s_w16", {"qkv_bias": False, "num_classes": 0}, False),
        ("swin_t", {"ape": True, "in_chans": 1, "patch_norm": False, "img_size": 96}, False),
        ("swin_t", {}, True),
        ("swinv2_t_w8", {"img_size": 160}, True),
    ],
)
def test_arithmetic_count_equals_the_built_model(name, overrides, features_only):
    """``swin list`` counts parameters from the config alone; the built model is the independent count."""
    import torch

    from swin.registry.params import count_parameters

    config = swin.get_config(name).replace(**overrides)
    with torch.device("meta"):
        model = swin.create_model(name, features_only=features_only, **overrides)
    assert count_parameters(config, features_only=features_only) == sum(p.numel() for p in model.parameters())
