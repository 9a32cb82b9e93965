"""The timm model API on our models, checked against timm's own models with the same weights."""

from __future__ import annotations

import pytest
import torch

import swin
from swin.weights import export

timm = pytest.importorskip("timm")
from timm.data import resolve_model_data_config  # noqa: E402

SMALL = {"depths": (2, 2, 2, 2)}  # every stage with a shifted block; full depth proves nothing more here
TIMM_T = "swin_tiny_patch4_window7_224"


@pytest.fixture(scope="module")
def pair():
    """One model and timm's with the same weights, for the tests that do not change them."""
    return _pair()


def _pair(global_pool: str = "avg", **kwargs):
    torch.manual_seed(0)
    ours = swin.create_model("swin_t", global_pool=global_pool, **SMALL, **kwargs).eval()
    theirs = timm.create_model(TIMM_T, global_pool=global_pool, **SMALL, **kwargs).eval()
    theirs.load_state_dict(export(ours.state_dict(), "timm"))
    return ours, theirs


@pytest.mark.parametrize(
    "name",
    ["swin_t", "swin_t.ms_in22k", "swin_b_384.ms_in22k_ft_in1k", "swin_l.ms_in22k", "swinv2_b_w12to24_384"],
)
def test_pretrained_cfg_resolves_like_timm(name):
    """timm's data helpers read our pretrained_cfg as they read a timm model's (its registered config)."""
    from timm.data import resolve_data_config
    from timm.models import get_pretrained_cfg

    arch, _, tag = name.partition(".")
    ours = swin.create_model(name, depths=(1, 1, 1, 1))  # the preprocessing does not depend on depth
    alias = {
        "swin_t": TIMM_T,
        "swin_b_384": "swin_base_patch4_window12_384",
        "swin_l": "swin_large_patch4_window7_224",
        "swinv2_b_w12to24_384": "swinv2_base_window12to24_192to384",
    }[arch]
    theirs = get_pretrained_cfg(f"{alias}.{tag}" if tag else alias).to_dict()
    assert resolve_model_data_config(ours) == resolve_data_config(pretrained_cfg=theirs)
    assert ours.num_classes == theirs["num_classes"]
    assert ours.pretrained_cfg["tag"] == theirs["tag"]
    assert ours.default_cfg == ours.pretrained_cfg


def test_pretrained_cfg_of_a_timm_model_matches():
    assert resolve_model_data_config(swin.create_model("swin_t", **SMALL)) == resolve_model_data_config(
        timm.create_model(TIMM_T, **SMALL)
    )


def test_timm_full_name_with_tag_selects_that_config():
    ours = swin.create_model(f"{TIMM_T}.ms_in22k")
    assert ours.config.name == "swin_t" and ours.num_classes == 21841
    assert ours.pretrained_cfg["tag"] == "ms_in22k"


def test_name_tag_and_a_different_pretrained_tag_is_an_error():
    with pytest.raises(ValueError, match="two different weights"):
        swin.create_model("swin_t.ms_in22k", pretrained="ms_in1k")
    with pytest.raises(KeyError, match="no pretrained tag"):
        swin.create_model("swin_t.no_such_tag")


@pytest.mark.parametrize("out_indices", [(0, 1, 2, 3), (1, 3), (2,)])
def test_feature_info_answers_like_timm(out_indices):
    ours = swin.create_model("swin_t", features_only=True, out_indices=out_indices, **SMALL)
    theirs = timm.create_model(TIMM_T, features_only=True, out_indices=out_indices, **SMALL)
    for accessor in ("channels", "reduction", "module_name"):
        assert getattr(ours.feature_info, accessor)() == getattr(theirs.feature_info, accessor)()
        assert getattr(ours.feature_info, accessor)(1) == getattr(theirs.feature_info, accessor)(1)
        assert getattr(ours.feature_info, accessor)([0, 2]) == getattr(theirs.feature_info, accessor)([0, 2])
    assert len(ours.feature_info) == len(theirs.feature_info)
    assert ours.feature_info.get_dicts(keys=["num_chs", "reduction"]) == theirs.feature_info.get_dicts(
        keys=["num_chs", "reduction"]
    )
    assert [o.shape[1] for o in ours(torch.randn(1, 3, 64, 96))] == ours.feature_info.channels()


def test_classifier_feature_info_lists_every_stage_like_timm(pair):
    ours, theirs = pair
    keys = ("num_chs", "reduction", "module")
    assert [{k: f[k] for k in keys} for f in ours.feature_info] == [
        {k: f[k] for k in keys} for f in theirs.feature_info
    ]


@pytest.mark.parametrize("global_pool", ["avg", "max", "avgmax", "catavgmax", ""])
def test_global_pool_gives_timm_logits(global_pool):
    ours, theirs = _pair(global_pool)
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        expected = theirs(x)
        got = ours(x)
    if global_pool == "":  # timm keeps NHWC; our maps are NCHW everywhere
        expected = expected.permute(0, 3, 1, 2)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_reset_classifier_takes_timm_arguments():
    ours, theirs = _pair()
    ours.reset_classifier(5, "catavgmax")
    theirs.reset_classifier(5, "catavgmax")
    assert ours.head.in_features == theirs.head.fc.in_features == 2 * ours.num_features
    theirs.head.fc.load_state_dict(ours.head.state_dict())
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-4, rtol=1e-4)
    ours.reset_classifier(7)  # the pooling stays
    assert ours.global_pool == "catavgmax" and ours(x).shape == (2, 7)
    with pytest.raises(ValueError, match="not a pooling"):
        ours.reset_classifier(7, "mean")


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"indices": [0, -1], "norm": True},
        {"indices": 2, "stop_early": True},
        {"indices": [0, 2], "stop_early": True, "norm": True},
    ],
)
def test_forward_intermediates_equals_timm(pair, kwargs):
    ours, theirs = pair
    x = torch.randn(9, 3, 224, 224)  # more images than one inference chunk: chunked and whole must agree
    with torch.no_grad():
        final, inter = ours.forward_intermediates(x, **kwargs)
        their_final, their_inter = theirs.forward_intermediates(x, **kwargs)
        only = ours.forward_intermediates(x, intermediates_only=True, output_fmt="NHWC", **kwargs)
    assert len(inter) == len(their_inter) == len(only)
    for mine, reference, nhwc in zip(inter, their_inter, only, strict=True):
        torch.testing.assert_close(mine, reference, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(nhwc, reference.permute(0, 2, 3, 1), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(final, their_final.permute(0, 3, 1, 2), atol=1e-4, rtol=1e-4)


def test_forward_intermediates_bad_arguments(pair):
    ours, _ = pair
    x = torch.randn(1, 3, 64, 64)
    with pytest.raises(ValueError, match="out of range"):
        ours.forward_intermediates(x, indices=[4])
    with pytest.raises(ValueError, match="last 5 stages"):
        ours.forward_intermediates(x, indices=5)
    with pytest.raises(ValueError, match="output_fmt"):
        ours.forward_intermediates(x, output_fmt="NLC")


def test_checkpoint_path_loads_like_timm(tmp_path):
    torch.manual_seed(1)
    source = timm.create_model(TIMM_T, num_classes=10, **SMALL).eval()
    path = tmp_path / "finetuned.pth"
    torch.save(source.state_dict(), path)
    ours = swin.create_model("swin_t", num_classes=10, checkpoint_path=path, **SMALL).eval()
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), source(x), atol=1e-4, rtol=1e-4)
    assert ours.pretrained_cfg["file"] == str(path)
    with pytest.raises(FileNotFoundError, match="checkpoint_path"):
        swin.create_model("swin_t", checkpoint_path=tmp_path / "missing.pth")


def test_options_given_as_none_are_left_out_as_timm_does():
    """timm's train.py passes drop_path_rate, drop_block_rate, bn_momentum and bn_eps as None when unset; timm
    drops them, and so does create_model: the model is the one built without them."""
    import timm

    unset = {"drop_path_rate": None, "drop_block_rate": None, "bn_momentum": None, "bn_eps": None}
    timm.create_model("swin_tiny_patch4_window7_224", depths=(1, 1, 1, 1), **unset)  # timm takes them
    model = swin.create_model("swin_t", depths=(1, 1, 1, 1), **unset)
    plain = swin.create_model("swin_t", depths=(1, 1, 1, 1))
    assert model.config == plain.config


def test_timm_layer_decay_groups_as_for_timms_swin():
    """``timm.optim.create_optimizer_v2(model, layer_decay=...)`` reads ``group_matcher``: our model gets the
    learning-rate scales, weight decays and parameter counts of timm's own swin_t (without it, timm groups
    by its fallback and the scales differ)."""
    from timm.optim import create_optimizer_v2

    def groups(model):
        optimizer = create_optimizer_v2(model, "adamw", lr=1.0, weight_decay=0.05, layer_decay=0.9)
        return sorted(
            (round(g["lr_scale"], 6), g["weight_decay"], sum(p.numel() for p in g["params"]))
            for g in optimizer.param_groups
        )

    assert groups(swin.create_model("swin_t", **SMALL)) == groups(timm.create_model(TIMM_T, **SMALL))
