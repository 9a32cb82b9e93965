"""Layout conversion: our exports read by timm's own checkpoint filter, wrappers unwrapped."""

from __future__ import annotations

import pytest
import torch

import swin
from swin.weights import convert, detect_layout, export


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return swin.create_model("swin_t").eval()


def test_official_export_loads_through_timm_filter(model):
    import timm
    from timm.models.swin_transformer import checkpoint_filter_fn

    reference = timm.create_model("swin_tiny_patch4_window7_224").eval()
    checkpoint = {"model": export(model.state_dict(), target="official")}
    reference.load_state_dict(checkpoint_filter_fn(checkpoint, reference))
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        assert (reference(x) - model(x)).abs().max().item() <= 1e-5


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
