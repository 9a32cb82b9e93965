"""The manifest against what its publishers state: timm's pretrained configs, torchvision's weight enums, and
the official MODELHUB table (through the parameter counts it publishes)."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

import swin
from swin.weights import manifest
from swin.weights.data_config import create_transform

ARCHS = {name: swin.get_config(name).aliases[0] for name in swin.list_models()}
ENTRIES = manifest.list_pretrained()


def _timm_tags() -> list[tuple[str, str]]:
    import timm

    pairs = []
    for arch, alias in ARCHS.items():
        for full in timm.list_pretrained(f"{alias}.*"):
            pairs.append((arch, full.split(".", 1)[1]))
    return pairs


def test_every_official_checkpoint_and_torchvision_training_is_listed():
    expected = {f"{arch}.{tag}" for arch, tag in _timm_tags()}
    expected |= {"swin_t.tv_in1k", "swin_s.tv_in1k", "swin_b.tv_in1k"}
    expected |= {"swinv2_t_w8.tv_in1k", "swinv2_s_w8.tv_in1k", "swinv2_b_w8.tv_in1k"}
    assert set(ENTRIES) == expected
    assert len(ENTRIES) == 19 + 15  # V1, then V2: 12 official checkpoints and torchvision's three
    assert swin.list_models(pretrained=True) == sorted(ENTRIES)
    assert swin.list_models("swin_b", pretrained=True) == [n for n in sorted(ENTRIES) if n.startswith("swin_b.")]
    assert "swin_t" in swin.list_models()  # architectures are still listed without the flag


@pytest.mark.parametrize("name", [n for n in ENTRIES if ".ms_" in n])
def test_microsoft_entries_match_timm_pretrained_cfg(name):
    from timm.models import get_pretrained_cfg

    entry = manifest.get_entry(name)
    cfg = get_pretrained_cfg(f"{ARCHS[entry.arch]}.{entry.tag}")
    hub, github = entry.sources
    assert (hub.hf_hub, hub.filename, hub.layout) == (cfg.hf_hub_id, "model.safetensors", "timm")
    assert (github.url, github.layout) == (cfg.url, "official")
    assert entry.num_classes == cfg.num_classes
    assert entry.input_size == tuple(cfg.input_size)
    assert (entry.crop_pct, entry.crop_mode, entry.interpolation) == (cfg.crop_pct, cfg.crop_mode, cfg.interpolation)
    assert entry.mean == tuple(cfg.mean) and entry.std == tuple(cfg.std)
    assert entry.labels == {1000: "imagenet-1k", 21841: "imagenet-22k"}[entry.num_classes]


TORCHVISION_WEIGHTS = {
    "swin_t": "Swin_T_Weights",
    "swin_s": "Swin_S_Weights",
    "swin_b": "Swin_B_Weights",
    "swinv2_t_w8": "Swin_V2_T_Weights",
    "swinv2_s_w8": "Swin_V2_S_Weights",
    "swinv2_b_w8": "Swin_V2_B_Weights",
}


@pytest.mark.parametrize("arch", TORCHVISION_WEIGHTS)
def test_torchvision_entries_match_torchvision_weights(arch):
    import torchvision

    weights = getattr(torchvision.models, TORCHVISION_WEIGHTS[arch]).IMAGENET1K_V1
    entry = manifest.get_entry(arch, "tv_in1k")
    (source,) = entry.sources
    assert source.url == weights.url and source.layout == "torchvision"
    assert weights.url.rsplit("-", 1)[1].startswith(source.sha256_prefix)
    metrics = weights.meta["_metrics"]["ImageNet-1K"]
    assert (entry.metrics["top1"], entry.metrics["top5"]) == (metrics["acc@1"], metrics["acc@5"])
    assert entry.metrics["params"] == weights.meta["num_params"]
    assert entry.metrics["gflops"] == weights.meta["_ops"]
    transform = weights.transforms()
    assert entry.data_config()["resize_size"] == transform.resize_size[0]
    assert entry.input_size[1:] == (transform.crop_size[0],) * 2
    assert entry.interpolation == transform.interpolation.value
    with torch.device("meta"):  # torchvision's exact parameter count is our architecture's
        model = swin.create_model(arch)
    # ... but for the k third of V2's fused qkv bias, which torchvision stores and zeroes in every forward.
    k_bias = sum(block.attn.q_bias.numel() for stage in model.layers for block in stage.blocks if arch[5:6] == "2")
    assert sum(p.numel() for p in model.parameters()) + k_bias == weights.meta["num_params"]


def test_defaults_are_timm_defaults():
    from timm.models import get_pretrained_cfg

    for arch, alias in ARCHS.items():
        assert manifest.get_entry(arch).tag == get_pretrained_cfg(alias).tag
        assert sum(manifest.get_entry(n).default for n in manifest.list_pretrained(arch)) == 1


@pytest.mark.parametrize("name", [n for n in ENTRIES if n.endswith(("ms_in1k", "ms_in22k_ft_in1k"))])
def test_published_params_match_the_architecture(name):
    """MODELHUB.md gives params in millions, rounded: our 1000-class model must round to the same."""
    entry = manifest.get_entry(name)
    with torch.device("meta"):
        count = sum(p.numel() for p in swin.create_model(entry.arch).parameters())
    assert round(count / 1e6) == entry.metrics["params_m"]
    assert entry.metrics["top1"] is not None and entry.metrics["top5"] is not None


def test_tags_aliases_and_errors():
    assert manifest.get_entry("swin_base_patch4_window12_384.ms_in22k").name == "swin_b_384.ms_in22k"
    assert manifest.tags("swin_t")[0] == "ms_in1k"
    with pytest.raises(KeyError, match=r"no pretrained tag 'ms_in22' for swin_t; did you mean 'ms_in22k'\?"):
        manifest.get_entry("swin_t.ms_in22")
    with pytest.raises(ValueError, match="already exists"):
        manifest.register_pretrained({"swin_t.ms_in1k": {"sources": [{"url": "http://127.0.0.1/x.pth"}]}})
    with pytest.raises(ValueError, match="exactly one of url or hf_hub"):
        manifest.register_pretrained({"swin_t.bad": {"sources": [{}]}})


@pytest.mark.parametrize("name", [123, 1.5, None, ("swin_t", "x")])
def test_entry_names_that_are_not_strings_are_a_clear_error(entries, name):
    """YAML reads an unquoted ``123:`` or ``1.5:`` as a number."""
    with pytest.raises(ValueError, match=rf"entry names are strings ARCH\.TAG .*got {re.escape(repr(name))}"):
        manifest.register_pretrained({name: {"sources": [{"url": "https://h/x.pth"}]}})


def test_patterns_match_timm_names_too(capsys):
    """``swin list --pretrained`` and ``swin download`` patterns find checkpoints by timm's names as well: every
    tag timm publishes for swin_tiny_patch4_window7_224, as ours for swin_t."""
    import timm

    from swin.tools.cli import main

    published = {name.split(".", 1)[1] for name in timm.list_pretrained("swin_tiny_patch4_window7_224.*")}
    found = manifest.list_pretrained("swin_tiny_patch4*")
    assert published <= {name.split(".", 1)[1] for name in found}
    assert all(name.startswith("swin_t.") for name in found)
    assert main(["list", "--pretrained", "swin_tiny_patch4*", "--format", "json"]) == 0
    assert {row["name"] for row in json.loads(capsys.readouterr().out)} == set(found)


def test_hub_url_follows_hf_endpoint(monkeypatch):
    source = manifest.get_entry("swin_t.ms_in1k").sources[0]
    assert source.resolve_url() == (
        "https://huggingface.co/timm/swin_tiny_patch4_window7_224.ms_in1k/resolve/main/model.safetensors"
    )
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9/")
    assert source.resolve_url().startswith("http://127.0.0.1:9/timm/swin_tiny_patch4_window7_224.ms_in1k/resolve/")


def test_data_config():
    config = swin.data_config("swin_b_384")
    assert config["input_size"] == (3, 384, 384) and config["crop_pct"] == 1.0 and config["resize_size"] == 384
    assert swin.data_config("swin_t.tv_in1k")["resize_size"] == 232
    with torch.device("meta"):
        model = swin.create_model("swin_t", img_size=256, num_classes=10)
    config = swin.data_config(model)
    assert config["input_size"] == (3, 256, 256)
    assert config["resize_size"] == math.floor(256 / 0.9) and config["labels"] is None


@pytest.mark.parametrize("name", ["swin_t.ms_in1k", "swin_b_384.ms_in22k_ft_in1k"])
def test_transform_matches_timm(name):
    """Our evaluation transform gives timm's, built by timm from its own pretrained config."""
    from PIL import Image
    from timm.data import create_transform as timm_transform
    from timm.data import resolve_data_config
    from timm.models import get_pretrained_cfg

    entry = manifest.get_entry(name)
    cfg = get_pretrained_cfg(f"{ARCHS[entry.arch]}.{entry.tag}").to_dict()
    reference = timm_transform(**resolve_data_config(pretrained_cfg=cfg))
    pixels = torch.randint(0, 256, (300, 400, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    image = Image.fromarray(pixels.numpy())
    torch.testing.assert_close(create_transform(swin.data_config(name))(image), reference(image))
