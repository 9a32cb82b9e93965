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


def _timm_model_names() -> dict[str, str]:
    """timm's model name for each architecture with a Hugging Face copy timm publishes (its hub id)."""
    from swin.weights import manifest

    return {
        entry.arch: source.hf_hub.removeprefix("timm/").split(".")[0]
        for entry in manifest.entries()
        for source in entry.sources
        if source.hf_hub and source.hf_hub.startswith("timm/")
    }


def _timm_gmacs_without_position_mlp(model_name: str, num_classes: int, size: int) -> float:
    """Multiply-adds of timm's forward as torch's FLOP counter sees them, less the continuous position bias
    MLP: Microsoft's published Swin V2 figures leave it out (swinv2_l 384: published 115.4, counted 115.99
    with it, 115.39 without; torchvision's meta counts it)."""
    import timm
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        model = timm.create_model(model_name, num_classes=num_classes)
        image = torch.empty(1, 3, size, size)
    with FlopCounterMode(display=False) as counter:
        model(image)
    position_mlp = sum(sum(c.values()) for name, c in counter.get_flop_counts().items() if name.endswith("cpb_mlp"))
    return (counter.get_total_flops() - position_mlp) / 2e9


def test_list_pretrained_units_against_timm_and_published_figures(capsys):
    """Every entry: parameters exactly as timm's model of that architecture and head counts them; GMACs
    within 1% of the published figure (Microsoft's tables, torchvision's meta "GFLOPS": both multiply-adds),
    or for the *_192 entries, which have none, of timm's forward measured by torch's FLOP counter. The
    torchvision entries are also held to torchvision's own meta, their V1 parameter counts exactly."""
    import timm
    from torchvision import models

    assert main(["list", "--pretrained", "--format", "json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert len(rows) == 34
    timm_names = _timm_model_names()
    for name, row in rows.items():
        with torch.device("meta"):
            reference = timm.create_model(timm_names[name.split(".")[0]], num_classes=row["num_classes"])
        assert row["params"] == sum(p.numel() for p in reference.parameters()), name
        published = row["published_gmacs"]
        if published is None:
            assert name.split(".")[0].endswith("_192"), name
            published = _timm_gmacs_without_position_mlp(
                timm_names[name.split(".")[0]], row["num_classes"], row["input_size"][-1]
            )
        assert abs(row["gmacs"] - published) < 0.01 * published, (name, row["gmacs"], published)
    torchvision = {"swin_t": "Swin_T", "swin_s": "Swin_S", "swin_b": "Swin_B"}
    torchvision |= {f"swinv2_{size}_w8": f"Swin_V2_{size.upper()}" for size in "tsb"}
    assert {name for name in rows if name.endswith(".tv_in1k")} == {f"{arch}.tv_in1k" for arch in torchvision}
    for arch, weights in torchvision.items():
        meta = getattr(models, f"{weights}_Weights").IMAGENET1K_V1.meta
        row = rows[f"{arch}.tv_in1k"]
        assert abs(row["gmacs"] - meta["_ops"]) < 0.01 * meta["_ops"], arch
        if not arch.startswith("swinv2"):  # torchvision V2 keeps a qkv bias of 3C (k part zeroed), official q and v
            assert row["params"] == meta["num_params"], arch


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
    from PIL import Image

    Image.new("RGB", (32, 32)).save(tmp_path / "image.png")  # an image there: a missing one is named first
    assert main(["predict", str(tmp_path / "image.png"), "--model", "swin_t"]) == 1
    assert str(swin_home / "weights" / "swin_t.ms_in1k") in capsys.readouterr().err
