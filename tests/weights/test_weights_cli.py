"""``swin download``, ``swin convert``, ``swin predict`` and ``swin list --pretrained``, against loopback and timm."""

from __future__ import annotations

import json

import pytest
import torch

from swin.tools.cli import main
from tests.weights.conftest import safetensors_bytes

HUB_PATH = "/timm/swin_tiny_patch4_window7_224.ms_in1k/resolve/main/model.safetensors"


@pytest.fixture(scope="module")
def timm_model():
    import timm

    torch.manual_seed(0)
    return timm.create_model("swin_tiny_patch4_window7_224").eval()


def test_download_then_list_shows_it_cached(server, monkeypatch, capsys, swin_home, timm_model):
    server.serve(HUB_PATH, safetensors_bytes(timm_model.state_dict()))
    monkeypatch.setenv("HF_ENDPOINT", server.base)
    assert main(["download", "swin_t"]) == 0
    path = swin_home / "weights" / "swin_t.ms_in1k" / "model.safetensors"
    assert capsys.readouterr().out.strip() == f"swin_t.ms_in1k: {path}"
    monkeypatch.setenv("SWIN_OFFLINE", "1")
    assert main(["download", "swin_tiny_patch4_window7_224.ms_in1k"]) == 0  # from the cache
    assert server.requests == [HUB_PATH]
    capsys.readouterr()

    assert main(["list", "--pretrained", "swin_t", "--format", "json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == {"swin_t.ms_in1k", "swin_t.ms_in22k", "swin_t.ms_in22k_ft_in1k", "swin_t.tv_in1k"}
    assert rows["swin_t.ms_in1k"]["cached"] and not rows["swin_t.ms_in22k"]["cached"]
    assert rows["swin_t.ms_in1k"]["top1"] == 81.2 and rows["swin_t.ms_in1k"]["default"]


def test_download_failure_exit_code(monkeypatch, capsys, server):
    monkeypatch.setenv("SWIN_OFFLINE", "1")
    assert main(["download", "swin_b.ms_in22k"]) == 1
    err = capsys.readouterr().err
    assert "offline mode is on" in err and err.count("\n") == 1  # one line (README), the cache path in it
    assert "swin_b.ms_in22k" in err and "weights" in err
    assert main(["download", "swin_q"]) == 2
    assert server.requests == []


def test_list_pretrained_table(capsys):
    assert main(["list", "--pretrained"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[0].split() == ["checkpoint", "classes", "input", "crop", "top-1", "top-5", "params", "GMACs", "cached"]
    assert len(lines) == 1 + 19 + 15 and lines[1].startswith("swin_b.ms_in1k")
    assert "GFLOPs = 2 x GMACs" in captured.err
    assert len({line.index(" 224x224") for line in lines if " 224x224" in line}) == 1  # aligned


def test_list_pretrained_units_against_torchvision(capsys):
    """Exact parameters and GMACs for every entry, held to torchvision's published meta (its "GFLOPS" are
    multiply-adds), the *_192 entries included (their published figure is missing)."""
    import json

    from torchvision.models import Swin_B_Weights, Swin_T_Weights, Swin_V2_T_Weights

    assert main(["list", "--pretrained", "--format", "json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    for name, weights in (("swin_t", Swin_T_Weights), ("swin_b", Swin_B_Weights), ("swinv2_t_w8", Swin_V2_T_Weights)):
        meta = weights.IMAGENET1K_V1.meta
        row = rows[f"{name}.tv_in1k"]
        assert abs(row["gmacs"] - meta["_ops"]) < 0.01 * meta["_ops"]
        if name != "swinv2_t_w8":  # torchvision V2 keeps a qkv bias of 3C (k part zeroed), official q and v: +C a block
            assert row["params"] == meta["num_params"]
    assert all(r["gmacs"] > 0 and r["params"] > 0 for r in rows.values())


def test_convert_to_official_timm_and_ours(tmp_path, capsys, timm_model):
    from safetensors.torch import load_file
    from timm.models.swin_transformer import checkpoint_filter_fn

    import swin

    source = tmp_path / "timm.safetensors"
    source.write_bytes(safetensors_bytes(timm_model.state_dict()))

    assert main(["convert", str(source), str(tmp_path / "official.safetensors"), "--to", "official"]) == 0
    assert "(timm layout) ->" in capsys.readouterr().out
    official = load_file(tmp_path / "official.safetensors")
    assert "layers.0.downsample.reduction.weight" in official
    filtered = checkpoint_filter_fn(official, timm_model)  # timm's own reader of official checkpoints
    assert all(torch.equal(filtered[k], v) for k, v in timm_model.state_dict().items())

    assert main(["convert", str(tmp_path / "official.safetensors"), str(tmp_path / "back.pth"), "--to", "timm"]) == 0
    back = torch.load(tmp_path / "back.pth", weights_only=True)
    assert set(back) == set(timm_model.state_dict())

    assert main(["convert", str(source), str(tmp_path / "ours.safetensors")]) == 0
    with torch.device("meta"):
        assert set(load_file(tmp_path / "ours.safetensors")) == set(swin.create_model("swin_t").state_dict())


def test_predict_from_cache_matches_timm(tmp_path, monkeypatch, capsys, swin_home, timm_model):
    """Weights in the cache (timm's random model), offline; the top-5 and class names are those timm gives
    with its own preprocessing of the same image and ImageNet-1k names."""
    from PIL import Image
    from timm.data import ImageNetInfo, create_transform, resolve_data_config

    cached = swin_home / "weights" / "swin_t.ms_in1k" / "model.safetensors"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(safetensors_bytes(timm_model.state_dict()))
    pixels = torch.randint(0, 256, (260, 300, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(5))
    image_path = tmp_path / "image.png"
    Image.fromarray(pixels.numpy()).save(image_path)
    monkeypatch.setenv("SWIN_OFFLINE", "1")

    assert main(["predict", str(image_path), "--model", "swin_t.ms_in1k", "--format", "json"]) == 0
    top = json.loads(capsys.readouterr().out)["top"]

    transform = create_transform(**resolve_data_config(model=timm_model))
    with torch.no_grad(), Image.open(image_path) as image:
        probabilities = timm_model(transform(image.convert("RGB")).unsqueeze(0)).softmax(-1)[0]
    expected = probabilities.topk(5)
    info = ImageNetInfo("imagenet-1k")
    assert [row["index"] for row in top] == expected.indices.tolist()
    assert [row["label"] for row in top] == [info.index_to_description(i) for i in expected.indices.tolist()]
    torch.testing.assert_close(torch.tensor([row["probability"] for row in top]), expected.values, atol=1e-6, rtol=0)


def test_predict_without_weights_says_where_to_put_them(tmp_path, monkeypatch, capsys, swin_home):
    monkeypatch.setenv("SWIN_OFFLINE", "1")
    assert main(["predict", str(tmp_path / "missing.png"), "--model", "swin_t"]) == 1
    assert str(swin_home / "weights" / "swin_t.ms_in1k") in capsys.readouterr().err
