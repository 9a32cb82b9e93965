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


def test_bad_image_paths_are_one_line_errors(files, capsys, tmp_path):
    folder = files[0]
    not_an_image = tmp_path / "notes.png"
    not_an_image.write_text("not pixels")
    weights = folder / "finetuned_10_classes.pth"
    for image, expected in [
        (tmp_path / "missing.png", "no such image file"),
        (tmp_path, "is a directory"),
        (not_an_image, "not an image"),
    ]:
        status, out, err = predict(capsys, image, "--model", "swin_t", "--weights", weights)
        assert status == 1 and expected in err and len(err.strip().splitlines()) == 1 and out == "", err


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
