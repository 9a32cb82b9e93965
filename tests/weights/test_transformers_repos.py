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


@pytest.mark.parametrize(
    ("version", "fields", "named"),
    [
        (1, {"image_size": 256, "window_size": 7}, "stage 1's 64x64 map is no multiple of the 7x7 window"),
        (2, {"image_size": 224, "window_size": 8}, "stage 2's 28x28 map is no multiple of the 8x8 window"),
        (1, {"image_size": [224, 448]}, "stage 4's 7x14 map is not square"),
    ],
)
def test_a_size_where_transformers_pads_before_the_shift_is_refused(tmp_path, version, fields, named):
    """transformers pads such maps before the cyclic shift (and shrinks both axes of a small non-square map),
    the classification rules here otherwise: a model built from the folder gave logits 0.002-0.09 apart."""
    folder = _folder(tmp_path, _hf_model(version, num_labels=3, **fields), None)
    with pytest.raises(ValueError, match=named):
        swin.create_model(f"local-dir:{folder}", pretrained=True)


# each accepted processor file: our transform of the model equals transformers' PIL processor on images whose
# crop offsets are whole (transformers rounds a half offset down, torchvision to the nearest)
PROCESSORS = {
    "ViT defaults (bilinear, 0.5)": {"image_processor_type": "ViTImageProcessor"},
    "ViT, no normalisation": {"image_processor_type": "ViTImageProcessor", "do_normalize": False, "resample": 3},
    "ViT, one mean for all": {"image_processor_type": "ViTImageProcessor", "image_mean": 0.4, "image_std": 0.3},
    "Bit": {"image_processor_type": "BitImageProcessor", "size": {"shortest_edge": 256}, "crop_size": 224},
    "ConvNext below 384": {"image_processor_type": "ConvNextImageProcessor", "size": {"shortest_edge": 224}},
}


@pytest.mark.parametrize("processor", PROCESSORS.values(), ids=PROCESSORS.keys())
def test_a_processor_file_leaving_entries_to_its_class_defaults(tmp_path, processor):
    folder = _folder(tmp_path, _hf_model(num_labels=3), processor)
    ours = swin.create_model(f"local-dir:{folder}", pretrained=True)
    theirs = transformers.AutoImageProcessor.from_pretrained(str(folder), backend="pil")
    for image in (_image(300, 400), _image(256, 320)):
        expected = theirs(image, return_tensors="pt")["pixel_values"][0]
        torch.testing.assert_close(swin.weights.create_transform(ours)(image), expected)


def test_convnexts_processor_from_384_squashes(tmp_path):
    processor = {"image_processor_type": "ConvNextImageProcessor", "size": {"shortest_edge": 384}}
    folder = _folder(tmp_path, _hf_model(num_labels=3, image_size=384, window_size=12), processor)
    ours = swin.create_model(f"local-dir:{folder}", pretrained=True)
    theirs = transformers.AutoImageProcessor.from_pretrained(str(folder), backend="pil")
    image = _image(300, 401)
    torch.testing.assert_close(
        swin.weights.create_transform(ours)(image), theirs(image, return_tensors="pt")["pixel_values"][0]
    )


@pytest.mark.parametrize(
    ("processor", "named"),
    [
        ({"image_processor_type": "ViTImageProcessor", "do_rescale": False}, "does not scale pixel values"),
        ({"image_processor_type": "SomeoneElsesProcessor"}, "names the image processor 'SomeoneElsesProcessor'"),
        ({"image_processor_type": "ViTImageProcessor", "size": 256}, "resizes to (256, 256) without a crop"),
    ],
)
def test_a_processor_the_transform_cannot_follow_is_named_in_a_warning(tmp_path, processor, named):
    folder = _folder(tmp_path, _hf_model(num_labels=3), processor)
    with pytest.warns(UserWarning, match="keeps the default preprocessing") as warned:
        swin.create_model(f"local-dir:{folder}", pretrained=True)
    assert any(named in str(w.message) for w in warned)


def test_a_backbone_repository_is_built_with_features_only_and_its_stages(tmp_path):
    """Its out_features are the default out_indices (the other stages' norms are not in it); the detection rules
    at a size that is no window multiple, as transformers' SwinBackbone (a classifier there is refused)."""
    torch.manual_seed(0)
    config = transformers.SwinConfig(**SMALL, image_size=256, out_features=["stage2", "stage4"])
    theirs = transformers.SwinBackbone(config).eval()
    folder = _folder(tmp_path, theirs, None)
    with pytest.raises(ValueError, match=r"holds a backbone .* features_only=True \(its stages, out_indices=\(1, 3\)"):
        swin.create_model(f"local-dir:{folder}", pretrained=True)
    # transformers 5.24's SwinBackbone carries a final layernorm it never uses: dropped, and said
    with pytest.warns(UserWarning, match="dropped 2 key.* norm.bias, norm.weight"):
        ours = swin.create_model(f"local-dir:{folder}", pretrained=True, features_only=True)
    assert ours.out_indices == (1, 3)
    ours.eval()
    x = torch.randn(1, 3, 256, 256)
    with torch.no_grad():
        for a, b in zip(ours(x), theirs(x).feature_maps, strict=True):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_an_imagenet_22k_head_with_its_class_names(tmp_path):
    """21,841 classes named in id2label and label2id: a config.json of some MB (it was refused over 1 MiB)."""
    names = {i: f"class number {i} of the large set" for i in range(21841)}
    folder = _folder(tmp_path, _hf_model(num_labels=21841, id2label=names), None)
    assert (folder / "config.json").stat().st_size > 1 << 20
    ours = swin.create_model(f"local-dir:{folder}")
    assert ours.num_classes == 21841 and ours.pretrained_cfg["label_names"][21840] == names[21840]
    assert swin.data_config(ours)["labels"] is None  # not the ImageNet set of the architecture it starts from


def test_offline_without_the_cached_processor_says_the_preprocessing_may_not_be_the_repositorys(
    server, monkeypatch, tmp_path
):
    from swin.weights import hub

    folder = _folder(tmp_path, _hf_model(num_labels=3))
    repo = "someone/swin-partly-cached"
    for name in ("config.json", "preprocessor_config.json", "model.safetensors"):
        server.serve(f"/{repo}/resolve/main/{name}", (folder / name).read_bytes())
    monkeypatch.setenv("HF_ENDPOINT", server.base)
    for name in ("config.json", "model.safetensors"):  # cached by an earlier download; the processor not
        hub.hub_file(repo, name)
    monkeypatch.setenv("SWIN_OFFLINE", "1")
    with pytest.warns(UserWarning, match="offline, and its preprocessor_config.json is not in the Hugging Face cache"):
        swin.create_model(f"hf-hub:{repo}", pretrained=True)


def test_a_microsoft_style_folder_saved_again_keeps_its_squash_processor(tmp_path):
    """Read from a repository whose ViT processor resizes to the input size, the model is written back with such
    a processor (it was written without one: a shorter-side resize and crop cannot say a squash)."""
    ours = swin.create_model(f"local-dir:{_folder(tmp_path / 'in', _hf_model(num_labels=3))}", pretrained=True)
    swin.save_for_transformers(ours, tmp_path / "out")
    theirs = transformers.AutoImageProcessor.from_pretrained(str(tmp_path / "out"), backend="pil")
    assert type(theirs).__name__.startswith("ViTImageProcessor")
    image = _image(300, 401)
    torch.testing.assert_close(
        swin.weights.create_transform(ours)(image), theirs(image, return_tensors="pt")["pixel_values"][0]
    )


def test_a_swin_v2_repository_without_pretrained_windows_has_none(tmp_path, monkeypatch):
    """Fields the file gives (zeros included) or leaves to transformers' defaults are never those of the registered
    architecture the model starts from: here one of the same widths registered with pretrained windows."""
    from swin.registry import lookup

    swin.list_models()  # the bundled entries, before the registry is copied for this test
    monkeypatch.setattr(lookup, "_configs", dict(lookup._configs))
    dims = {k: tuple(v) if isinstance(v, list) else v for k, v in SMALL.items()}
    swin.register_model(
        name="aaa_v2_pretrained", version=2, img_size=224, window_size=7, **dims, pretrained_window_sizes=(6, 6, 6, 4)
    )
    config = {**SMALL, "image_size": 224, "num_labels": 3}  # no window_size: transformers' 7
    theirs = _hf_model(2, **config, pretrained_window_sizes=[0, 0, 0, 0])
    folder = _folder(tmp_path, theirs, None)
    written = json.loads((folder / "config.json").read_text())
    written.pop("window_size")
    (folder / "config.json").write_text(json.dumps(written))
    ours = swin.create_model(f"local-dir:{folder}", pretrained=True).eval()
    assert ours.config.pretrained_window_sizes == (0, 0, 0, 0) and ours.config.window_size == 7
    _same_logits(ours, theirs)


@pytest.mark.parametrize("version", [1, 2])
def test_dropout_rates_are_read_with_a_warning_that_transformers_places_them_otherwise(tmp_path, version):
    """transformers drops hidden_dropout_prob after the embeddings (it was not read: pos_drop_rate stayed 0) and
    has no dropout between the MLP's layers, where proj_drop_rate drops here: training differs, which is said."""
    theirs = _hf_model(version, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.05)
    assert theirs.swinv2.embeddings.dropout.p == 0.1 if version == 2 else theirs.swin.embeddings.dropout.p == 0.1
    with pytest.warns(UserWarning, match=r"transformers places its dropouts otherwise .*eval outputs are the same"):
        ours = swin.create_model(f"local-dir:{_folder(tmp_path, theirs)}", pretrained=True).eval()
    config = ours.config
    assert (config.pos_drop_rate, config.proj_drop_rate, config.attn_drop_rate) == (0.1, 0.1, 0.05)
    _same_logits(ours, theirs)
