"""A checkpoint given as a file or a state dict passes the checks a download passes before it is cached: a
complete Swin trunk with finite weights (README, "Security and failure behaviour")."""

from __future__ import annotations

import pytest
import torch

import swin
from swin.weights import CorruptCheckpointError

from .conftest import tiny_swin_state

TINY = {"depths": (1, 1, 1, 1), "embed_dim": 8, "num_heads": (1, 1, 1, 1), "num_classes": 10, "img_size": 32}


@pytest.mark.parametrize("given", ["file", "state dict"])
def test_non_finite_weights_are_refused_with_their_names(tmp_path, given):
    state = tiny_swin_state(nan=True)
    if given == "file":
        torch.save(state, tmp_path / "nan.pth")
        pretrained = tmp_path / "nan.pth"
    else:
        pretrained = state
    with pytest.raises(CorruptCheckpointError, match=r"non-finite weights .* layers\.1\.blocks\.0\.mlp\.fc1\.weight"):
        swin.create_model("swin_t", pretrained=pretrained, window_size=2, **TINY)
    good = tiny_swin_state()
    model = swin.create_model("swin_t", pretrained=good, window_size=2, **TINY)
    assert torch.equal(model.layers[1].blocks[0].mlp.fc1.weight, good["layers.1.blocks.0.mlp.fc1.weight"])


def test_an_incomplete_trunk_is_refused(tmp_path):
    state = tiny_swin_state()
    del state["layers.2.blocks.0.attn.qkv.weight"]
    with pytest.raises(ValueError, match=r"layers\.2\.blocks\.0"):  # (CorruptCheckpointError is one too)
        swin.create_model("swin_t", pretrained=state, window_size=2, **TINY)
