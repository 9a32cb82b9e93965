"""Our weights exported in torchvision's and transformers' layouts load into those libraries' own models, which
then compute our outputs.

The judges are the libraries: torchvision's ``SwinTransformer`` loads the export with a strict
``load_state_dict`` (its derived buffers are persistent, so they are in the export); transformers'
``from_pretrained`` reads a folder of its own ``SwinConfig`` and our weights without a missing, unexpected or
mismatched key. Their outputs must equal ours.
"""

from __future__ import annotations

import functools

import pytest
import torch

import swin
from swin.tools.cli import main
from swin.weights import convert, export

torchvision = pytest.importorskip("torchvision")
transformers = pytest.importorskip("transformers")

SMALL = {"embed_dim": 32, "depths": (2, 2, 2, 2), "num_heads": (1, 2, 4, 8), "num_classes": 10}


def _ours(name: str, **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    model = swin.create_model(name, **{**SMALL, **overrides}).eval()
    with torch.no_grad():  # weights away from their initial values: zero biases and unit norms prove little
        for key, parameter in model.named_parameters():
            # position biases large enough to change the attention (at their initial scale they are near uniform)
            position = "cpb_mlp" in key or "relative_position_bias_table" in key
            parameter.add_(torch.randn_like(parameter), alpha=0.5 if position else 0.02)
    return model


def _torchvision(version: int, window: int, num_classes: int = 10) -> torch.nn.Module:
    from torchvision.models import swin_transformer as tv

    v2 = {"block": tv.SwinTransformerBlockV2, "downsample_layer": tv.PatchMergingV2} if version == 2 else {}
    return tv.SwinTransformer(
        patch_size=[4, 4],
        embed_dim=SMALL["embed_dim"],
        depths=list(SMALL["depths"]),
        num_heads=list(SMALL["num_heads"]),
        window_size=[window, window],
        stochastic_depth_prob=0.0,
        num_classes=num_classes,
        **v2,
    ).eval()


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    ("name", "version", "window", "size", "given"),
    [
        ("swin_t", 1, 7, 224, "state_dict"),  # V1's windows read from its bias tables
        ("swinv2_t_w8", 2, 8, 256, "model"),
    ],
)
def test_torchvision_loads_the_export_strictly_and_computes_our_logits(name, version, window, size, given):
    ours = _ours(name)
    exported = export(ours if given == "model" else ours.state_dict(), "torchvision")
    theirs = _torchvision(version, window)
    theirs.load_state_dict(exported)  # strict: every weight and buffer, nothing else
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        _close(theirs(x), ours(x))


def test_a_pretrained_window_travels_in_torchvisions_saved_coordinates_table():
    """Swin V2 fine-tuned at another window (the official w12to16 models) scales its coordinates by the window
    it was trained at; torchvision's constructor cannot, but it reads the table it saved: ours, scaled so."""
    ours = _ours("swinv2_t_w8", pretrained_window_sizes=(6, 6, 6, 6))
    theirs = _torchvision(2, 8)
    theirs.load_state_dict(export(ours, "torchvision"))
    x = torch.randn(1, 3, 256, 256)
    with torch.no_grad():
        _close(theirs(x), ours(x))


def test_a_swin_v2_state_dict_alone_is_refused_for_torchvision():
    with pytest.raises(ValueError, match=r"does not record its windows.*export\(swin.create_model"):
        export(_ours("swinv2_t_w8").state_dict(), "torchvision")


@pytest.mark.parametrize(
    ("name", "overrides", "named"),
    [
        ("swin_t", {"ape": True}, "absolute position embedding"),
        ("swin_t", {"patch_norm": False}, "always norms the patch embedding"),
        ("swin_t", {"features_only": True}, "norm0, norm1, norm2, norm3 of a features_only backbone"),
        ("swinv2_t_w16", {}, "windows 8x8, 16x16"),  # stage 4's 8x8 map shrinks its window
        ("swin_t", {"window_size": ((7, 7), (7, 7), (7, 7), (5, 5))}, "windows 5x5, 7x7"),
    ],
)
def test_what_torchvision_cannot_build_is_refused(name, overrides, named):
    if overrides.get("features_only"):
        model = swin.create_model(name, features_only=True, **{k: v for k, v in SMALL.items() if k != "num_classes"})
    else:
        model = swin.create_model(name, **{**SMALL, **overrides})
    with pytest.raises(ValueError, match="torchvision's Swin") as error:
        export(model, "torchvision")
    assert named in str(error.value) and "export to 'official'" in str(error.value)


def _hf_folder(tmp_path, ours: torch.nn.Module, config) -> str:
    """A folder as transformers' save_pretrained writes it: its own config, our exported weights."""
    from safetensors.torch import save_file

    config.save_pretrained(tmp_path)
    save_file(
        {k: v.contiguous() for k, v in export(ours.state_dict(), "transformers").items()},
        tmp_path / "model.safetensors",
    )
    return str(tmp_path)


def _hf_config(version: int, window: int, size: int, **fields):
    cls = transformers.Swinv2Config if version == 2 else transformers.SwinConfig
    args = {"embed_dim": SMALL["embed_dim"], "depths": list(SMALL["depths"]), "num_heads": list(SMALL["num_heads"])}
    return cls(image_size=size, window_size=window, drop_path_rate=0.0, **args, **fields)


@pytest.mark.parametrize(
    ("name", "version", "window", "size", "overrides", "fields"),
    [
        ("swin_t", 1, 7, 224, {}, {}),
        ("swin_t", 1, 7, 224, {"ape": True}, {"use_absolute_embeddings": True}),
        (
            "swinv2_t_w8",
            2,
            8,
            256,
            {"pretrained_window_sizes": (6, 6, 6, 4)},
            {"pretrained_window_sizes": [6, 6, 6, 4]},
        ),
    ],
)
def test_transformers_reads_the_exported_classifier(tmp_path, name, version, window, size, overrides, fields):
    ours = _ours(name, **overrides)
    config = _hf_config(version, window, size, num_labels=10, **fields)
    model_class = transformers.Swinv2ForImageClassification if version == 2 else transformers.SwinForImageClassification
    theirs, info = model_class.from_pretrained(_hf_folder(tmp_path, ours, config), output_loading_info=True)
    assert not any(info.values()), info
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        _close(theirs.eval()(x).logits, ours(x))


def test_transformers_reads_a_trunk_without_head_as_swin_model(tmp_path):
    ours = _ours("swin_t", num_classes=0)
    theirs, info = transformers.SwinModel.from_pretrained(
        _hf_folder(tmp_path, ours, _hf_config(1, 7, 224)), output_loading_info=True
    )
    assert not any(info.values()), info
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        _close(theirs.eval()(x).pooler_output, ours(x))


def test_transformers_reads_a_backbone_as_swin_backbone_at_any_size(tmp_path):
    """Per-stage norms are SwinBackbone's hidden_states_norms; both pad each map before the shift, so the
    features agree at a size that is no window multiple too."""
    torch.manual_seed(0)
    small = {k: v for k, v in SMALL.items() if k != "num_classes"}
    ours = swin.create_model("swin_t", features_only=True, out_indices=(1, 2, 3), **small).eval()
    config = _hf_config(1, 7, 224, out_features=["stage2", "stage3", "stage4"])
    theirs, info = transformers.SwinBackbone.from_pretrained(
        _hf_folder(tmp_path, ours, config), output_loading_info=True
    )
    assert not any(info.values()), info
    x = torch.randn(1, 3, 200, 300)
    with torch.no_grad():
        for a, b in zip(theirs.eval()(x).feature_maps, ours(x), strict=True):
            _close(a, b)


@pytest.mark.parametrize("target", ["torchvision", "transformers"])
@pytest.mark.parametrize(("name", "overrides"), [("swin_t", {}), ("swinv2_t_w8", {}), ("swin_t", {"qkv_bias": False})])
def test_the_export_reads_back_as_the_same_weights(target, name, overrides):
    ours = _ours(name, **overrides)
    if target == "torchvision" and overrides.get("qkv_bias") is False:
        back = convert(export(ours, target))  # torchvision always has a qkv bias: zeros, which add nothing
        assert all(
            torch.equal(back.pop(k), torch.zeros(v.shape[0])) for k, v in list(back.items()) if k.endswith("qkv.bias")
        )
    else:
        back = convert(export(ours, target))
    own = ours.state_dict()
    assert set(back) == set(own)
    assert all(torch.equal(back[k], own[k]) for k in own)


def test_the_transformers_export_refuses_a_model_without_patch_norm():
    with pytest.raises(ValueError, match="patch_norm=False.*export to 'official'"):
        export(_ours("swin_t", patch_norm=False), "transformers")


@functools.cache
def _checkpoint(folder, name: str) -> str:
    path = f"{folder}/{name}.pth"
    torch.save(_ours(name).state_dict(), path)
    return path


def test_swin_convert_writes_torchvisions_layout(tmp_path, capsys):
    out = tmp_path / "tv.pth"
    assert main(["convert", _checkpoint(str(tmp_path), "swin_t"), str(out), "--to", "torchvision"]) == 0
    theirs = _torchvision(1, 7)
    theirs.load_state_dict(torch.load(out, weights_only=True))
    ours = _ours("swin_t")
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        _close(theirs(x), ours(x))
    # a Swin V2 file does not say its windows: one line, naming the way through Python
    status = main(
        ["convert", _checkpoint(str(tmp_path), "swinv2_t_w8"), str(tmp_path / "v2.pth"), "--to", "torchvision"]
    )
    err = capsys.readouterr().err
    assert status == 1 and "does not record its windows" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "v2.pth").exists()


def test_a_wrapped_model_gives_its_windows_under_the_unwrapped_names():
    """DDP's ``module.`` (or swin.optimize's ``model.``) prefix is unwrapped from the weights; the windows of a
    Swin V2 model given wrapped must be found under the same names (else no coordinates table is written)."""
    ours = _ours("swinv2_t_w8")
    wrapper = torch.nn.Module()
    wrapper.module = ours
    theirs = _torchvision(2, 8)
    theirs.load_state_dict(export(wrapper, "torchvision"))
    x = torch.randn(1, 3, 256, 256)
    with torch.no_grad():
        _close(theirs(x), ours(x))


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"global_pool": "max"}, "global_pool='max': torchvision's Swin averages the tokens"),
        ({"semantics": "detection"}, "runs with detection semantics"),
        ({"img_size": 256}, "stage 1's 64x64 map is no multiple of the 7x7 window"),
        ({"in_chans": 1}, "takes 3 input channels and this model 1"),
        ({"num_classes": 0}, "always has a classifier (head)"),
    ],
)
def test_a_model_torchvision_would_run_otherwise_is_refused(overrides, named):
    """Every weight of these would load (strictly, for the first three), and torchvision would compute other
    logits (measured: 1.4 for max pooling, 3e-3 for detection semantics, 1.5e-2 at 256 with window 7)."""
    with pytest.raises(ValueError) as error:
        export(swin.create_model("swin_t", **{**SMALL, **overrides}), "torchvision")
    assert named in str(error.value)


def test_swin_convert_reads_a_swin_v2_files_windows_from_its_saved_coordinates(tmp_path):
    """torchvision's and the official Swin V2 files save each block's coordinates table, which holds the window
    and the window it was trained at: converted to torchvision's layout again, the file gives the same model."""
    ours = _ours("swinv2_t_w8", pretrained_window_sizes=(6, 6, 6, 4))
    source, again = tmp_path / "tv.pth", tmp_path / "again.pth"
    torch.save(export(ours, "torchvision"), source)
    assert main(["convert", str(source), str(again), "--to", "torchvision"]) == 0
    theirs = _torchvision(2, 8)
    theirs.load_state_dict(torch.load(again, weights_only=True))
    x = torch.randn(1, 3, 256, 256)
    with torch.no_grad():
        _close(theirs(x), ours(x))
