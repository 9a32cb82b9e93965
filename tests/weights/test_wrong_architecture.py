"""A source serving another architecture's weights (a mirror out of date, a moved revision) is skipped before
anything is cached, when the weights are fetched for a model: ``create_model(..., pretrained=TAG)`` and
``swin download``. The right weights come from timm's swin_t; the wrong ones are a complete, finite Swin trunk of
another width."""

from __future__ import annotations

import pytest
import torch

import swin
from swin.tools.cli import main
from swin.weights.pretrained import WeightsNotFoundError

from .conftest import cache_files, safetensors_bytes, tiny_swin_state


def test_another_architectures_weights_are_skipped_and_never_cached(server, entries, swin_home, timm_reference):
    body, image, logits = timm_reference
    wrong = server.serve("/stale/model.safetensors", safetensors_bytes(tiny_swin_state()))
    right = server.serve("/good/model.safetensors", body)
    entries("mirrored", {"url": wrong}, {"url": right})
    model = swin.create_model("swin_t", pretrained="mirrored").eval()
    with torch.no_grad():
        assert (model(image) - logits).abs().max().item() <= 1e-5
    assert server.requests == ["/stale/model.safetensors", "/good/model.safetensors"]
    (cached,) = cache_files(swin_home)
    assert cached.read_bytes() == body

    entries("stale_only", {"url": wrong})
    with pytest.raises(WeightsNotFoundError, match="not the weights of swin_t.stale_only"):
        swin.create_model("swin_t", pretrained="stale_only")
    assert cache_files(swin_home) == [cached]


def test_swin_download_checks_the_architecture_too(server, entries, swin_home, capsys):
    entries("stale_cli", {"url": server.serve("/stale/model.safetensors", safetensors_bytes(tiny_swin_state()))})
    assert main(["download", "swin_t.stale_cli"]) == 1
    assert "not the weights of swin_t.stale_cli" in capsys.readouterr().err
    assert cache_files(swin_home) == []


def test_a_model_built_otherwise_is_no_reason_to_refuse_the_download(server, entries, swin_home, timm_reference):
    """The download is checked against the tag's architecture, not the model asked for: with overrides that
    change the trunk, the right file is cached once and the load is the ValueError naming the difference."""
    body = timm_reference[0]
    entries("right", {"url": server.serve("/good/model.safetensors", body)})
    for _ in range(2):
        with pytest.raises(ValueError, match="does not fit the model"):
            swin.create_model("swin_t", pretrained="right", embed_dim=48)
    assert server.requests == ["/good/model.safetensors"]  # cached once, not fetched again
    (cached,) = cache_files(swin_home)
    assert cached.read_bytes() == body


def test_swin_predict_checks_the_architecture_too(server, entries, swin_home, capsys, tmp_path):
    from PIL import Image

    Image.new("RGB", (64, 64), (120, 30, 200)).save(tmp_path / "image.png")
    entries("stale_predict", {"url": server.serve("/stale/model.safetensors", safetensors_bytes(tiny_swin_state()))})
    assert main(["predict", str(tmp_path / "image.png"), "--model", "swin_t", "--weights", "stale_predict"]) != 0
    assert "not the weights of swin_t.stale_predict" in capsys.readouterr().err
    assert cache_files(swin_home) == []


@pytest.mark.parametrize(
    ("timm_name", "ours", "says"),
    [
        ("swin_tiny_patch4_window7_224", "swinv2_t_w8", "Swin V1 checkpoint and the model a Swin V2"),
        ("swinv2_tiny_window8_256", "swin_t", "Swin V2 checkpoint and the model a Swin V1"),
    ],
)
def test_weights_of_the_other_swin_version_say_which_to_build(timm_name, ours, says):
    import timm

    with pytest.raises(ValueError, match=says):
        swin.create_model(ours, pretrained=timm.create_model(timm_name).state_dict())
