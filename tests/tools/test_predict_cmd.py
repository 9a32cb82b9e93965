"""``swin predict`` with local checkpoints: the head size comes from the checkpoint, the class names fit that
head, the header names the weights actually used, and the preprocessing is that of the checkpoint's publisher
(torchvision's transforms for a torchvision file, timm's / Microsoft's crop 0.9 bicubic otherwise)."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from swin.tools.cli import main
from swin.weights.user_weights import class_labels
from tests.conftest import transformers_classifier_folder

CLASSES = 10


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A 10-class swin_t in timm's and in torchvision's layout (random weights), and a test image."""
    import timm
    import torchvision

    folder = tmp_path_factory.mktemp("predict")
    torch.manual_seed(0)
    timm_model = timm.create_model("swin_tiny_patch4_window7_224", num_classes=CLASSES).eval()
    torch.save(timm_model.state_dict(), folder / "finetuned_10_classes.pth")
    tv_model = torchvision.models.swin_t(num_classes=CLASSES).eval()
    torch.save(tv_model.state_dict(), folder / "torchvision_10_classes.pth")
    pixels = torch.randint(0, 256, (260, 300, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(5))
    Image.fromarray(pixels.numpy()).save(folder / "image.png")
    return folder, timm_model, tv_model


def predict(capsys, *argv) -> tuple[int, str, str]:
    status = main(["predict", *map(str, argv)])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return status, captured.out, captured.err


def expected_top(model, transform, image_path, k=3):
    with torch.no_grad(), Image.open(image_path) as image:
        return model(transform(image.convert("RGB")).unsqueeze(0)).softmax(-1)[0].topk(k)


def check(top, expected):
    assert [row["index"] for row in top] == expected.indices.tolist()
    assert [row["label"] for row in top] == [f"class {i}" for i in expected.indices.tolist()]
    torch.testing.assert_close(torch.tensor([r["probability"] for r in top]), expected.values, atol=1e-5, rtol=0)


def test_finetuned_head_from_a_timm_file(files, capsys):
    from timm.data import create_transform, resolve_data_config

    folder, timm_model, _ = files
    weights = folder / "finetuned_10_classes.pth"
    argv = [folder / "image.png", "--model", "swin_t", "--weights", weights, "--top", "3"]
    status, out, _ = predict(capsys, *argv, "--format", "json")
    assert status == 0
    result = json.loads(out)
    assert result["num_classes"] == CLASSES and result["weights"] == str(weights) and result["layout"] == "timm"
    assert result["preprocessing"]["crop_pct"] == 0.9 and result["preprocessing"]["interpolation"] == "bicubic"
    check(
        result["top"],
        expected_top(timm_model, create_transform(**resolve_data_config(model=timm_model)), folder / "image.png"),
    )

    status, out, _ = predict(capsys, *argv)
    assert status == 0
    header = out.splitlines()[0]
    assert str(weights) in header and "ms_in1k" not in header and f"{CLASSES} classes" in header


def test_torchvision_file_gets_torchvision_preprocessing(files, capsys):
    from torchvision.models import Swin_T_Weights

    folder, _, tv_model = files
    weights = folder / "torchvision_10_classes.pth"
    argv = [folder / "image.png", "--model", "swin_t", "--weights", weights, "--top", "3", "--format", "json"]
    status, out, _ = predict(capsys, *argv)
    assert status == 0
    result = json.loads(out)
    assert result["layout"] == "torchvision" and result["preprocessing"]["resize_size"] == 232
    transform = Swin_T_Weights.IMAGENET1K_V1.transforms()  # resize 232 bicubic, crop 224: no download
    check(result["top"], expected_top(tv_model, transform, folder / "image.png"))


def test_bad_weights_are_one_line_errors(files, capsys, tmp_path):
    folder, timm_model, _ = files
    image = folder / "image.png"
    backbone = {k: v for k, v in timm_model.state_dict().items() if not k.startswith("head.")}
    torch.save(backbone, tmp_path / "backbone.pth")
    for weights, expected in [
        (tmp_path / "backbone.pth", "no classifier head"),
        (tmp_path, "is a directory"),
        (tmp_path / "nothing.pth", "no such file"),
    ]:
        status, _, err = predict(capsys, image, "--model", "swin_t", "--weights", weights)
        assert status == 1 and expected in err and len(err.strip().splitlines()) == 1, err


def test_class_labels_fit_the_head():
    from timm.data import ImageNetInfo

    assert class_labels(1000)[:2] == [ImageNetInfo("imagenet-1k").index_to_description(i) for i in range(2)]
    assert len(class_labels(21841)) == 21841
    assert class_labels(21841)[5] == ImageNetInfo("imagenet-22k").index_to_description(5)
    assert class_labels(3) == ["class 0", "class 1", "class 2"]
    assert class_labels(3, preferred="imagenet-1k") == ["class 0", "class 1", "class 2"]


TINY_W14 = """
predict_tiny_w14:
  embed_dim: 32
  depths: [1, 1, 1, 1]
  num_heads: [1, 2, 4, 8]
  window_size: 14
  img_size: 224
"""


@pytest.fixture
def tiny_checkpoints(tmp_path, monkeypatch):
    """A tiny swin_t-like architecture (window 7) registered for the test only; checkpoints of it trained with
    its own window and with window 14 (27x27 bias tables at stages 1-3), and a YAML registering the latter."""
    import swin
    from swin.registry import lookup

    swin.list_models()  # load the bundled entries before taking the copy
    monkeypatch.setattr(lookup, "_configs", dict(lookup._configs))
    monkeypatch.setattr(lookup, "_aliases", dict(lookup._aliases))
    tiny = {"embed_dim": 32, "depths": (1, 1, 1, 1), "num_heads": (1, 2, 4, 8), "num_classes": CLASSES}
    swin.register_model(name="predict_tiny", **tiny)
    torch.manual_seed(0)
    torch.save(swin.create_model("predict_tiny", **tiny).state_dict(), tmp_path / "w7.pth")
    torch.save(swin.create_model("predict_tiny", window_size=14, **tiny).state_dict(), tmp_path / "w14.pth")
    (tmp_path / "w14.yaml").write_text(TINY_W14)
    Image.new("RGB", (64, 48), (10, 200, 30)).save(tmp_path / "image.png")
    return tmp_path


def test_a_checkpoint_of_another_window_is_refused(tiny_checkpoints, capsys):
    folder = tiny_checkpoints
    image = folder / "image.png"
    status, out, err = predict(capsys, image, "--model", "predict_tiny", "--weights", folder / "w14.pth")
    assert status == 1 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "has window 14 (27x27 bias table) at stage 1 but predict_tiny has window 7" in err
    assert "the checkpoint's windows (14, 14, 14, 7;" in err and "--models-file" in err

    status, out, err = predict(capsys, image, "--model", "predict_tiny", "--weights", folder / "w7.pth")
    assert status == 0 and f"{CLASSES} classes" in out, err

    # what the message says to do: an architecture registered with the checkpoint's window runs it
    status = main(
        ["--models-file", str(folder / "w14.yaml"), "predict", str(image), "--model", "predict_tiny_w14"]
        + ["--weights", str(folder / "w14.pth")]
    )
    assert status == 0, capsys.readouterr().err


def test_a_checkpoint_of_a_registered_architecture_is_pointed_to_it():
    """A swin_b_384 checkpoint given as swin_b: the message names swin_b_384, whose windows (12 in every stage
    at 384) fit; one registered "like swin_b with window_size 12" at 224 would not (stage 4 is 7 there)."""
    from swin.tools.predict_cmd import check_window

    tables = {
        f"layers.{stage}.blocks.0.attn.relative_position_bias_table": torch.zeros(23 * 23, heads)
        for stage, heads in enumerate((4, 8, 16, 32))
    }
    with pytest.raises(
        ValueError, match="has window 12 .* but swin_b has window 7 there: run it with --model swin_b_384"
    ):
        check_window("swin_b", tables, "b384.pth")
    check_window("swin_b_384", tables, "b384.pth")  # fits


def test_an_elongated_image_is_refused_before_the_resize(tiny_checkpoints, capsys, monkeypatch):
    import importlib

    data_config = importlib.import_module("swin.weights.data_config")  # the module, not the function
    folder = tiny_checkpoints
    Image.new("RGB", (20000, 1)).save(folder / "line.png")
    monkeypatch.setattr(data_config, "create_transform", lambda config: pytest.fail("transformed"))
    status, out, err = predict(capsys, folder / "line.png", "--model", "predict_tiny", "--weights", folder / "w7.pth")
    assert status == 1 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "20000x1 image would be resized to 4960000x248" in err and "crop it nearer to square" in err


def test_weights_of_another_architecture_are_named_by_their_file(tmp_path, capsys):
    """The refusal names the --weights file (it said 'the state dict given as pretrained=', the Python API's
    words)."""
    import swin

    torch.save(
        swin.create_model("swin_t", embed_dim=32, depths=(1, 1, 1, 1), num_heads=(1, 2, 4, 8)).state_dict(),
        tmp_path / "small.pth",
    )
    Image.new("RGB", (64, 48)).save(tmp_path / "image.png")
    status, out, err = predict(capsys, tmp_path / "image.png", "--model", "swin_t", "--weights", tmp_path / "small.pth")
    assert status == 1 and f"{tmp_path / 'small.pth'} does not fit the model (swin_t)" in err, err


def test_top_below_one_is_a_usage_error(capsys):
    """Refused by the parser, exit 2, before anything loads (it was exit 1 after building the model)."""
    with pytest.raises(SystemExit) as caught:
        main(["predict", "image.png", "--model", "swin_t", "--top", "0"])
    assert caught.value.code == 2 and "--top: takes a whole number of at least 1, got '0'" in capsys.readouterr().err


def test_a_missing_image_is_named_before_any_weights_are_fetched(tmp_path, capsys, monkeypatch):
    """A typo in the image path waited for the weights' download first (or, offline, reported the missing
    weights instead)."""
    monkeypatch.setenv("SWIN_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("SWIN_OFFLINE", "1")
    code = main(["predict", str(tmp_path / "nope.png"), "--model", "swin_t.ms_in1k"])
    err = capsys.readouterr().err
    assert (
        code == 1
        and err == f"swin predict: {tmp_path / 'nope.png'}: no such image file; pass the path of a PNG or JPEG image\n"
    )


def test_a_folder_given_as_the_image_is_named_before_any_weights_are_fetched(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SWIN_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("SWIN_OFFLINE", "1")
    code = main(["predict", str(tmp_path), "--model", "swin_t.ms_in1k"])
    err = capsys.readouterr().err
    assert code == 1 and "swin validate scores a folder" in err and "offline" not in err


def test_a_transformers_folder_classifies_as_transformers_pipeline_does(tmp_path, capsys):
    """--model local-dir: (and hf-hub:) with the folder's own weights, classes and preprocessing; the judge is
    transformers' image-classification pipeline on the same folder and image."""
    import numpy as np

    transformers = pytest.importorskip("transformers")
    transformers_classifier_folder(tmp_path / "model", ["cat", "dog", "cow"])
    image = tmp_path / "image.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (300, 400, 3), dtype=np.uint8)).save(image)

    status, out, _ = predict(capsys, str(image), "--model", f"local-dir:{tmp_path / 'model'}", "--format", "json")
    assert status == 0
    result = json.loads(out)
    assert result["preprocessing"]["crop_mode"] == "squash" and result["layout"] == "transformers"
    assert result["file"] == str(tmp_path / "model" / "model.safetensors")
    ours = {row["label"]: row["probability"] for row in result["top"]}
    folder = str(tmp_path / "model")
    pil = transformers.AutoImageProcessor.from_pretrained(folder, backend="pil")  # resizes as PIL does, as ours
    pipeline = transformers.pipeline("image-classification", model=folder, image_processor=pil)
    theirs = {row["label"]: row["score"] for row in pipeline(str(image))}
    assert ours.keys() == theirs.keys() == {"cat", "dog", "cow"}
    assert all(abs(ours[label] - theirs[label]) < 1e-4 for label in ours)

    status, _, err = predict(capsys, str(image), "--model", f"local-dir:{tmp_path / 'model'}", "--weights", "x.pth")
    assert status and "names its own weights: leave --weights out" in err
    status, _, err = predict(capsys, str(tmp_path / "missing.png"), "--model", f"local-dir:{tmp_path / 'nowhere'}")
    assert status and "missing.png" in err  # the image is named before the folder is read


def test_a_repository_name_that_cannot_classify_says_what_the_commands_take(tmp_path, capsys):
    """The description's errors in the commands' words: options, not the Python API's arguments."""
    import swin

    dims = {"embed_dim": 32, "depths": (2, 2, 2, 2), "num_heads": (1, 2, 4, 8)}
    image = tmp_path / "image.png"
    Image.new("RGB", (64, 64)).save(image)
    swin.save_for_transformers(swin.create_model("swin_t", features_only=True, **dims), tmp_path / "backbone")
    status, _, err = predict(capsys, image, "--model", f"local-dir:{tmp_path / 'backbone'}")
    assert status and "it cannot classify; swin export NAME OUT --features-only exports it" in err
    swin.save_for_transformers(swin.create_model("swin_t", **dims), tmp_path / "classifier")
    (tmp_path / "classifier" / "model.safetensors").unlink()
    status, _, err = predict(capsys, image, "--model", f"local-dir:{tmp_path / 'classifier'}")
    assert status and "swin export NAME OUT --random-weights exports the described model" in err
    status, _, err = predict(capsys, image, "--model", f"local-dir:{tmp_path}")  # a folder, no config.json
    assert status and "a checkpoint file goes with its architecture's name (swin_t, ...) and --weights FILE" in err


def test_class_names_that_do_not_fit_the_head_are_refused(tmp_path, capsys):
    """A timm folder whose config.json lists fewer class names than its head has: an IndexError before; more
    names: labels silently off by the gap. Either is refused naming label_names."""
    import swin

    torch.manual_seed(0)
    model = swin.create_model("swin_t", num_classes=3, depths=(1, 1, 1, 1))
    model.pretrained_cfg = {**model.pretrained_cfg, "label_names": ["cat", "dog", "eel"]}
    swin.save_for_hf(model, tmp_path / "model")
    image = tmp_path / "image.png"
    Image.new("RGB", (64, 64), (20, 90, 200)).save(image)
    status, out, _ = predict(capsys, str(image), "--model", f"local-dir:{tmp_path / 'model'}", "--format", "json")
    assert status == 0 and {row["label"] for row in json.loads(out)["top"]} == {"cat", "dog", "eel"}
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    for names in (["cat", "dog"], ["cat", "dog", "eel", "owl"]):
        (tmp_path / "model" / "config.json").write_text(json.dumps({**config, "label_names": names}))
        status, _, err = predict(capsys, str(image), "--model", f"local-dir:{tmp_path / 'model'}")
        assert status == 1 and f"lists {len(names)} class names (label_names) for a 3-class head" in err
