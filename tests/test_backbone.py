"""The detection backbone: shapes at any size, the detection semantics against transformers' SwinBackbone,
freezing, gradient checkpointing, and the errors a user meets."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import swin
from swin.weights import convert


def expected_sizes(height: int, width: int) -> list[tuple[int, int]]:
    sizes = [(math.ceil(height / 4), math.ceil(width / 4))]
    for _ in range(3):
        sizes.append((math.ceil(sizes[-1][0] / 2), math.ceil(sizes[-1][1] / 2)))
    return sizes


@pytest.fixture(scope="module")
def backbone():
    torch.manual_seed(0)
    return swin.create_model("swin_t", features_only=True).eval()


@pytest.mark.parametrize("size", [(800, 1333), (513, 771), (224, 224)])
def test_shapes_at_any_size(backbone, size):
    with torch.no_grad():
        levels = backbone(torch.randn(1, 3, *size))
    assert [tuple(t.shape) for t in levels] == [
        (1, c, h, w) for c, (h, w) in zip((96, 192, 384, 768), expected_sizes(*size), strict=True)
    ]
    assert all(torch.isfinite(t).all() for t in levels)


def test_feature_info(backbone):
    assert backbone.out_channels == [96, 192, 384, 768]
    assert backbone.strides == [4, 8, 16, 32]
    assert [f["num_chs"] for f in backbone.feature_info] == backbone.out_channels
    assert [f["reduction"] for f in backbone.feature_info] == backbone.strides
    keys = backbone.state_dict().keys()
    assert {"norm0.weight", "norm3.weight"} <= set(keys) and "head.weight" not in keys and "norm.weight" not in keys


def test_out_indices_subset():
    model = swin.create_model("swin_t", features_only=True, out_indices=(1, 2)).eval()
    with torch.no_grad():
        levels = model(torch.randn(1, 3, 96, 128))
    assert [t.shape[1] for t in levels] == [192, 384]
    assert len(model.layers) == 3 and model.layers[2].downsample is None  # stage 4 is never built


def _transformers_backbone():
    transformers = pytest.importorskip("transformers")
    config = transformers.SwinConfig(
        image_size=224,
        patch_size=4,
        embed_dim=96,
        depths=[2, 2, 6, 2],
        num_heads=[3, 6, 12, 24],
        window_size=7,
        out_features=["stage1", "stage2", "stage3", "stage4"],
    )
    torch.manual_seed(0)
    reference = transformers.SwinBackbone(config).eval()
    with torch.no_grad():
        for p in reference.parameters():  # random norms and biases too, so every weight is exercised
            p.normal_(0, 0.05)
    return reference


@pytest.mark.parametrize("size", [(520, 760), (97, 131)])
def test_detection_semantics_match_transformers_swin_backbone(size):
    """transformers' SwinBackbone pads each map to a window multiple, then rolls, with the mask over the
    padded map, never shrinks the window and always shifts (``always_partition``): the official detection
    semantics, in an implementation independent of ours. Its norms ``hidden_states_norms.stageN`` are our
    ``norm{N-1}``. 520x760 is not a window multiple at any stage; 97x131 is not even a patch multiple."""
    reference = _transformers_backbone()
    ours = swin.create_model("swin_t", features_only=True).eval()
    weights = convert(reference.state_dict())
    # SwinBackbone also carries the classifier's final LayerNorm ("norm" once converted); it is unused there.
    del weights["norm.weight"], weights["norm.bias"]
    ours.load_state_dict(weights)
    x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = reference(x).feature_maps
        got = ours(x)
    for e, g in zip(expected, got, strict=True):
        assert e.shape == g.shape
        assert (e - g).abs().max().item() <= 1e-5


def test_window_plans_reused_across_sizes_are_correct(backbone):
    x_small, x_large = torch.randn(1, 3, 96, 160), torch.randn(1, 3, 130, 70)
    with torch.no_grad():
        first = backbone(x_small)
        backbone(x_large)
        again = backbone(x_small)
    for a, b in zip(first, again, strict=True):
        assert torch.equal(a, b)


def test_frozen_stages_as_mmdetection():
    model = swin.create_model("swin_t", features_only=True, frozen_stages=2)
    model.train()
    assert not any(p.requires_grad for p in model.patch_embed.parameters())
    assert not any(p.requires_grad for p in model.layers[1].parameters())
    assert not model.norm1.weight.requires_grad and model.norm2.weight.requires_grad
    assert all(p.requires_grad for p in model.layers[2].parameters())
    assert not model.layers[0].training and model.layers[2].training


def test_norm_eval_keeps_batchnorm_in_eval():
    model = swin.create_model("swin_t", features_only=True, norm_eval=True)
    model.extra = torch.nn.BatchNorm2d(4)
    model.train()
    assert model.training and not model.extra.training


def _saved_activation_bytes(model, x):
    """Bytes of the tensors autograd keeps for the backward pass (what checkpointing trades away)."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(x)
    return out, sum(storages.values())


def test_gradient_checkpointing_same_gradients_less_memory():
    torch.manual_seed(0)
    model = swin.create_model("swin_t", features_only=True, drop_path_rate=0.0)
    x = torch.randn(2, 3, 160, 224)
    grads, memory = [], []
    for enabled in (False, True):
        model.zero_grad()
        model.set_grad_checkpointing(enabled)
        out, saved = _saved_activation_bytes(model, x)
        sum(level.square().mean() for level in out).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        memory.append(saved)
    for name, grad in grads[0].items():
        assert torch.allclose(grad, grads[1][name], atol=1e-5), name
    assert memory[1] < 0.6 * memory[0], memory


@pytest.mark.parametrize(
    "make, error, pattern",
    [
        (lambda m: m(torch.randn(1, 3, 3, 64)), ValueError, "smaller than one 4x4 patch"),
        (lambda m: m(torch.randn(1, 1, 3, 64, 64)), ValueError, "4-D tensor.*5-D"),
        (lambda m: m(torch.randn(1, 5, 64, 64)), ValueError, "expected 3 input channels, got 5"),
    ],
)
def test_bad_input(backbone, make, error, pattern):
    with pytest.raises(error, match=pattern):
        make(backbone)


@pytest.mark.parametrize("out_indices", [(0, 4), (-5,), (), (1, 1), (-1, 3)])
def test_bad_out_indices(out_indices):
    with pytest.raises(ValueError, match="out_indices must be distinct stage indices in 0..3"):
        swin.create_model("swin_t", features_only=True, out_indices=out_indices)


@pytest.mark.parametrize(
    "out_indices, channels",
    [(np.array([1, 3]), [192, 768]), (torch.tensor([1, 3]), [192, 768]), (np.int64(2), [384, 768])],
    ids=["numpy", "tensor", "numpy_int"],
)
def test_out_indices_of_numpy_and_torch_integers(out_indices, channels):
    """Indices computed with numpy or torch select stages as ints do (they were refused as not stage indices)."""
    model = swin.create_model("swin_t", features_only=True, out_indices=out_indices, depths=(1, 1, 1, 1))
    assert model.out_channels == channels and all(type(i) is int for i in model.out_indices)


@pytest.mark.parametrize(
    "option, pattern",
    [
        ({"frozen_stages": 1.5}, r"frozen_stages must be an int in -1..4, got 1.5"),
        ({"frozen_stages": True}, r"frozen_stages must be an int"),
        ({"norm_eval": "yes"}, r"norm_eval must be True or False, got 'yes'"),
    ],
)
def test_backbone_options_of_the_wrong_type_name_it(option, pattern):
    """1.5 failed inside range() with Python's own message; 'yes' was taken as true."""
    with pytest.raises(TypeError, match=pattern):
        swin.create_model("swin_t", features_only=True, depths=(1, 1, 1, 1), **option)
    for yes in (1, np.bool_(True)):  # mmdetection configs' spellings of true stay true
        assert swin.create_model("swin_t", features_only=True, depths=(1, 1, 1, 1), norm_eval=yes).norm_eval is True


def test_out_indices_without_features_only_is_an_error():
    """It selects a backbone's stages; a classifier given it ignored it silently."""
    with pytest.raises(TypeError, match="pass features_only=True"):
        swin.create_model("swin_t", out_indices=(1, 2, 3))
    assert swin.create_model("swin_t", depths=(1, 1, 1, 1), out_indices=None).num_classes == 1000


def test_absolute_position_embedding_interpolates():
    model = swin.create_model("swin_t", features_only=True, ape=True).eval()
    assert model.absolute_pos_embed.shape == (1, 56 * 56, 96)
    with torch.no_grad():
        levels = model(torch.randn(1, 3, 100, 140))
    assert levels[0].shape == (1, 96, 25, 35)


@pytest.mark.parametrize("out_indices", [(3, 1), (-1, 0), 2])
def test_out_indices_as_timm_reads_them_come_out_in_stage_order(out_indices):
    """timm's spellings (negative indices, an int for the last n stages) select the stages timm selects; the
    maps come out in stage order, as ``out_channels`` and ``feature_info`` say, so the FPN built from them runs
    whatever order they were asked in."""
    import timm

    from swin.detection import SwinFPN

    reference = timm.create_model(
        "swin_tiny_patch4_window7_224", features_only=True, out_indices=out_indices, depths=(1, 1, 1, 1)
    )
    ours = swin.create_model("swin_t", features_only=True, out_indices=out_indices, depths=(1, 1, 1, 1)).eval()
    assert ours.out_channels == sorted(reference.feature_info.channels()) == ours.feature_info.channels()
    with torch.no_grad():
        x = torch.randn(1, 3, 96, 128)
        assert [level.shape[1] for level in ours(x)] == ours.out_channels
        assert len(SwinFPN(ours)(x)) == len(ours.out_channels) + 1  # and the extra pooled level


@pytest.mark.parametrize("img_size", [64, 96])
def test_an_official_detection_checkpoint_with_ape_loads(img_size):
    """The official detection backbone (Swin-Transformer-Object-Detection) keeps absolute_pos_embed as a
    (1, C, H, W) map and resizes it bicubically to each input's grid; its checkpoints loaded, at the grid they
    were trained at and at another, where they were refused as 'another architecture'. Expected: the map resized
    here with F.interpolate, as that code does."""
    torch.manual_seed(0)
    small = {"depths": (1, 1, 1, 1), "ape": True}
    trained = swin.create_model("swin_t", features_only=True, img_size=64, **small)
    nn.init.normal_(trained.absolute_pos_embed, std=0.5)
    state = {f"backbone.{k}": v for k, v in trained.state_dict().items()}
    grid = 64 // 4
    official = trained.absolute_pos_embed.detach().reshape(1, grid, grid, 96).permute(0, 3, 1, 2)
    state["backbone.absolute_pos_embed"] = official  # the official detection layout: (1, C, H, W)
    model = swin.create_model("swin_t", features_only=True, img_size=img_size, pretrained=state, **small)
    side = img_size // 4
    expected = F.interpolate(official, (side, side), mode="bicubic", align_corners=False) if side != grid else official
    torch.testing.assert_close(model.absolute_pos_embed.detach(), expected.flatten(2).transpose(1, 2))


def test_head_dropout_on_a_backbone_says_it_does_nothing():
    """drop_rate is timm's head dropout; a backbone has no head, so it would be silently ignored (it dropped in
    the blocks before dropout was named as in timm)."""
    with pytest.warns(UserWarning, match="drop_rate=0.3 is the dropout before the classifier head.*proj_drop_rate"):
        backbone = swin.create_model("swin_t", features_only=True, drop_rate=0.3)
    assert not any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in backbone.modules())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        swin.create_model("swin_t", features_only=True, proj_drop_rate=0.3)
