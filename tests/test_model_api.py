"""The model's public surface: heads, features, overrides and the errors a user meets."""

from __future__ import annotations

import pytest
import torch

import swin


@pytest.fixture(scope="module")
def tiny():
    return swin.create_model("swin_t").eval()


def test_num_classes_zero_gives_pooled_features():
    model = swin.create_model("swin_t", num_classes=0).eval()
    with torch.no_grad():
        out = model(torch.randn(1, 3, 224, 224))
    assert out.shape == (1, 768)


def test_forward_features_and_head(tiny):
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        features = tiny.forward_features(x)
        assert features.shape == (1, 768, 7, 7)
        assert tiny.output_fmt == "NCHW"  # timm's attribute, saying so (timm's Swin: NHWC)
        assert torch.allclose(tiny.forward_head(features), tiny(x))
        assert tiny.forward_head(features, pre_logits=True).shape == (1, 768)


def test_reset_classifier():
    model = swin.create_model("swin_t")
    model.reset_classifier(10)
    assert model(torch.randn(1, 3, 224, 224)).shape == (1, 10)
    model.reset_classifier(0)
    assert model(torch.randn(1, 3, 224, 224)).shape == (1, 768)


def test_overrides():
    model = swin.create_model("swin_t", in_chans=1, num_classes=5, drop_path_rate=0.3, window_size=8, img_size=256)
    assert model.patch_embed.proj.in_channels == 1
    assert model.layers[0].blocks[0].window == (8, 8)
    assert model(torch.randn(1, 1, 256, 256)).shape == (1, 5)


def test_timm_alias_resolves():
    assert swin.create_model("swin_tiny_patch4_window7_224").config.name == "swin_t"


def test_wrong_channel_count(tiny):
    with pytest.raises(ValueError, match="expected 3 input channels, got 4"):
        tiny(torch.randn(1, 4, 224, 224))


def test_three_dimensional_input(tiny):
    with pytest.raises(ValueError, match=r"4-D tensor.*3-D.*unsqueeze"):
        tiny(torch.randn(3, 224, 224))


def test_image_smaller_than_a_patch(tiny):
    with pytest.raises(ValueError, match="smaller than one 4x4 patch"):
        tiny(torch.randn(1, 3, 2, 224))


def test_unknown_name_suggests_close_ones():
    with pytest.raises(KeyError, match=r"unknown model 'swin_tt'.*swin_t"):
        swin.create_model("swin_tt")


@pytest.mark.parametrize(
    "override, pattern",
    [
        ({"embed_dim": "96"}, "embed_dim.*expects int"),
        ({"depths": 4}, "depths.*expects a list"),
        ({"window_size": 7.5}, "window_size.*expects an int"),
        ({"qkv_bias": 1}, "qkv_bias.*expects bool"),
        ({"windowsize": 7}, "unknown config field.*windowsize.*did you mean windowsize: window_size"),
        ({"features_only": True, "frozen_stage": 1}, r"did you mean frozen_stage: frozen_stages\?"),
        ({"trainable_layers": 3}, r"trainable_layers: frozen_stages \(torchvision's"),
        ({"global_pol": "max"}, r"did you mean global_pol: global_pool\?"),
        ({"zzz": 3}, r"\['zzz'\]; valid fields are .*with features_only=True the backbone's options \['frozen_stages'"),
    ],
)
def test_override_with_wrong_type(override, pattern):
    with pytest.raises(TypeError, match=pattern):
        swin.create_model("swin_t", **override)


def test_inconsistent_heads():
    with pytest.raises(ValueError, match="not divisible by num_heads"):
        swin.create_model("swin_t", num_heads=(5, 6, 12, 24))


@pytest.mark.parametrize("name", ["swin_t", "swinv2_t_w8"])
def test_built_on_meta_then_loaded_computes_like_timm(name):
    """A model built on the meta device, ``to_empty()`` and loaded has garbage in the buffers a checkpoint does
    not carry (position indices and coordinates); ``init_non_persistent_buffers()`` (timm's name) rebuilds them,
    and the model then computes timm's logits for the same weights."""
    import timm

    from swin.weights import convert

    torch.manual_seed(0)
    reference = timm.create_model(swin.get_config(name).aliases[0], depths=(1, 1, 1, 1)).eval()
    with torch.no_grad():
        for parameter in reference.parameters():  # off the initial values (V2's post-norms start at zero)
            parameter.add_(0.02 * torch.randn_like(parameter))
    with torch.device("meta"):
        ours = swin.create_model(name, depths=(1, 1, 1, 1))
    ours = ours.to_empty(device="cpu").eval()
    ours.load_state_dict(convert(reference.state_dict(), source="timm"))
    ours.init_non_persistent_buffers()
    x = torch.randn(1, 3, *swin.get_config(name).img_size)
    with torch.no_grad():
        assert (ours(x) - reference(x)).abs().max().item() <= 1e-4


def test_reset_classifier_keeps_the_models_dtype():
    """A model in bf16 (or on a GPU) gets its new head in its dtype (and on its device): the forward runs."""
    model = swin.create_model("swin_t", depths=(1, 1, 1, 1)).to(torch.bfloat16).eval()
    model.reset_classifier(10)
    assert model.head.weight.dtype == torch.bfloat16
    with torch.no_grad():
        assert model(torch.randn(1, 3, 64, 64, dtype=torch.bfloat16)).shape == (1, 10)
