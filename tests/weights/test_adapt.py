"""Adapting a checkpoint to another window, input channels or classifier, and refusing another architecture.

Window-size adaptation, which method each implementation uses:
- ours, like the official fine-tuning code (microsoft/Swin-Transformer ``utils.load_pretrained``): the
  (2M-1) x (2M-1) table per head is resized with ``F.interpolate(mode="bicubic")`` (uniform grid,
  ``align_corners=False``);
- timm (``resize_rel_pos_bias_table``, without scipy installed): linear interpolation on a non-uniform grid
  whose spacing grows geometrically away from the centre (BEiT's scheme).
They agree exactly on tables that are constant per head and at the zero offset, not in general; so the
end-to-end comparison with timm's own loading uses per-head-constant tables, and the random-table case
is checked against the official formula written out here.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import swin
from swin.weights import adapt_input_conv, convert, export, fit_state_dict, resize_relative_position_bias_table
from tests.weights.conftest import torch_bytes


def official_resize(table: torch.Tensor, new_rows: int) -> torch.Tensor:
    """The official fine-tuning code's resize, transcribed (L1, nH) -> (L2, nH)."""
    length, heads = table.size()
    s1, s2 = int(length**0.5), int(new_rows**0.5)
    resized = F.interpolate(table.permute(1, 0).view(1, heads, s1, s1), size=(s2, s2), mode="bicubic")
    return resized.view(heads, new_rows).permute(1, 0)


@pytest.fixture(scope="module")
def official_w7():
    """A window-7 swin_t checkpoint in the official layout, from timm's random weights."""
    import timm

    torch.manual_seed(0)
    reference = timm.create_model("swin_tiny_patch4_window7_224")
    return export(convert(reference.state_dict(), source="timm"), target="official")


def test_resize_matches_the_official_formula():
    table = torch.randn(169, 3, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(resize_relative_position_bias_table(table, (12, 12)), official_resize(table, 529))
    assert resize_relative_position_bias_table(table, (7, 7)) is table


def test_window7_checkpoint_into_window12_model_at_384(tmp_path, official_w7):
    """Random tables: every table of the 384/window-12 model is the official bicubic resize of the
    checkpoint's; with the same tables, timm's window-12 model gives the same outputs."""
    import timm

    path = tmp_path / "w7.pth"
    path.write_bytes(torch_bytes({"model": official_w7}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = swin.create_model("swin_t", img_size=384, window_size=12, pretrained=path).eval()
    tables = {k: v for k, v in model.state_dict().items() if k.endswith("relative_position_bias_table")}
    assert len(tables) == 12 and all(v.shape[0] == 23 * 23 for v in tables.values())
    for key, value in tables.items():
        torch.testing.assert_close(value, official_resize(official_w7[key], 529))

    reference = timm.create_model("swin_tiny_patch4_window7_224", img_size=384, window_size=12).eval()
    reference.load_state_dict(export(model.state_dict(), target="timm"))
    image = torch.randn(1, 3, 384, 384, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert (model(image) - reference(image)).abs().max().item() <= 1e-5


def test_window_resize_against_timm_own_loading(tmp_path, official_w7):
    """Per-head-constant tables, where both methods are exact: timm's model loaded by timm's own
    checkpoint_filter_fn (its own resize) and ours loaded by create_model give the same outputs."""
    import timm
    from timm.models.swin_transformer import checkpoint_filter_fn

    checkpoint = dict(official_w7)
    for key in [k for k in checkpoint if k.endswith("relative_position_bias_table")]:
        heads = checkpoint[key].shape[1]
        checkpoint[key] = torch.linspace(-1, 1, heads).expand(169, heads).clone()
    reference = timm.create_model("swin_tiny_patch4_window7_224", img_size=384, window_size=12).eval()
    reference.load_state_dict(checkpoint_filter_fn({"model": checkpoint}, reference))
    path = tmp_path / "w7_const.pth"
    path.write_bytes(torch_bytes({"model": checkpoint}))
    model = swin.create_model("swin_t", img_size=384, window_size=12, pretrained=path).eval()
    image = torch.randn(1, 3, 384, 384, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert (model(image) - reference(image)).abs().max().item() <= 1e-5


def test_zero_offset_is_kept_by_both_methods():
    from timm.layers import resize_rel_pos_bias_table

    table = torch.randn(169, 4, generator=torch.Generator().manual_seed(4))
    ours = resize_relative_position_bias_table(table, (12, 12)).view(23, 23, 4)
    theirs = resize_rel_pos_bias_table(table, new_window_size=(12, 12), new_bias_shape=(529, 4)).view(23, 23, 4)
    torch.testing.assert_close(ours[11, 11], table.view(13, 13, 4)[6, 6])
    torch.testing.assert_close(theirs[11, 11], table.view(13, 13, 4)[6, 6])


@pytest.mark.parametrize("in_chans", [1, 2, 5])
def test_in_chans_as_timm(official_w7, in_chans):
    from timm.models import adapt_input_conv as timm_adapt

    weight = official_w7["patch_embed.proj.weight"]
    torch.testing.assert_close(adapt_input_conv(weight, in_chans), timm_adapt(in_chans, weight))


def test_in_chans_through_create_model(tmp_path, official_w7):
    from timm.models import adapt_input_conv as timm_adapt

    path = tmp_path / "w.pth"
    path.write_bytes(torch_bytes({"model": official_w7}))
    # said, not silent (timm logs it; a strict checkpoint_path= load adapts it too, where timm's refuses)
    with pytest.warns(UserWarning, match=r"patch embedding takes 3 input channels and the model 4: adapted as timm"):
        model = swin.create_model("swin_t", in_chans=4, pretrained=path)
    expected = timm_adapt(4, official_w7["patch_embed.proj.weight"])
    torch.testing.assert_close(model.patch_embed.proj.weight.detach(), expected)
    with pytest.warns(UserWarning, match=r"takes 3 input channels and the model 1: adapted .*\(summed over them\)"):
        swin.create_model("swin_t", in_chans=1, checkpoint_path=path)


def test_other_num_classes_drops_the_head_with_a_warning(tmp_path, official_w7):
    path = tmp_path / "w.pth"
    path.write_bytes(torch_bytes({"model": official_w7}))
    with pytest.warns(UserWarning, match=r"classifier has 1000 classes and the model 10.*num_classes=1000") as record:
        model = swin.create_model("swin_t", num_classes=10, pretrained=path)
    assert "head.weight" in str(record[0].message)
    assert model.head.weight.shape == (10, 768)
    key = "layers.2.blocks.5.mlp.fc2.weight"
    assert torch.equal(model.state_dict()[key], official_w7[key])


def test_a_head_that_half_fits_is_not_half_loaded(tmp_path, official_w7):
    """With global_pool='catavgmax' the classifier takes 2C features: the checkpoint's 1000-class weight no
    longer fits, and its bias (which would) must not be loaded alone (timm refuses such a head outright)."""
    path = tmp_path / "w.pth"
    state = {**official_w7, "head.bias": torch.ones(1000)}  # a trained bias (an initial one is zero)
    path.write_bytes(torch_bytes({"model": state}))
    with pytest.warns(UserWarning, match=r"takes 768 features and the model's 1536") as record:
        model = swin.create_model("swin_t", global_pool="catavgmax", pretrained=path)
    assert "head.bias" in str(record[0].message) and "head.weight" in str(record[0].message)
    assert model.head.weight.shape == (1000, 1536)
    assert not model.head.bias.detach().eq(1).any()


def _shapes_of(name: str) -> dict[str, torch.Tensor]:
    with torch.device("meta"):
        model = swin.create_model(name)
    return {k: torch.empty(v.shape, device="meta") for k, v in model.state_dict().items()}


def test_other_architecture_is_an_error_naming_the_keys():
    with torch.device("meta"):
        tiny = swin.create_model("swin_t")
    expected = r"patch_embed\.proj\.weight: checkpoint \(128, 3, 4, 4\) vs model \(96, 3, 4, 4\)"
    with pytest.raises(ValueError, match=expected):
        fit_state_dict(_shapes_of("swin_b"), tiny, origin="swin_b.pth")
    with pytest.raises(ValueError, match=r"layers\.2\.blocks\.6\..*another architecture"):
        fit_state_dict(_shapes_of("swin_s"), tiny, origin="swin_s.pth")  # same widths, deeper stage 3


def test_detection_norms_pass_through_conversion():
    sd = {f"norm{i}.weight": torch.ones(96 * 2**i) for i in range(4)}
    sd["layers.0.downsample.reduction.weight"] = torch.zeros(192, 384)
    assert set(convert(sd)) == set(sd)
    assert set(convert({f"backbone.{k}": v for k, v in sd.items()})) == set(sd)
