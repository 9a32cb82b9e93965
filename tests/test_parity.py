"""Logits equal the independent implementations (timm, torchvision) given the same weights.

The S/B/L models run with two blocks per stage (every stage, width, window and head kept) unless
SWIN_FULL_PARITY=1 asks for the full depths."""

from __future__ import annotations

import pytest
import torch

import swin
from swin.weights import convert

from .conftest import parity_depths, timm_pair

TOLERANCE = 1e-5


@pytest.mark.parametrize("name", [n for n in swin.list_models() if swin.get_config(n).version == 1])
def test_matches_timm_at_native_size(name):  # Swin V2: tests/test_parity_v2.py
    reference, ours = timm_pair(name, **parity_depths(name))
    x = torch.randn(2, 3, *swin.get_config(name).img_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, got = reference(x), ours(x)
    assert got.shape == (2, 1000)
    assert (got - expected).abs().max().item() <= TOLERANCE


@pytest.mark.parametrize("name", ["swin_t", "swin_s", "swin_b"])
def test_matches_torchvision(name, monkeypatch):
    """torchvision's own builder (its embed dim, heads, window, patch size): at full depth for swin_t, with two
    blocks per stage for swin_s and swin_b unless SWIN_FULL_PARITY=1 (their stage 3 repeats one block 18 times:
    its depth is compared as configuration)."""
    torchvision = pytest.importorskip("torchvision")
    from torchvision.models import swin_transformer

    built, depths = [], parity_depths(name).get("depths")
    real = swin_transformer.SwinTransformer

    def shortened(**arguments):  # the builder's class, with the depths overridden when asked
        built.append(arguments)
        return real(**{**arguments, **({} if depths is None else {"depths": list(depths)})})

    monkeypatch.setattr(swin_transformer, "SwinTransformer", shortened)
    torch.manual_seed(0)
    reference = getattr(torchvision.models, name)().eval()
    (arguments,) = built
    assert swin.get_config(name).depths == tuple(arguments["depths"])
    ours = swin.create_model(name, **parity_depths(name)).eval()
    ours.load_state_dict(convert(reference.state_dict(), source="torchvision"))
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert (ours(x) - reference(x)).abs().max().item() <= TOLERANCE


@pytest.mark.parametrize("size,semantics", [((448, 448), "classification"), ((232, 232), "detection")])
def test_torchvision_at_other_sizes(size, semantics):
    """torchvision pads before the roll (our detection semantics) and turns the shift off where one window
    covers a map (our classification semantics): where maps are window multiples the classifier's rules give
    its outputs, where no map fits in one window the detection rules do (README, "Semantics at unusual
    sizes"). Weights moved off their initial values, so that a misplaced shift shows."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    reference = torchvision.models.swin_t().eval()
    with torch.no_grad():
        for parameter in reference.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    ours = swin.create_model("swin_t", semantics=semantics).eval()
    ours.load_state_dict(convert(reference.state_dict(), source="torchvision"))
    x = torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert (ours(x) - reference(x)).abs().max().item() <= TOLERANCE


@pytest.mark.parametrize("size", [(224, 320), (224, 448)])
def test_non_square_matches_timm_built_for_that_size(size):
    # 224x320: stage maps are not window multiples (padding); 224x448: stage 4 is 7x14, so only the
    # width is shifted (timm's per-axis rule, which the official rule equals at square sizes).
    reference, ours = timm_pair("swin_t", img_size=size)
    x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert (ours(x) - reference(x)).abs().max().item() <= TOLERANCE


def test_auto_detected_layouts_load_the_same_weights():
    reference, ours = timm_pair("swin_t")
    assert swin.weights.detect_layout(reference.state_dict()) == "timm"
    official = swin.weights.export(ours.state_dict(), target="official")
    assert swin.weights.detect_layout(official) == "official"
    again = swin.create_model("swin_t")
    again.load_state_dict(convert({"model": official}))
    for key, value in ours.state_dict().items():
        assert torch.equal(again.state_dict()[key], value), key


def test_under_bf16_autocast_matches_timm_under_autocast():
    """Under autocast timm adds its float32 position bias to the bf16 scores, so scores, softmax and its
    backward run in float32; ours the same, so the logits agree (they differed by 6e-3 relative when ours
    rounded the scores to bf16). Per-token logits at 112 pixels, with a shifted block and position biases
    large enough to matter."""
    shape = {"depths": (2, 2), "num_heads": (3, 6), "global_pool": "", "num_classes": 16}
    reference, ours = timm_pair("swin_t", shape=shape, position_bias_std=5.0, img_size=112)
    x = torch.randn(2, 3, 112, 112)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = reference(x).permute(0, 3, 1, 2).float()  # timm keeps per-token logits NHWC
        got = ours(x).float()
    assert ((got - expected).norm() / expected.norm()).item() <= 1e-4
