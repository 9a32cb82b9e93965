"""timm's ``hf-hub:`` names: a timm model repository (config.json and weights in timm's layout), served by a
loopback server standing in for the hub, read by create_model as timm's create_model reads it."""

from __future__ import annotations

import json

import pytest
import torch

import swin
from swin.weights import export
from swin.weights.download import DownloadError
from tests.weights.conftest import safetensors_bytes, tiny_swin_state

REPO = "someone/tiny-swin"
# tiny_swin_state's architecture, as timm's push_to_hf_hub describes a model (architecture, head, preprocessing)
MODEL_ARGS = {"embed_dim": 8, "depths": [1, 1, 1, 1], "num_heads": [1, 1, 1, 1], "img_size": 32, "window_size": 2}
PRETRAINED_CFG = {"input_size": [3, 32, 32], "interpolation": "bilinear", "crop_pct": 0.875, "mean": [0.5] * 3}
CONFIG = {
    "architecture": "swin_tiny_patch4_window7_224",
    "num_classes": 10,
    "num_features": 64,
    "global_pool": "avg",
    "model_args": MODEL_ARGS,
    "pretrained_cfg": {**PRETRAINED_CFG, "std": [0.5] * 3, "num_classes": 10, "classifier": "head.fc"},
}


@pytest.fixture
def hub_repo(server, monkeypatch):
    server.serve(f"/{REPO}/resolve/main/config.json", json.dumps(CONFIG).encode())
    server.serve(f"/{REPO}/resolve/main/model.safetensors", safetensors_bytes(export(tiny_swin_state(), "timm")))
    monkeypatch.setenv("HF_ENDPOINT", server.base)
    return server


def test_a_timm_hub_repository_builds_and_loads_as_timm_reads_it(hub_repo, tmp_path):
    """The reference: timm building the config's architecture with its model_args and loading the same weights
    file from disk (timm's own hf-hub: reading would reach its import-time endpoint, not this server)."""
    timm = pytest.importorskip("timm")
    ours = swin.create_model(f"hf-hub:{REPO}", pretrained=True).eval()
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(safetensors_bytes(export(tiny_swin_state(), "timm")))
    theirs = timm.create_model(
        CONFIG["architecture"],
        pretrained=True,
        pretrained_cfg_overlay={"file": str(weights), "num_classes": 10},  # its head is the file's
        num_classes=10,
        **MODEL_ARGS,
    ).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=1e-5)
    assert ours.num_classes == 10
    cfg = ours.pretrained_cfg
    assert (tuple(cfg["input_size"]), cfg["interpolation"], cfg["crop_pct"]) == ((3, 32, 32), "bilinear", 0.875)
    assert tuple(cfg["mean"]) == tuple(cfg["std"]) == (0.5, 0.5, 0.5)
    assert [r.path for r in hub_repo.log if r.method == "GET"] == [
        f"/{REPO}/resolve/main/config.json",
        f"/{REPO}/resolve/main/model.safetensors",
    ]


def test_without_pretrained_only_the_description_is_read(hub_repo):
    model = swin.create_model(f"hf-hub:{REPO}", num_classes=3)  # the caller's overrides win
    assert model.num_classes == 3 and model.config.embed_dim == 8
    assert [r.path for r in hub_repo.log if r.method == "GET"] == [f"/{REPO}/resolve/main/config.json"]


def test_bad_hub_names_and_repositories_are_named(server, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", server.base)
    with pytest.raises(ValueError, match="hf-hub:tiny-swin is not a hub repository; write hf-hub:OWNER/NAME"):
        swin.create_model("hf-hub:tiny-swin")
    with pytest.raises(ValueError, match="names its own weights: pass pretrained=True"):
        swin.create_model(f"hf-hub:{REPO}", pretrained="ms_in1k")
    with pytest.raises(DownloadError, match="config.json"):
        swin.create_model(f"hf-hub:{REPO}")  # nothing served
    server.serve(f"/{REPO}/resolve/main/config.json", b'{"num_classes": 3}')
    with pytest.raises(ValueError, match="config.json names no architecture"):
        swin.create_model(f"hf-hub:{REPO}")


def test_an_older_config_and_what_the_model_records(server, monkeypatch):
    """timm's older config.json is the pretrained_cfg itself beside the architecture (timm builds at its
    input_size and takes its preprocessing); an architecture with a tag is read without it, as timm; the model
    says where it came from and keeps the repository's class names instead of claiming ImageNet's."""
    labels = [f"class {i}" for i in range(10)]
    older = {"architecture": "swin_tiny_patch4_window7_224.custom", "num_classes": 10, "label_names": labels}
    sized_by_input_size = {key: value for key, value in MODEL_ARGS.items() if key != "img_size"}
    older |= {**PRETRAINED_CFG, "std": [0.5] * 3, "model_args": sized_by_input_size}
    server.serve(f"/{REPO}/resolve/v1/config.json", json.dumps(older).encode())
    monkeypatch.setenv("HF_ENDPOINT", server.base)
    model = swin.create_model(f"hf-hub:{REPO}@v1")
    cfg = model.pretrained_cfg
    assert model.config.img_size == (32, 32) and tuple(cfg["input_size"]) == (3, 32, 32)
    assert (cfg["interpolation"], cfg["crop_pct"], tuple(cfg["mean"])) == ("bilinear", 0.875, (0.5, 0.5, 0.5))
    assert (cfg["hf_hub_id"], cfg["source"], cfg["labels"], cfg["label_names"]) == (
        f"{REPO}@v1",
        "hf-hub",
        None,
        labels,
    )


def test_a_head_that_is_not_the_weights_is_an_error(server, monkeypatch):
    """A config whose num_classes is not its weights' head: timm's strict load raises on the size mismatch; here
    it loaded with a random head and a warning. A head asked for by the caller is still adapted."""
    server.serve(f"/{REPO}/resolve/main/config.json", json.dumps({**CONFIG, "num_classes": 5}).encode())
    server.serve(f"/{REPO}/resolve/main/model.safetensors", safetensors_bytes(export(tiny_swin_state(), "timm")))
    monkeypatch.setenv("HF_ENDPOINT", server.base)
    with pytest.raises(ValueError, match="head"):
        swin.create_model(f"hf-hub:{REPO}", pretrained=True)
    with pytest.warns(UserWarning):
        assert swin.create_model(f"hf-hub:{REPO}", pretrained=True, num_classes=3).num_classes == 3
