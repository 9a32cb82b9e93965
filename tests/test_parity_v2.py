"""Swin V2 logits equal the independent implementations (timm, torchvision) given the same weights.

Every registered V2 architecture is compared at its native size, window, width, heads, pretrained window
sizes and classes. To keep the file near two minutes on two cores, the S/B/L models run with two blocks per
stage (a regular and a shifted one, every stage kept) unless SWIN_FULL_PARITY=1 asks for the full depths.
"""

from __future__ import annotations

import os

import pytest
import torch

import swin
from swin.weights import convert, detect_layout, export

TOLERANCE = 1e-5
V2_MODELS = [name for name in swin.list_models() if swin.get_config(name).version == 2]
FULL = os.environ.get("SWIN_FULL_PARITY") == "1"


def _depths(name: str) -> dict:
    """Depth override for the expensive models (none for the T models or with SWIN_FULL_PARITY=1)."""
    return {} if FULL or name.startswith("swinv2_t") else {"depths": (2, 2, 2, 2)}


def _perturb(model: torch.nn.Module) -> torch.nn.Module:
    """Move every parameter off its initial value: a fresh V2 model has zero q/v biases, unit norms and one
    logit scale for all heads, which would hide a bias or norm loaded into the wrong place."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.02 * torch.randn(param.shape, generator=generator))
    return model


def _timm_pair(name: str):
    import timm

    torch.manual_seed(0)
    reference = _perturb(timm.create_model(swin.get_config(name).aliases[0], **_depths(name))).eval()
    ours = swin.create_model(name, **_depths(name)).eval()
    ours.load_state_dict(convert(reference.state_dict(), source="timm"))
    return reference, ours


def test_every_timm_v2_model_is_registered():
    import timm

    aliases = {swin.get_config(name).aliases[0] for name in V2_MODELS}
    assert aliases == {name for name in timm.list_models("swinv2_*") if not name.startswith("swinv2_cr_")}
    assert len(V2_MODELS) == 12


@pytest.mark.parametrize("name", V2_MODELS)
def test_matches_timm_at_native_size(name):
    reference, ours = _timm_pair(name)
    config = swin.get_config(name)
    timm_windows = [stage.blocks[0].attn.pretrained_window_size[0] for stage in reference.layers]
    assert timm_windows == list(config.pretrained_window_sizes)
    x = torch.randn(1, 3, *config.img_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, got = reference(x), ours(x)
    assert got.shape == (1, config.num_classes) == expected.shape
    assert (got - expected).abs().max().item() <= TOLERANCE


@pytest.mark.parametrize(
    "name, ours_name", [("swin_v2_t", "swinv2_t_w8"), ("swin_v2_s", "swinv2_s_w8"), ("swin_v2_b", "swinv2_b_w8")]
)
def test_matches_torchvision(name, ours_name):
    torchvision = pytest.importorskip("torchvision")
    from torchvision.models.swin_transformer import PatchMergingV2, SwinTransformer, SwinTransformerBlockV2

    torch.manual_seed(0)
    if _depths(ours_name):
        # torchvision's own builder arguments for this model, with the shortened depths.
        config = swin.get_config(ours_name)
        reference = SwinTransformer(
            patch_size=[4, 4],
            embed_dim=config.embed_dim,
            depths=[2, 2, 2, 2],
            num_heads=list(config.num_heads),
            window_size=[8, 8],
            stochastic_depth_prob=0.2,
            block=SwinTransformerBlockV2,
            downsample_layer=PatchMergingV2,
        )
    else:
        reference = getattr(torchvision.models, name)()
    reference = _perturb(reference).eval()
    # torchvision zeroes the k third of its fused qkv bias in every forward: perturbing it must not matter.
    assert detect_layout(reference.state_dict()) == "torchvision"
    ours = swin.create_model(ours_name, **_depths(ours_name)).eval()
    ours.load_state_dict(convert(reference.state_dict(), source="torchvision"))
    x = torch.randn(1, 3, 256, 256, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert (ours(x) - reference(x)).abs().max().item() <= TOLERANCE


def test_window12_checkpoint_in_window16_model_matches_timm():
    """A 192/window-12 pre-training loaded into the 256/window-16 fine-tuning architecture: both keep the
    pre-training's coordinate scaling through pretrained_window_sizes (12, 12, 12, 6)."""
    import timm

    torch.manual_seed(0)
    depths = _depths("swinv2_b_w12to16_256")
    pretrained = _perturb(timm.create_model("swinv2_base_window12_192", num_classes=10, **depths)).state_dict()
    reference = timm.create_model("swinv2_base_window12to16_192to256", num_classes=10, **depths).eval()
    reference.load_state_dict(pretrained)
    ours = swin.create_model("swinv2_b_w12to16_256", num_classes=10, **depths).eval()
    ours.load_state_dict(convert(pretrained, source="timm"))
    # The coordinates the position bias MLP sees are timm's, block by block; without the pretrained window
    # sizes they would be those of window 16 (8 in stage 4).
    plain = swin.create_model("swinv2_b_w16", num_classes=10, **depths)
    for stage, timm_stage, plain_stage in zip(ours.layers, reference.layers, plain.layers, strict=True):
        for block, timm_block, plain_block in zip(stage.blocks, timm_stage.blocks, plain_stage.blocks, strict=True):
            expected = timm_block.attn.relative_coords_table.reshape(-1, 2)
            torch.testing.assert_close(block.attn.relative_coords_table, expected)
            assert not torch.allclose(block.attn.relative_coords_table, plain_block.attn.relative_coords_table)
    assert ours.layers[3].blocks[0].attn.pretrained_window == (6, 6)
    x = torch.randn(1, 3, 256, 256, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert (ours(x) - reference(x)).abs().max().item() <= TOLERANCE


def test_official_layout_is_ours_and_timm_round_trips():
    """Our keys are the official V2 keys: timm's own filter turns our official export into its layout."""
    from timm.models.swin_transformer_v2 import checkpoint_filter_fn

    reference, ours = _timm_pair("swinv2_t_w8")
    keys = set(ours.state_dict())
    assert {
        "layers.0.blocks.0.attn.q_bias",
        "layers.0.blocks.0.attn.v_bias",
        "layers.0.blocks.0.attn.logit_scale",
    } <= keys
    assert {"layers.0.blocks.0.attn.cpb_mlp.0.weight", "layers.0.blocks.0.attn.cpb_mlp.2.weight"} <= keys
    assert "layers.0.downsample.norm.weight" in keys and ours.state_dict()["layers.0.downsample.norm.weight"].shape == (
        192,
    )
    assert not any(k.endswith(("relative_coords_table", "relative_position_index", "k_bias")) for k in keys)
    official = export(ours.state_dict(), target="official")
    assert detect_layout(official) == "official"
    timm_sd = checkpoint_filter_fn({"model": official}, reference)
    for key, value in reference.state_dict().items():
        assert torch.equal(timm_sd[key], value), key
    back = export(ours.state_dict(), target="timm")
    assert set(back) == set(reference.state_dict())


def test_position_bias_follows_new_weights_and_gets_gradients():
    _, ours = _timm_pair("swinv2_t_w8")
    attn = ours.layers[0].blocks[1].attn
    x = torch.randn(1, 3, 256, 256, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        first = ours(x)
        attn.cpb_mlp[2].weight.mul_(2.0)
        changed = ours(x)
    assert not torch.equal(first, changed)
    fresh = swin.create_model("swinv2_t_w8").eval()
    fresh.load_state_dict(ours.state_dict())
    with torch.no_grad():
        assert torch.equal(fresh(x), changed)
    # With autograd gradients reach the MLP and the temperature.
    ours(x).sum().backward()
    assert attn.cpb_mlp[0].weight.grad is not None and attn.logit_scale.grad is not None


def test_config_validation():
    with pytest.raises(ValueError, match="version must be 1"):
        swin.get_config("swin_t").replace(version=3)
    with pytest.raises(ValueError, match="Swin V2 only"):
        swin.get_config("swin_t").replace(pretrained_window_sizes=(12, 12, 12, 6))
    with pytest.raises(ValueError, match="one entry per stage"):
        swin.get_config("swinv2_t_w8").replace(pretrained_window_sizes=(12, 12, 6))
    assert swin.get_config("swinv2_b_w12to24_384").pretrained_window_sizes == (12, 12, 12, 6)


def test_initialisation_starts_post_norms_at_zero_as_timm():
    """Official V2 (``_init_respostnorm``) and timm start every block's res-post-norms at zero, so that each
    residual block begins as the identity: training from scratch depends on it."""
    import timm

    reference = timm.create_model("swinv2_tiny_window8_256", depths=(1, 1, 1, 1))
    ours = swin.create_model("swinv2_t_w8", depths=(1, 1, 1, 1))
    theirs = dict(reference.named_parameters())
    mine = convert(dict(reference.named_parameters()), source="timm")
    for name, parameter in ours.named_parameters():
        if ".norm1." in name or ".norm2." in name:
            assert torch.equal(parameter, mine[name]), name
    assert any(".norm1." in name and not bool(value.any()) for name, value in theirs.items())


def test_below_the_built_size_the_window_is_kept_and_building_for_the_size_shrinks_it():
    """README, semantics at unusual sizes: at 224 swinv2_t_w8's stage 4 is 7x7 against a window of 8. The
    model built at 256 pads it up to one window, as timm's dynamic_img_size=True; built for 224 it shrinks the
    window to 7, as timm built for 224 (the same weights: V2's bias is computed for any window)."""
    import timm

    reference, _ = _timm_pair("swinv2_t_w8")
    with torch.no_grad():  # residual post-norms near 1, not near their initial 0: every block counts
        for module in reference.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.uniform_(0.8, 1.2, generator=torch.Generator().manual_seed(2))
    weights = reference.state_dict()
    ours = swin.create_model("swinv2_t_w8", pretrained=weights).eval()
    dynamic = timm.create_model("swinv2_tiny_window8_256", dynamic_img_size=True).eval()
    built = timm.create_model("swinv2_tiny_window8_256", img_size=224).eval()
    dynamic.load_state_dict(weights)
    built.load_state_dict(weights)
    ours_224 = swin.create_model("swinv2_t_w8", img_size=224, pretrained=weights).eval()
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (ours(x) - dynamic(x)).abs().max().item() <= TOLERANCE
        assert (ours_224(x) - built(x)).abs().max().item() <= TOLERANCE
        assert (ours(x) - built(x)).abs().max().item() > 100 * TOLERANCE  # the two really differ here
