"""``swin.save_for_transformers`` writes a folder transformers' Auto classes and ``pipeline`` read.

The judge is transformers: ``from_pretrained`` of the folder must load every weight (no missing, unexpected or
mismatched key) into a model whose outputs equal ours, its image processor must prepare an image as our
evaluation transform does, and the class names must be ImageNet's as timm's ``ImageNetInfo`` gives them.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

import swin

transformers = pytest.importorskip("transformers")

SMALL = {"embed_dim": 32, "depths": (2, 2, 2, 2), "num_heads": (1, 2, 4, 8)}


def _noisy(model: torch.nn.Module) -> torch.nn.Module:
    torch.manual_seed(0)
    with torch.no_grad():
        for key, parameter in model.named_parameters():
            position = "cpb_mlp" in key or "relative_position_bias_table" in key
            parameter.add_(torch.randn_like(parameter), alpha=0.5 if position else 0.02)
    return model.eval()


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def _loaded(auto_class, folder):
    model, info = auto_class.from_pretrained(str(folder), output_loading_info=True)
    assert not any(info.values()), info
    return model.eval()


def test_an_imagenet_classifier_runs_in_transformers_pipeline(tmp_path):
    from timm.data import ImageNetInfo

    ours = _noisy(swin.create_model("swin_t", **SMALL))
    swin.save_for_transformers(ours, tmp_path)
    theirs = _loaded(transformers.AutoModelForImageClassification, tmp_path)
    assert type(theirs).__name__ == "SwinForImageClassification"
    info = ImageNetInfo("imagenet-1k")
    assert [theirs.config.id2label[i] for i in (0, 999)] == [info.index_to_description(i) for i in (0, 999)]

    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (300, 400, 3), dtype=np.uint8))
    ours_input = swin.weights.create_transform(ours)(image)[None]
    processor = transformers.AutoImageProcessor.from_pretrained(tmp_path)
    their_input = processor(image, return_tensors="pt")["pixel_values"]
    # the same resize, crop and normalisation; the two resize implementations may round a value apart
    assert their_input.shape == ours_input.shape
    one_level = 1 / 255 / min(processor.image_std)
    assert (their_input - ours_input).abs().max() <= one_level * 1.01
    assert (their_input - ours_input).abs().mean() < 1e-3
    # its PIL backend resizes as PIL does for our transform (here the crop offsets are whole: 53 and 12 pixels)
    pil = transformers.AutoImageProcessor.from_pretrained(tmp_path, backend="pil")
    torch.testing.assert_close(pil(image, return_tensors="pt")["pixel_values"], ours_input)
    with torch.no_grad():
        logits = ours(ours_input)
        _close(theirs(ours_input).logits, logits)
    best = transformers.pipeline("image-classification", model=str(tmp_path))(image, top_k=1)[0]
    assert best["label"] == info.index_to_description(int(logits.argmax()))


def test_a_fine_tuned_swin_v2_head(tmp_path):
    ours = _noisy(swin.create_model("swinv2_t_w8", num_classes=5, pretrained_window_sizes=(6, 6, 6, 4), **SMALL))
    swin.save_for_transformers(ours, tmp_path)
    theirs = _loaded(transformers.AutoModelForImageClassification, tmp_path)
    assert type(theirs).__name__ == "Swinv2ForImageClassification"
    assert theirs.config.id2label[4] == "LABEL_4"  # no ImageNet names for a new head
    x = torch.randn(2, 3, 256, 256)
    with torch.no_grad():
        _close(theirs(x).logits, ours(x))


def test_a_trunk_without_head_is_swin_model(tmp_path):
    ours = _noisy(swin.create_model("swin_t", num_classes=0, **SMALL))
    swin.save_for_transformers(ours, tmp_path)
    theirs = _loaded(transformers.AutoModel, tmp_path)
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        _close(theirs(x).pooler_output, ours(x))


def test_a_backbone_is_swin_backbone(tmp_path):
    ours = _noisy(swin.create_model("swin_t", features_only=True, out_indices=(0, 2), **SMALL))
    swin.save_for_transformers(ours, tmp_path)
    assert not (tmp_path / "preprocessor_config.json").exists()
    # transformers.SwinBackbone: AutoBackbone.from_pretrained (5.24) asks the Hub about any name, a folder too
    theirs = _loaded(transformers.SwinBackbone, tmp_path)
    x = torch.randn(1, 3, 200, 300)
    with torch.no_grad():
        for a, b in zip(theirs(x).feature_maps, ours(x), strict=True):
            _close(a, b)


def test_a_resave_removes_older_weights_transformers_would_read_first(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"older weights")
    swin.save_for_transformers(swin.create_model("swin_t", **SMALL), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "config.json",
        "model.safetensors",
        "preprocessor_config.json",
    ]
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["SwinForImageClassification"]


@pytest.mark.parametrize(
    ("overrides", "size", "why"),
    [
        ({"img_size": (128, 256), "window_size": 2}, (3, 128, 256), "128x256 input"),  # no shorter-side resize
        ({"in_chans": 1}, (1, 224, 224), "1 input channel"),  # transformers' processors make RGB images
    ],
)
def test_a_model_the_processor_cannot_prepare_for_is_saved_without_one_and_says_so(tmp_path, overrides, size, why):
    swin.save_for_transformers(swin.create_model("swin_t", **SMALL), tmp_path)  # an earlier save's processor goes
    ours = _noisy(swin.create_model("swin_t", **overrides, **SMALL))
    with pytest.warns(UserWarning, match="no preprocessor_config.json written") as warned:
        swin.save_for_transformers(ours, tmp_path)
    assert why in str(warned[0].message)
    assert not (tmp_path / "preprocessor_config.json").exists()
    theirs = _loaded(transformers.AutoModelForImageClassification, tmp_path)
    x = torch.randn(1, *size)
    with torch.no_grad():
        _close(theirs(x).logits, ours(x))


def test_an_input_size_where_transformers_pads_before_the_shift_is_refused(tmp_path):
    """At 224x280 stage 2's 28x35 map is odd before patch merging and stage 3's 14x18 needs padding, which
    transformers does before the cyclic shift and the classification rules after it (timm's and the official
    order): a saved folder would compute otherwise."""
    ours = _noisy(swin.create_model("swin_t", img_size=(224, 280), **SMALL))
    with pytest.raises(ValueError, match="stage 2's 28x35 map is odd before patch merging"):
        swin.save_for_transformers(ours, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    # what the refusal prevents: transformers' model of that size, our weights, other logits
    from safetensors.torch import save_file

    config = transformers.SwinConfig(image_size=[224, 280], drop_path_rate=0.0, num_labels=1000, **SMALL)
    config.save_pretrained(tmp_path)
    weights = swin.weights.export(ours.state_dict(), "transformers")
    save_file({k: v.contiguous() for k, v in weights.items()}, tmp_path / "model.safetensors")
    theirs = _loaded(transformers.AutoModelForImageClassification, tmp_path)
    x = torch.randn(1, 3, 224, 280)
    with torch.no_grad():
        assert (theirs(x).logits - ours(x)).abs().max() > 1e-3


@pytest.mark.parametrize(
    ("build", "error", "named"),
    [
        (lambda: swin.create_model("swin_t", window_size=(8, 6), **SMALL), ValueError, "one square window"),
        (lambda: swin.create_model("swin_t", global_pool="max", **SMALL), ValueError, "global_pool='max'"),
        (lambda: swin.create_model("swin_t", patch_norm=False, **SMALL), ValueError, "patch_norm=False"),
        (lambda: swin.create_model("swinv2_t_w8", features_only=True, **SMALL), ValueError, "Swinv2Backbone"),
        (
            lambda: swin.create_model("swin_t", features_only=True, semantics="classification", **SMALL),
            ValueError,
            "detection rules",
        ),
        (lambda: swin.optimize(swin.create_model("swin_t", **SMALL), dtype=torch.float32), TypeError, ".model"),
    ],
)
def test_what_transformers_cannot_build_is_refused_before_writing(tmp_path, build, error, named):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = build()
    with pytest.raises(error) as raised:
        swin.save_for_transformers(model, tmp_path / "out")
    assert named in str(raised.value)
    assert not (tmp_path / "out").exists()


def test_a_swin_v2_with_an_absolute_position_embedding_is_refused(tmp_path):
    """transformers' Swin V2 makes its embedding one position longer than the patches and cannot run with it."""
    with pytest.raises(ValueError, match="Swin V2 with ape has no transformers model"):
        swin.save_for_transformers(swin.create_model("swinv2_t_w8", ape=True, **SMALL), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_backbone_of_a_size_that_is_no_window_multiple_reads_back(tmp_path):
    """Detection rules on both sides: the classifiers' size refusal is not theirs."""
    ours = _noisy(swin.create_model("swin_t", features_only=True, img_size=256, **SMALL))
    swin.save_for_transformers(ours, tmp_path)
    again = swin.create_model(f"local-dir:{tmp_path}", pretrained=True, features_only=True).eval()
    x = torch.randn(1, 3, 256, 256)
    with torch.no_grad():
        for a, b in zip(again(x), ours(x), strict=True):
            _close(a, b)


def test_dropout_is_saved_with_a_warning_that_transformers_places_it_otherwise(tmp_path):
    """transformers has no dropout between the MLP's layers and none at pos_drop_rate's place of its own: the
    rates are saved as its two fields (its model drops at them) and the difference, which only training sees, said."""
    ours = _noisy(swin.create_model("swin_t", num_classes=0, proj_drop_rate=0.1, attn_drop_rate=0.05, **SMALL))
    with pytest.warns(UserWarning, match=r"saved as hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.05"):
        swin.save_for_transformers(ours, tmp_path)
    theirs = _loaded(transformers.AutoModel, tmp_path)
    assert theirs.encoder.layers[0].blocks[0].dropout.p == 0.1
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        _close(theirs(x).pooler_output, ours(x))
