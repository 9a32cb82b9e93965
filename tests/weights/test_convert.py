"""Layout conversion: our exports read by timm's own checkpoint filter, wrappers unwrapped."""

from __future__ import annotations

import pytest
import torch
from swin.weights import convert, detect_layout, export

import swin


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
