"""transformers' own Swin folders and hub repositories (``config.json`` of model_type swin / swinv2, its image
processor, weights in transformers' names) build with ``local-dir:`` and ``hf-hub:``, as microsoft's Swin
repositories are laid out.

The judges are transformers: its model of the same folder computes our logits, and its image processor (PIL
backend) prepares an image as our transform of the model does. The folders are written by transformers'
``save_pretrained``; the hub is a loopback server.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

import swin

transformers = pytest.importorskip("transformers")

SMALL = {"embed_dim": 32, "depths": [2, 2, 2, 2], "num_heads": [1, 2, 4, 8]}
# the image processor microsoft's Swin repositories name (a resize to the input size, no crop)
VIT_PROCESSOR = {
    "do_normalize": True,
    "do_resize": True,
    "feature_extractor_type": "ViTFeatureExtractor",
    "image_mean": [0.485, 0.456, 0.406],
    "image_std": [0.229, 0.224, 0.225],
    "resample": 3,
    "size": 224,
}


def _hf_model(version: int = 1, **fields):
    torch.manual_seed(0)
    cls = transformers.Swinv2Config if version == 2 else transformers.SwinConfig
    model_class = transformers.Swinv2ForImageClassification if version == 2 else transformers.SwinForImageClassification
    model = model_class(cls(**{**SMALL, **fields})).eval()
    with torch.no_grad():  # position biases large enough to matter, weights away from their initial values
        for key, parameter in model.named_parameters():
            position = "position_bias" in key or "continuous_position_bias_mlp" in key
            parameter.add_(torch.randn_like(parameter), alpha=0.5 if position else 0.02)
    return model


def _folder(tmp_path, model, processor=VIT_PROCESSOR):
    model.save_pretrained(tmp_path)
    if processor is not None:
        (tmp_path / "preprocessor_config.json").write_text(json.dumps(processor))
    return tmp_path


def _same_logits(ours, theirs, size=(224, 224)):
    x = torch.randn(2, 3, *size)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x).logits, atol=1e-4, rtol=1e-4)


def _image(height=300, width=401):
    return Image.fromarray(np.random.default_rng(height).integers(0, 256, (height, width, 3), dtype=np.uint8))


def test_a_transformers_folder_builds_with_its_labels_and_preprocessing(tmp_path):
    theirs = _hf_model(num_labels=5, id2label={i: f"kind {i}" for i in range(5)})
    folder = _folder(tmp_path, theirs)
    ours = swin.create_model(f"local-dir:{folder}", pretrained=True).eval()
    _same_logits(ours, theirs)
    assert ours.num_classes == 5 and ours.pretrained_cfg["label_names"] == [f"kind {i}" for i in range(5)]
    processor = transformers.AutoImageProcessor.from_pretrained(str(folder), backend="pil")
    for image in (_image(), _image(500, 333)):
        expected = processor(image, return_tensors="pt")["pixel_values"][0]
        torch.testing.assert_close(swin.weights.create_transform(ours)(image), expected)


def test_a_swin_v2_folder_with_pretrained_windows(tmp_path):
    theirs = _hf_model(2, image_size=256, window_size=8, pretrained_window_sizes=[6, 6, 6, 4], num_labels=3)
    ours = swin.create_model(f"local-dir:{_folder(tmp_path, theirs, None)}", pretrained=True).eval()
    assert ours.config.version == 2 and ours.config.pretrained_window_sizes == (6, 6, 6, 4)
    _same_logits(ours, theirs, (256, 256))


def test_a_hub_repository_is_read_as_transformers_lays_it_out(server, monkeypatch, tmp_path):
    theirs = _hf_model(num_labels=4)
    folder = _folder(tmp_path, theirs)
    repo = "someone/swin-from-transformers"
    for name in ("config.json", "preprocessor_config.json", "model.safetensors"):
        server.serve(f"/{repo}/resolve/main/{name}", (folder / name).read_bytes())
    monkeypatch.setenv("HF_ENDPOINT", server.base)
    ours = swin.create_model(f"hf-hub:{repo}", pretrained=True).eval()
    _same_logits(ours, theirs)
    assert ours.pretrained_cfg["hf_hub_id"] == repo and ours.pretrained_cfg["crop_mode"] == "squash"
    assert "label_names" not in ours.pretrained_cfg  # LABEL_0..3: no names


def test_a_hub_repository_without_an_image_processor(server, monkeypatch, tmp_path):
    theirs = _hf_model(num_labels=4)
    folder = _folder(tmp_path, theirs, None)
    repo = "someone/swin-no-processor"
    for name in ("config.json", "model.safetensors"):
        server.serve(f"/{repo}/resolve/main/{name}", (folder / name).read_bytes())
    monkeypatch.setenv("HF_ENDPOINT", server.base)
    ours = swin.create_model(f"hf-hub:{repo}", pretrained=True).eval()
    _same_logits(ours, theirs)


def test_our_transformers_folder_reads_back_as_the_same_model(tmp_path):
    saved = swin.create_model("swin_t", **{k: tuple(v) if isinstance(v, list) else v for k, v in SMALL.items()})
    swin.save_for_transformers(saved, tmp_path)
    again = swin.create_model(f"local-dir:{tmp_path}", pretrained=True).eval()
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(again(x), saved.eval()(x))
    keys = ("input_size", "resize_size", "crop_pct", "crop_mode", "interpolation", "mean", "std", "num_classes")
    assert {k: swin.data_config(again)[k] for k in keys} == {k: swin.data_config(saved)[k] for k in keys}
    assert again.pretrained_cfg["label_names"][0] == "tench, Tinca tinca"


def test_a_headless_swin_model_folder(tmp_path):
    torch.manual_seed(0)
    theirs = transformers.SwinModel(transformers.SwinConfig(**SMALL)).eval()
    ours = swin.create_model(f"local-dir:{_folder(tmp_path, theirs, None)}", pretrained=True).eval()
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x).pooler_output, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"hidden_act": "gelu_new"}, "config.json's hidden_act is 'gelu_new'"),
        ({"layer_norm_eps": 1e-6}, "config.json's layer_norm_eps is 1e-06"),
        ({"model_type": "vit"}, "(a transformers 'vit' model)"),
        ({"id2label": {"0": "a", "2": "b"}}, "does not number its classes 0..1"),
    ],
)
def test_what_no_model_here_runs_as_transformers_is_named(tmp_path, change, named):
    theirs = _hf_model(num_labels=2)
    folder = _folder(tmp_path, theirs, None)
    config = json.loads((folder / "config.json").read_text()) | change
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError) as error:
        swin.create_model(f"local-dir:{folder}", pretrained=True)
    assert named in str(error.value)
