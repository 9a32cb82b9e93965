"""Layout conversion: our exports in timm's layout, wrappers unwrapped (a timm training checkpoint's EMA weights
first, as timm reads it), layouts detected.

Our official export read back by timm's own checkpoint filter is tested in ``test_load_layouts.py``, through
``pretrained=``.
"""

from __future__ import annotations

import argparse

import pytest
import torch

import swin
from swin.weights import convert, detect_layout, export, unwrap

from ..conftest import timm_pair


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return swin.create_model("swin_t").eval()


def test_timm_export_is_timm_state_dict(model):
    import timm

    reference = timm.create_model("swin_tiny_patch4_window7_224")
    exported = export(model.state_dict(), target="timm")
    assert set(exported) == set(reference.state_dict())
    assert detect_layout(exported) == "timm"


def test_wrappers_and_buffers():
    sd = swin.create_model("swin_t").state_dict()
    wrapped = {"state_dict": {f"module.{k}": v for k, v in sd.items()}, "epoch": 3}
    wrapped["state_dict"]["module.layers.0.blocks.1.attn_mask"] = torch.zeros(64, 49, 49)
    assert set(convert(wrapped)) == set(sd)


@pytest.fixture(scope="module")
def timm_training_checkpoint(tmp_path_factory):
    """A checkpoint as timm's train.py writes it (its own ``CheckpointSaver``): the trained weights under
    ``state_dict``, their moving average (``ModelEmaV3``) under ``state_dict_ema``, beside the optimizer, the
    args and the epoch. Returns the file, an image, and the logits of the trained (not averaged) weights."""
    import timm
    from timm.utils import CheckpointSaver, ModelEmaV3

    torch.manual_seed(0)
    trained = timm.create_model("swin_tiny_patch4_window7_224").eval()
    ema = ModelEmaV3(trained)
    with torch.no_grad():  # training moved the weights away from their average
        for parameter in trained.parameters():
            parameter.add_(torch.randn_like(parameter), alpha=0.05)
    directory = tmp_path_factory.mktemp("timm_train")
    saver = CheckpointSaver(
        trained,
        torch.optim.AdamW(trained.parameters()),
        args=argparse.Namespace(model="swin_tiny_patch4_window7_224"),
        model_ema=ema,
        checkpoint_dir=str(directory),
    )
    saver.save_checkpoint(epoch=3, metric=0.5)
    image = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return directory / "last.pth.tar", image, trained(image)


def _read(path) -> dict:
    with torch.serialization.safe_globals([argparse.Namespace]):  # as timm reads its training checkpoints
        return torch.load(path, weights_only=True)


def _timm_loaded(path) -> torch.nn.Module:
    """timm's model with the weights ``timm.models.load_checkpoint`` reads from ``path`` (its defaults)."""
    import timm

    reference = timm.create_model("swin_tiny_patch4_window7_224").eval()
    timm.models.load_checkpoint(reference, str(path))
    return reference


def test_training_checkpoint_loads_ema_weights_as_timm_does(timm_training_checkpoint):
    path, image, trained_logits = timm_training_checkpoint
    assert {"state_dict", "state_dict_ema"} <= set(_read(path))
    model = swin.create_model("swin_t", checkpoint_path=path).eval()
    reference = _timm_loaded(path)
    with torch.no_grad():
        expected = reference(image)
        assert (model(image) - expected).abs().max().item() <= 1e-5
    assert (expected - trained_logits).abs().max().item() > 1e-2  # the two sets of weights tell apart


def test_ema_only_checkpoint_loads(timm_training_checkpoint, tmp_path):
    path, image, _ = timm_training_checkpoint
    saved = _read(path)
    ema_only = tmp_path / "ema_only.pth"
    torch.save({"state_dict_ema": saved["state_dict_ema"], "epoch": saved["epoch"]}, ema_only)
    model = swin.create_model("swin_t", checkpoint_path=ema_only).eval()
    with torch.no_grad():
        assert (model(image) - _timm_loaded(ema_only)(image)).abs().max().item() <= 1e-5


def test_use_ema_false_gives_the_trained_weights_as_timm_does(timm_training_checkpoint):
    import timm

    from swin.weights import unwrap

    path, _, _ = timm_training_checkpoint
    expected = timm.models.load_state_dict(str(path), use_ema=False)
    state = unwrap(_read(path), use_ema=False)
    assert set(state) == set(expected) and all(torch.equal(state[k], v) for k, v in expected.items())
    with pytest.raises(ValueError, match="only EMA weights .*: pass use_ema=True"):
        unwrap({"state_dict_ema": expected, "epoch": 3}, use_ema=False)


def test_swin_convert_writes_the_ema_weights(timm_training_checkpoint, tmp_path, capsys):
    """``swin convert`` reads the checkpoint as ``pretrained=`` does: to timm's layout, it writes exactly
    what ``timm.models.load_state_dict`` reads from it."""
    import timm
    from safetensors.torch import load_file

    from swin.tools.cli import main

    path, _, _ = timm_training_checkpoint
    assert main(["convert", str(path), str(tmp_path / "ema.safetensors"), "--to", "timm"]) == 0
    written = load_file(tmp_path / "ema.safetensors")
    expected = timm.models.load_state_dict(str(path))
    assert set(written) == set(expected) and all(torch.equal(written[k], v) for k, v in expected.items())


def test_unwrap_prefers_wrappers_in_timms_order():
    """timm's ``load_state_dict(use_ema=True)``: state_dict_ema, then model_ema, then state_dict, then model."""
    from swin.weights import unwrap

    order = ("state_dict_ema", "model_ema", "state_dict", "model")
    for first in range(len(order)):
        checkpoint = {key: {"w": torch.full((1,), float(i))} for i, key in enumerate(order) if i >= first}
        assert unwrap(checkpoint)["w"].item() == first


def test_unknown_layout():
    with pytest.raises(ValueError, match="unknown checkpoint layout 'caffe'"):
        convert({"a": torch.zeros(1)}, source="caffe")


def test_no_tensors():
    with pytest.raises(ValueError, match="no tensors"):
        convert({"epoch": 1})


def test_saved_buffers_do_not_make_a_timm_checkpoint_official():
    import timm

    with torch.device("meta"):
        reference = timm.create_model("swin_tiny_patch4_window7_224")
    sd = dict(reference.state_dict())
    sd["layers.0.blocks.0.attn.relative_position_index"] = torch.zeros(49, 49, dtype=torch.long, device="meta")
    assert detect_layout(sd) == "timm"
    del sd["head.fc.weight"], sd["head.fc.bias"]  # headless: the merging position still tells
    assert detect_layout(sd) == "timm"


@pytest.mark.parametrize(
    ("key", "layout"),
    [
        ("swin.embeddings.patch_embeddings.projection.weight", "transformers"),
        ("encoder.layers.0.blocks.0.layernorm_before.weight", "transformers"),
        ("swinv2.embeddings.patch_embeddings.projection.weight", "transformers"),
        ("stages.0.blocks.0.attn.w_msa.qkv.weight", "mmdet"),
        ("features.0.0.weight", "torchvision"),
        ("layers.0.downsample.reduction.weight", "official"),
        ("layers.1.downsample.reduction.weight", "timm"),
    ],
)
def test_detect_layout(key, layout):
    assert detect_layout([key]) == layout


@pytest.mark.parametrize("beside", [{"model": {"arch": "swin_t"}}, {"state_dict": {"note": "x"}}, {"module": {}}])
def test_a_metadata_dict_under_a_wrapper_name_beside_a_flat_state_dict_is_no_wrapper(beside):
    """Wrapper keys are followed even with tensors beside them (training scripts' metrics), but only where
    they lead to tensors: a flat state dict with a "model" dict of metadata loaded, and must still."""
    flat = {"patch_embed.proj.weight": torch.zeros(1), "norm.weight": torch.ones(1)}
    assert sorted(unwrap({**flat, **beside})) == sorted(flat)


@pytest.mark.parametrize("features_only", [False, True])
def test_a_detection_semantics_model_is_refused_for_timm_which_would_compute_otherwise(features_only):
    """Every weight loads into timm's model, which runs the classification rules: at 224 its logits were 9e-3 from
    ours (stage 4's 7x7 map: shifted here, not there). Given the model, the export says so; the state dict alone
    still converts."""
    shape = {"embed_dim": 32, "depths": (2, 2, 2, 2), "num_heads": (1, 2, 4, 8), "num_classes": 10}
    theirs, classification = timm_pair("swin_t", shape=shape, position_bias_std=2.0)  # biases that matter
    ours = swin.create_model("swin_t", semantics="detection", **shape).eval()
    ours.load_state_dict(classification.state_dict())
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        assert (theirs(x) - ours(x)).abs().max() > 2e-3  # what the refusal prevents (float32 parity: ~1e-6)
    backbone = {k: v for k, v in shape.items() if k != "num_classes"}
    model = swin.create_model("swin_t", features_only=True, **backbone) if features_only else ours
    with pytest.raises(ValueError, match="runs with detection semantics and timm's Swin .* export to 'official'"):
        export(model, "timm")


def test_a_module_holding_our_layers_without_our_model_exports():
    """A module of the user's given swin's layers (no SwinTrunk in it) exports as its state dict does (the model
    checks raised a bare StopIteration)."""
    model = swin.create_model("swin_t", depths=(1, 1, 1, 1), num_classes=10)
    holder = torch.nn.Module()
    for name in ("patch_embed", "layers", "norm", "head"):
        setattr(holder, name, getattr(model, name))
    assert export(holder, "timm").keys() == export(model.state_dict(), "timm").keys()


def test_the_library_named_instead_takes_the_model():
    """A detection-semantics model with per-stage windows: torchvision's refusal named 'timm', which refuses
    detection semantics."""
    model = swin.create_model("swin_t", semantics="detection", window_size=[7, 7, 7, 5], depths=(1, 1, 1, 1))
    with pytest.raises(ValueError, match=r"per-stage windows\); export to 'official' instead"):
        export(model, "torchvision")
    classifier = swin.create_model("swin_t", window_size=[7, 7, 7, 5], depths=(1, 1, 1, 1))
    with pytest.raises(ValueError, match=r"export to 'official' or 'timm' instead"):
        export(classifier, "torchvision")
