"""``model.set_input_size``: timm's way of building a model for another input size and window, in place.

The windows, shifts and logits are timm's own model's after the same calls (timm resizes the bias tables its own
way, so the structure is compared with timm's resized tables loaded into ours); the resized tables are the
official bicubic fine-tuning resize written out here.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import swin
from swin.weights import convert, export

timm = pytest.importorskip("timm")

SMALL = {"depths": (2, 2, 2, 2)}  # every stage with a shifted block


def _pair(ours_name: str, timm_name: str):
    torch.manual_seed(0)
    ours = swin.create_model(ours_name, **SMALL).eval()
    theirs = timm.create_model(timm_name, **SMALL).eval()
    with torch.no_grad():
        for name, parameter in ours.named_parameters():
            # tables off zero, so that a wrong gather shows; V2's res-post-norms off their zero start, without
            # which attention (and so its windows) would not reach the logits at all
            if name.endswith("relative_position_bias_table") or (ours.config.version == 2 and ".norm" in name):
                parameter.normal_()
    theirs.load_state_dict(export(ours.state_dict(), "timm"))
    return ours, theirs


def _shifts(model) -> list[tuple[int, int]]:
    sizes = model.stage_sizes(*model.config.img_size)
    return [stage.blocks[1].shift_for(*size) for stage, size in zip(model.layers, sizes, strict=True)]


# Successive calls: windows scale with the patch grid from the last explicit ones (224 -> 300 -> 224 gives 7
# again, not 9 * 56 // 75 = 6), a rectangle gets rectangular windows, window_ratio divides the grid.
CALLS = [
    {"img_size": 256},
    {"img_size": 300},
    {"img_size": 224},
    {"img_size": (224, 320)},
    {"img_size": 384, "window_size": 12},
    {"img_size": 256},
    {"img_size": 256, "window_ratio": 8},
    {"window_size": [7, 7, 14, 7]},
]


def test_set_input_size_builds_timm_s_windows_and_logits():
    ours, theirs = _pair("swin_t", "swin_tiny_patch4_window7_224")
    for call in CALLS:
        ours.set_input_size(**call)
        theirs.set_input_size(**call)
        assert [stage.window for stage in ours.layers] == [stage.blocks[1].window_size for stage in theirs.layers]
        assert _shifts(ours) == [stage.blocks[1].shift_size for stage in theirs.layers], call
        assert tuple(ours.config.img_size) == tuple(theirs.patch_embed.img_size)
        assert ours.pretrained_cfg["input_size"] == (3, *theirs.patch_embed.img_size)
        ours.load_state_dict(convert(theirs.state_dict(), source="timm"))  # timm's own table resize
        x = torch.randn(1, 3, *ours.config.img_size)
        with torch.no_grad():
            torch.testing.assert_close(ours(x), theirs(x), atol=1e-4, rtol=1e-4)


def test_swin_v2_set_input_size_matches_timm_without_reloading():
    """V2's continuous position bias has no table to resize: the coordinates alone follow the window."""
    ours, theirs = _pair("swinv2_t_w8", "swinv2_tiny_window8_256")
    for call in [{"img_size": 384}, {"img_size": 256, "window_size": 16}, {"window_size": [8, 8, 16, 8]}]:
        ours.set_input_size(**call)
        theirs.set_input_size(**call)
        x = torch.randn(1, 3, *ours.config.img_size)
        with torch.no_grad():
            torch.testing.assert_close(ours(x), theirs(x), atol=1e-4, rtol=1e-4)


def _official_resize(table: torch.Tensor, window: int) -> torch.Tensor:
    # microsoft/Swin-Transformer utils.load_pretrained, written out: (L1, nH) -> (1, nH, S1, S1) -> bicubic.
    rows, heads = table.shape
    side = int(rows**0.5)
    resized = F.interpolate(
        table.permute(1, 0).view(1, heads, side, side), size=(2 * window - 1, 2 * window - 1), mode="bicubic"
    )
    return resized.view(heads, -1).permute(1, 0)


def test_tables_resized_as_the_official_fine_tuning_and_the_config_describes_the_model():
    torch.manual_seed(0)
    model = swin.create_model("swin_t", **SMALL).eval()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    model.set_input_size(img_size=384, window_size=12)
    for name, parameter in model.named_parameters():
        if name.endswith("relative_position_bias_table"):
            torch.testing.assert_close(parameter, _official_resize(before[name], 12))
            assert parameter.requires_grad
        else:
            assert torch.equal(parameter, before[name]), name
    rebuilt = swin.SwinTransformer(model.config).eval()
    rebuilt.load_state_dict(model.state_dict())  # strict: the config alone rebuilds the same shapes
    x = torch.randn(1, 3, 384, 384)
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(x), model(x), atol=0, rtol=0)


def test_absolute_position_embedding_follows_the_grid():
    """An ape model already interpolates its embedding at other sizes: built for that size, it computes the same."""
    torch.manual_seed(0)
    model = swin.create_model("swin_t", ape=True, **SMALL).eval()
    x = torch.randn(1, 3, 256, 256)
    with torch.no_grad():
        expected = model(x)
        model.set_input_size(img_size=256, window_size=7)
        torch.testing.assert_close(model(x), expected, atol=1e-5, rtol=1e-5)
    assert model.absolute_pos_embed.shape == (1, 64 * 64, 96)
    swin.SwinTransformer(model.config).load_state_dict(model.state_dict())


def test_a_backbone_keeps_its_windows_whole():
    """Detection semantics never shrink a window to its map; the feature maps are unchanged in shape."""
    backbone = swin.create_model("swin_t", features_only=True, **SMALL)
    backbone.set_input_size(img_size=(800, 1344), window_size=12)
    assert [stage.window for stage in backbone.layers] == [(12, 12)] * 4
    maps = backbone(torch.randn(1, 3, 64, 96))
    assert [tuple(m.shape[-2:]) for m in maps] == [(16, 24), (8, 12), (4, 6), (2, 3)]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ({"patch_size": 2}, "patch_size=2: the patch embedding is built for 4"),
        ({"always_partition": True}, "always_partition=True"),
        ({"window_ratio": [8, 8]}, r"window_ratio must be a positive int or one per stage \(4\)"),
        ({"window_size": [7, 7, 7]}, "3 per-stage windows"),
        ({"img_size": 0}, "img_size must be a positive int"),
    ],
)
def test_bad_calls_change_nothing(call, message):
    model = swin.create_model("swin_t", **SMALL)
    config, tables = model.config, [p for n, p in model.named_parameters() if "bias_table" in n]
    with pytest.raises(ValueError, match=message):
        model.set_input_size(img_size=384, **call) if "img_size" not in call else model.set_input_size(**call)
    assert model.config == config
    assert [p for n, p in model.named_parameters() if "bias_table" in n] == tables
    assert all(stage.window == (7, 7) for stage in model.layers)


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"img_size": 3}, "smaller than one 4x4 patch"),
        ({"img_size": (224, 2)}, "smaller than one 4x4 patch"),
        ({"img_size": 224.0}, "img_size must be a positive int"),
        ({"patch_size": 4.0}, "patch_size must be a positive int"),
        ({"window_ratio": 2.0}, "window_ratio must be a positive int"),
        ({"window_ratio": True}, "window_ratio must be a positive int"),
    ],
)
def test_impossible_sizes_are_refused_and_change_nothing(arguments, named):
    """A size under one patch made an empty grid: every window 1x1, the learnt bias tables cut to one row for
    good, and the model refused images of its own size (timm raises there too); a float or bool gave Python's
    'not iterable'."""
    model = swin.create_model("swin_t", **SMALL).eval()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    config = model.config
    with pytest.raises(ValueError, match=named):
        model.set_input_size(**arguments)
    assert model.config == config
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    with pytest.raises(ValueError, match="smaller than one 4x4 patch"):
        swin.create_model("swin_t", img_size=3, **SMALL)


def test_a_window_shrunk_at_the_built_size_is_said_at_a_larger_input():
    """swinv2_t_w16 at its 256 has stage 4's window shrunk to the 8x8 map; at 512 it kept 8 where timm built for
    512 has 16 (logits 3e-3 to 0.4 apart in a review's models, silently). It is said, with the call that builds
    the model timm builds."""
    import warnings as python_warnings

    ours, _ = _pair("swinv2_t_w16", "swinv2_tiny_window16_256")
    with torch.no_grad():  # a position bias that varies across the window
        for name, parameter in ours.named_parameters():
            if "cpb_mlp" in name:
                parameter.normal_(0, 1)
    timm_at_512 = timm.create_model("swinv2_tiny_window16_256", img_size=512, **SMALL).eval()
    timm_at_512.load_state_dict(export(ours.state_dict(), "timm"))
    x = torch.randn(1, 3, 512, 512)
    with torch.no_grad(), python_warnings.catch_warnings():
        python_warnings.simplefilter("error")
        ours(torch.randn(1, 3, 256, 256))  # its own size: nothing to say
        with pytest.warns(UserWarning, match=r"stage 4's window shrank to its 8x8 map .* has 16x16") as said:
            differs = (ours(x) - timm_at_512(x)).abs().max()
        assert differs > 1e-3 and len(said) == 1  # float32 parity with timm: ~1e-6
        assert said[0].filename == __file__  # pointed at the caller's line, not the package's
        ours(x)  # once per model
        advised = swin.create_model("swinv2_t_w16", img_size=(512, 512), **SMALL).eval()
        advised.load_state_dict(ours.state_dict())
        torch.testing.assert_close(advised(x), timm_at_512(x), atol=1e-4, rtol=1e-4)
        backbone = swin.create_model("swinv2_t_w16", features_only=True, **SMALL).eval()  # windows kept whole
        backbone(x)
        # stage 4 not built: nothing it does can differ (it was named in the warning)
        early = swin.create_model("swinv2_t_w16", features_only=True, semantics="classification", out_indices=(0, 1))
        early.eval()(x)
