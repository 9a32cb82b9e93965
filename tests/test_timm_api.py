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


@pytest.mark.parametrize(
    "global_pool", ["avg", "max", "avgmax", "catavgmax", "", "fast", "fastavg", "fastmax", "fastcatavgmax"]
)
def test_global_pool_gives_timm_logits(global_pool):
    ours, theirs = _pair(global_pool)
    assert (ours.global_pool, ours.head_hidden_size) == (theirs.global_pool, theirs.head_hidden_size)
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


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"indices": [0, 2]},
        {"indices": [1], "prune_norm": True},
        {"indices": 2, "prune_head": False},
        {"indices": [3], "prune_norm": True, "prune_head": False},
    ],
)
def test_prune_intermediate_layers_matches_timm(kwargs):
    """Pruned the same way, both keep the same stages and head: same returned indices, attributes, state dict
    and outputs (forward_intermediates, and forward: logits, or the last kept map without a head)."""
    ours, theirs = _pair()
    assert ours.prune_intermediate_layers(**kwargs) == theirs.prune_intermediate_layers(**kwargs)
    for name in ("num_features", "head_hidden_size", "num_classes", "global_pool"):
        assert getattr(ours, name) == getattr(theirs, name), name
    theirs.load_state_dict(export(ours.state_dict(), "timm"))  # strict: the same parameters are left
    indices = kwargs.get("indices", 1)
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        final, inter = ours.forward_intermediates(x, indices=indices, norm=True)
        their_final, their_inter = theirs.forward_intermediates(x, indices=indices, norm=True)
        got, expected = ours(x), theirs(x)
    for mine, reference in zip(inter, their_inter, strict=True):
        torch.testing.assert_close(mine, reference, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(final, their_final.permute(0, 3, 1, 2), atol=1e-4, rtol=1e-4)
    if expected.ndim == 4:  # no head: timm's map is NHWC, ours NCHW
        expected = expected.permute(0, 3, 1, 2)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_prune_then_set_input_size_with_per_stage_windows_as_timm():
    """The pruned model keeps the windows of the stages it keeps (the config failed with 4 windows for 2
    stages, the model left half pruned), and set_input_size scales those (it named 4 windows for 2 stages)."""
    ours, theirs = _pair(window_size=[7, 7, 14, 7])
    assert ours.prune_intermediate_layers(indices=[0, 2]) == theirs.prune_intermediate_layers(indices=[0, 2])
    ours.set_input_size(img_size=256)
    theirs.set_input_size(img_size=256)
    assert [stage.window for stage in ours.layers] == [stage.blocks[1].window_size for stage in theirs.layers]
    assert len(ours.layers) == 3
    theirs.load_state_dict(export(ours.state_dict(), "timm"))
    x = torch.randn(1, 3, 256, 256)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x).permute(0, 3, 1, 2), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("global_pool", ["avg", "catavgmax", ""])
def test_head_hidden_size_and_embed_dim_match_timm(global_pool):
    ours, theirs = _pair(global_pool)
    assert (ours.head_hidden_size, ours.embed_dim) == (theirs.head_hidden_size, theirs.embed_dim)
    ours.reset_classifier(0, "catavgmax")
    theirs.reset_classifier(0, "catavgmax")
    assert ours.head_hidden_size == theirs.head_hidden_size


def _pair_with_tables(**kwargs):
    """``_pair`` with the bias tables drawn off zero (tables of the wrong shape would not load), and its logits
    checked against timm's."""
    ours, theirs = _pair(**kwargs)
    with torch.no_grad():
        for name, parameter in ours.named_parameters():
            if name.endswith("relative_position_bias_table"):
                parameter.normal_()
        theirs.load_state_dict(export(ours.state_dict(), "timm"))
        x = torch.randn(2, 3, 224, 224)
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-4, rtol=1e-4)
    return ours, theirs


@pytest.mark.parametrize("kwargs", [{"window_size": (8, 8)}, {"window_size": (8, 6)}, {"window_size": [6, 8]}])
def test_window_size_pair_computes_like_timm(kwargs):
    """timm takes window_size as (height, width): the same windows per stage and the same logits."""
    ours, theirs = _pair_with_tables(**kwargs)
    assert [stage.window for stage in ours.layers] == [stage.blocks[1].window_size for stage in theirs.layers]
    assert ours.config.window_size == (8 if kwargs["window_size"] == (8, 8) else tuple(kwargs["window_size"]))


@pytest.mark.parametrize("window_size", [[7, 7, 14, 7], [(8, 6), 7, 7, 5], ((6, 6), (6, 6), (6, 6), (6, 6))])
def test_per_stage_windows_compute_like_timm(window_size):
    """timm takes one window per stage: the same windows and shifts per stage, and the same logits."""
    ours, theirs = _pair_with_tables(window_size=window_size)
    assert [stage.window for stage in ours.layers] == [stage.blocks[1].window_size for stage in theirs.layers]
    assert [ours.layers[i].blocks[1].shift_for(*size) for i, size in enumerate(ours.stage_sizes(224, 224))] == [
        stage.blocks[1].shift_size for stage in theirs.layers
    ]


def test_per_stage_windows_are_checked():
    with pytest.raises(ValueError, match=r"3 per-stage windows .* for 4 stages"):
        swin.create_model("swin_t", window_size=(7, 7, 5))
    with pytest.raises(ValueError, match="window_size must be a positive integer"):
        swin.create_model("swin_t", window_size=(8, 0))
    with pytest.raises(TypeError, match=r"window_size.*one of those per stage"):
        swin.create_model("swin_t", window_size=(7, 7, "7", 7))
    # one window for every stage has one spelling
    assert swin.get_config("swin_t").replace(window_size=[(7, 7)] * 4).window_size == 7


OVERLAY = OVERLAY = {"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5), "crop_pct": 1.0, "input_size": (3, 256, 256)}


@pytest.mark.parametrize("overlay", [OVERLAY, {**OVERLAY, "num_classes": 10}, {"interpolation": "bilinear"}])
def test_pretrained_cfg_overlay_merges_like_timm(overlay):
    """timm merges the overlay into the pretrained config, whose num_classes and input_size become the model's."""
    ours, theirs = _pair(pretrained_cfg_overlay=overlay)
    assert resolve_model_data_config(ours) == resolve_model_data_config(theirs)
    for key in overlay:
        assert ours.pretrained_cfg[key] == theirs.pretrained_cfg[key], key
    assert ours.num_classes == theirs.num_classes
    x = torch.randn(1, 3, *theirs.pretrained_cfg["input_size"][1:])
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-4, rtol=1e-4)
    explicit = swin.create_model("swin_t", num_classes=3, pretrained_cfg_overlay=overlay, **SMALL)
    reference = timm.create_model(TIMM_T, num_classes=3, pretrained_cfg_overlay=overlay, **SMALL)
    assert explicit.num_classes == reference.num_classes


def test_pretrained_cfg_overlay_file_is_what_pretrained_loads(tmp_path):
    torch.manual_seed(2)
    source = timm.create_model(TIMM_T, **SMALL).eval()
    path = tmp_path / "mine.pth"
    torch.save(source.state_dict(), path)
    overlay = {"file": str(path)}
    ours = swin.create_model("swin_t", pretrained=True, pretrained_cfg_overlay=overlay, **SMALL).eval()
    theirs = timm.create_model(TIMM_T, pretrained=True, pretrained_cfg_overlay=overlay, **SMALL).eval()
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-4, rtol=1e-4)
    assert ours.pretrained_cfg["file"] == theirs.pretrained_cfg["file"]
    with pytest.raises(ValueError, match="two different weights"):
        swin.create_model("swin_t", pretrained="ms_in1k", pretrained_cfg_overlay=overlay, **SMALL)


def test_features_only_accepts_classifier_options_as_timm():
    """timm builds its features_only model from the classifier, so it takes and ignores global_pool and
    num_classes; so does ours (the same maps), and a pooling that is not one is still an error."""
    kwargs = {"global_pool": "avg", "num_classes": 10, **SMALL}
    theirs = timm.create_model(TIMM_T, features_only=True, **kwargs)
    ours = swin.create_model("swin_t", features_only=True, **kwargs)
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        assert [o.shape for o in ours(x)] == [o.permute(0, 3, 1, 2).shape for o in theirs(x)]
    assert ours.feature_info.channels() == theirs.feature_info.channels()
    with pytest.raises(ValueError, match="not a pooling"):
        swin.create_model("swin_t", features_only=True, global_pool="mean", **SMALL)


def test_timm_input_size_options():
    """timm's dynamic_img_size keeps the shifts of img_size at other sizes; ours shifts as a model built at the
    input's size, so it is refused (the message says so); the defaults build the usual model."""
    ours, built_at_224 = _pair()
    x = torch.randn(1, 3, 256, 256)
    dynamic = timm.create_model(TIMM_T, dynamic_img_size=True, **SMALL).eval()
    dynamic.load_state_dict(built_at_224.state_dict())
    built_at_256 = timm.create_model(TIMM_T, img_size=256, **SMALL).eval()
    built_at_256.load_state_dict(built_at_224.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(ours(x), built_at_256(x), atol=1e-4, rtol=1e-4)
        assert not torch.allclose(ours(x), dynamic(x), atol=1e-3)
    for option, value in (("dynamic_img_size", True), ("strict_img_size", False)):
        with pytest.raises(ValueError, match=rf"{option}={value}.*any input size.*img_size=\(H, W\)"):
            swin.create_model("swin_t", **{option: value})
    plain = swin.create_model("swin_t", **SMALL).config
    assert swin.create_model("swin_t", dynamic_img_size=False, strict_img_size=True, **SMALL).config == plain
    assert swin.create_model("swin_t", dynamic_img_size=0, strict_img_size=1, **SMALL).config == plain  # as timm


def test_output_fmt_is_refused_with_what_to_use():
    with pytest.raises(TypeError, match=r"output_fmt.*NCHW"):
        swin.create_model("swin_t", output_fmt="NHWC")


@pytest.mark.parametrize("option", ["drop_rate", "proj_drop_rate", "attn_drop_rate"])
def test_dropout_options_drop_where_timms_do(option):
    """timm's train.py passes --drop as drop_rate, its head dropout alone; proj_drop_rate drops in the blocks.
    The same option gives dropout at as many places as timm's, and a train-mode forward_features is random
    exactly when timm's is (drop_rate dropped in every block here before)."""
    kwargs = {option: 0.5, "drop_path_rate": 0.0}
    ours, theirs = swin.create_model("swin_t", **kwargs).train(), timm.create_model(TIMM_T, **kwargs).train()

    def active(model):
        return sum(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())

    assert active(ours) == active(theirs) > 0
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        for model in (ours, theirs):
            torch.manual_seed(0)
            first = model.forward_features(x)
            torch.manual_seed(1)
            assert torch.equal(first, model.forward_features(x)) == (option == "drop_rate"), type(model)


def test_timm_train_script_options_are_taken():
    """timm's train.py calls create_model with scriptable=args.torchscript (False) and options left at None."""
    kwargs = dict(in_chans=3, num_classes=None, drop_rate=0.0, drop_path_rate=None, drop_block_rate=None)
    kwargs |= dict(global_pool=None, bn_momentum=None, bn_eps=None, scriptable=False, checkpoint_path=None)
    ours = swin.create_model("swin_t", pretrained=False, exportable=True, no_jit=True, **kwargs)
    theirs = timm.create_model(TIMM_T, pretrained=False, exportable=True, no_jit=True, **kwargs)
    assert ours.num_classes == theirs.num_classes == 1000
    with pytest.raises(ValueError, match=r"scriptable=True asks for TorchScript.*torch.export"):
        swin.create_model("swin_t", scriptable=True)


def test_device_and_dtype_place_the_model_as_timm():
    ours = swin.create_model("swin_t", **SMALL, device="cpu", dtype=torch.bfloat16)
    theirs = timm.create_model(TIMM_T, **SMALL, device="cpu", dtype=torch.bfloat16)
    assert {p.dtype for p in ours.parameters()} == {p.dtype for p in theirs.parameters()} == {torch.bfloat16}
    with pytest.raises(TypeError, match="dtype expects a floating point torch.dtype"):
        swin.create_model("swin_t", dtype=torch.int8)
    # with optimize=True the dtype asked for is the one it runs in ('auto' recast it to bf16 on a bf16 CPU)
    fast = swin.create_model("swin_t", depths=(1, 1, 1, 1), dtype=torch.float32, optimize=True)
    assert {p.dtype for p in fast.model.parameters()} == {torch.float32}
    with pytest.raises(ValueError, match="both name a dtype; pass it once"):
        swin.create_model("swin_t", depths=(1, 1, 1, 1), dtype=torch.float32, optimize="bfloat16")


@pytest.mark.parametrize("num_classes", [None, 10])
def test_pretrained_path_of_timm_train_gets_a_new_head(tmp_path, num_classes):
    """train.py --pretrained-path: pretrained_cfg_overlay=dict(file=..., num_classes=-1) loads the trunk and
    makes a new head (timm 'forces head adaptation'), of the model's num_classes."""
    torch.manual_seed(0)
    source = swin.create_model("swin_t", **SMALL)
    torch.save(source.state_dict(), tmp_path / "ours.pth")
    torch.save(export(source.state_dict(), "timm"), tmp_path / "timm.pth")
    models = [
        create(name, **SMALL, num_classes=num_classes, pretrained=True, pretrained_cfg_overlay=overlay)
        for create, name, overlay in [
            (swin.create_model, "swin_t", {"file": str(tmp_path / "ours.pth"), "num_classes": -1}),
            (timm.create_model, TIMM_T, {"file": str(tmp_path / "timm.pth"), "num_classes": -1}),
        ]
    ]
    ours, theirs = models
    assert ours.num_classes == theirs.num_classes == (num_classes or 1000)
    if num_classes is None:  # a head of the file's size, yet not the file's
        assert not torch.equal(theirs.head.fc.weight, source.head.weight)
        assert not torch.equal(ours.head.weight, source.head.weight)
    trunk = {k: v for k, v in source.state_dict().items() if not k.startswith("head.")}
    mine = ours.state_dict()
    assert all(torch.equal(mine[k], v) for k, v in trunk.items())


def test_load_state_dict_of_another_layout_says_how_to_convert(pair):
    """model.load_state_dict(timm_model.state_dict()) fails as torch fails, then says which layout it is and
    what loads it (torch's message alone listed 10 missing and unexpected keys); the converted one loads."""
    from torchvision.models import swin_t as torchvision_swin_t

    from swin.weights import convert

    ours, theirs = pair
    with pytest.raises(RuntimeError, match=r"(?s)Missing key.*timm's layout: load swin\.weights\.convert"):
        ours.load_state_dict(theirs.state_dict())
    wrapped = {"module." + key: value for key, value in ours.state_dict().items()}
    with pytest.raises(RuntimeError, match="in a wrapper or under a prefix"):
        ours.load_state_dict(wrapped)
    ours.load_state_dict(convert(theirs.state_dict()))
    full = swin.create_model("swin_t")
    with pytest.raises(RuntimeError, match="torchvision's layout"):
        full.load_state_dict(torchvision_swin_t().state_dict())
    with pytest.raises(RuntimeError, match="size mismatch") as error:  # ours, but another shape: torch's message
        ours.load_state_dict({**ours.state_dict(), "head.weight": torch.zeros(3, 768)})
    assert "convert" not in str(error.value)


def test_attention_extract_by_hooks_gets_timm_s_maps(pair):
    """timm.utils.AttentionExtract(method="hook") hooks every '*attn_drop' module: ours has the official
    softmax and attn_drop modules, called when hooked, so the same maps come out as timm's (its fused attention
    off, without which timm's attn_drop is not called either); ours per image, (B, nW, heads, N, N)."""
    from timm.utils import AttentionExtract

    ours, theirs = pair
    fused = {m: m.fused_attn for m in theirs.modules() if hasattr(m, "fused_attn")}
    try:
        for module in fused:
            module.fused_attn = False
        x = torch.randn(2, 3, 224, 224)
        with torch.no_grad():
            mine, reference = AttentionExtract(ours, method="hook")(x), AttentionExtract(theirs, method="hook")(x)
    finally:
        for module, value in fused.items():
            module.fused_attn = value
    assert list(mine) == list(reference) and len(mine) == 8
    for name, maps in mine.items():
        torch.testing.assert_close(maps.reshape(reference[name].shape), reference[name], atol=1e-6, rtol=1e-5)


def test_pretrained_cfg_names_a_tag_as_in_timm():
    """timm's create_model(name, pretrained_cfg="ms_in22k") takes that tag's head and preprocessing; it was
    refused as an unknown config field. A whole config (timm replaces its own with it) is refused with what
    to pass instead."""
    ours = swin.create_model("swin_t", pretrained_cfg="ms_in22k")
    theirs = timm.create_model(TIMM_T, pretrained_cfg="ms_in22k")
    assert ours.num_classes == theirs.num_classes == 21841
    assert resolve_model_data_config(ours) == resolve_model_data_config(theirs)
    with pytest.raises(TypeError, match="pretrained_cfg_overlay"):
        swin.create_model("swin_t", pretrained_cfg={"mean": (0.5, 0.5, 0.5)})
    with pytest.raises(ValueError, match="two different weights"):
        swin.create_model("swin_t.ms_in1k", pretrained_cfg="ms_in22k")


def test_a_models_own_pretrained_cfg_passed_back_names_its_tag(monkeypatch, tmp_path):
    """create_model(name, pretrained=True, pretrained_cfg_overlay=dict(model.pretrained_cfg)): its hf_hub_id and
    url are one of the manifest's sources, so the tag they belong to is loaded (offline here: the error names
    that tag's cache), not refused as 'the Hub is not a source' nor fetched from the url itself."""
    monkeypatch.setenv("SWIN_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("SWIN_OFFLINE", "1")
    own = dict(swin.create_model("swin_t.ms_in22k").pretrained_cfg)
    with pytest.raises(FileNotFoundError, match=r"swin_t\.ms_in22k is not in the cache"):
        swin.create_model("swin_t", pretrained=True, pretrained_cfg_overlay=own)
    with pytest.raises(ValueError, match="two different weights"):
        swin.create_model("swin_t.ms_in1k", pretrained=True, pretrained_cfg_overlay=own)


@pytest.mark.parametrize(
    ("filters", "exclude"),
    [("swin*", ["*v2*", "*384*"]), (["*tiny*", "*small*"], "*v2*"), ("swinv2*", "*window8*")],
)
def test_list_models_takes_timms_filter_and_exclude_filters(filters, exclude):
    """timm's keywords: filter= and exclude_filters= (a pattern or a list); ours match timm's names too, so the
    architectures listed are those of timm's list, by their timm names."""
    ours = swin.list_models(filter=filters, exclude_filters=exclude)
    timm_names = {alias for name in ours for alias in swin.get_config(name).aliases if timm.is_model(alias)}
    registered = {alias for name in swin.list_models() for alias in swin.get_config(name).aliases}
    assert ours and timm_names == set(timm.list_models(filter=filters, exclude_filters=exclude)) & registered
    assert swin.list_models(filters, exclude_filters=exclude) == ours
    with pytest.raises(TypeError, match="pass one of them"):
        swin.list_models("swin_t", filter="swin_s")


def test_convert_is_a_timm_filter_fn(tmp_path):
    """timm's load_checkpoint(model, path, filter_fn=...) calls filter_fn(state_dict, model): convert takes the
    model as 'auto' (it failed naming the whole model as an unknown layout), so a timm checkpoint loads into ours."""
    from timm.models import load_checkpoint

    theirs = timm.create_model("swin_tiny_patch4_window7_224", embed_dim=32, num_heads=(1, 2, 4, 8)).eval()
    torch.save(theirs.state_dict(), tmp_path / "timm.pth")
    ours = swin.create_model("swin_t", embed_dim=32, num_heads=(1, 2, 4, 8)).eval()
    load_checkpoint(ours, str(tmp_path / "timm.pth"), filter_fn=swin.weights.convert)
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="filter_fn=swin.weights.convert"):
        ours.load_state_dict(theirs.state_dict())
