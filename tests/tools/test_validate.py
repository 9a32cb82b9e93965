"""``swin validate`` on ImageFolders built by the test: images filed under the classes a fixed random model
predicts for them (preprocessed here with timm's own evaluation transform), a known subset deliberately misfiled,
so the expected top-1 / top-5 are known exactly before the command runs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import timm.data
import torch
from PIL import Image

import swin
from swin.registry import lookup
from swin.tools.cli import main
from tests.conftest import transformers_classifier_folder

ARCH = "validate_tiny"
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
# bfloat16 moves this model's logits by < 0.1 (measured); the kept images' deciding gaps are wider than this.
MIN_GAP = 0.3


@pytest.fixture
def tiny_arch(monkeypatch):
    """A tiny architecture registered for the test only (the registry is restored afterwards)."""
    swin.list_models()  # load the bundled entries before taking the copy
    monkeypatch.setattr(lookup, "_configs", dict(lookup._configs))
    swin.register_model(
        name=ARCH, embed_dim=16, depths=(1, 1, 1, 1), num_heads=(1, 2, 4, 8), img_size=64, drop_path_rate=0.0
    )
    return ARCH


def reference_model(tmp_path, num_classes: int):
    """A random model with a widened head (so classes are well separated), saved as a plain state dict."""
    torch.manual_seed(0)
    model = swin.create_model(ARCH, num_classes=num_classes).eval()
    with torch.no_grad():
        model.head.weight.mul_(30)
    path = tmp_path / "tiny.pth"
    torch.save(model.state_dict(), path)
    return model, path


def reference_logits(model, images: list[Image.Image]) -> torch.Tensor:
    # timm's evaluation transform for the fallback preprocessing (no manifest entry): resize the shorter side
    # to floor(64 / 0.9) = 71 (bicubic), center crop 64, ImageNet mean/std.
    transform = timm.data.create_transform(
        input_size=(3, 64, 64), interpolation="bicubic", crop_pct=0.9, mean=MEAN, std=STD
    )
    with torch.no_grad():
        return model(torch.stack([transform(image) for image in images]))


def random_images(count: int, seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    images = []
    for _ in range(count):
        height, width = rng.integers(64, 100, size=2)  # not square, larger than the crop: resize and crop act
        images.append(Image.fromarray(rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)))
    return images


def well_separated(logits: torch.Tensor) -> torch.Tensor:
    """Images whose top-1 and top-5 are decided by gaps of at least MIN_GAP."""
    ranked = logits.sort(dim=1, descending=True).values
    return (ranked[:, 0] - ranked[:, 1] >= MIN_GAP) & (ranked[:, 4] - ranked[:, 5] >= MIN_GAP)


def write_folder(root, images, labels, names) -> None:
    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        folder = root / names(label)
        folder.mkdir(parents=True, exist_ok=True)
        image.save(folder / f"img{i:03d}.png")  # lossless: the command reads the very pixels used here


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(["validate", *map(str, argv), "--workers", "0"])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def ten_class_set(tiny_arch, tmp_path):
    """24 images in folders named by class index: 16 filed under the model's top-1 class, 4 under its third
    choice (a top-5 hit, a top-1 miss) and 4 under its last (a miss of both)."""
    model, checkpoint = reference_model(tmp_path, num_classes=10)
    candidates = random_images(80)
    logits = reference_logits(model, candidates)
    keep = well_separated(logits).nonzero().flatten()[:24].tolist()
    assert len(keep) == 24, "not enough well separated images"
    order = logits[keep].argsort(dim=1, descending=True)
    labels = [int(order[i, 0]) for i in range(16)] + [int(order[i, 2]) for i in range(16, 20)]
    labels += [int(order[i, -1]) for i in range(20, 24)]
    root = tmp_path / "val"
    write_folder(root, [candidates[i] for i in keep], labels, str)
    assert len({int(order[i, 0]) for i in range(16)}) > 2  # several classes, not one folder
    return root, checkpoint


def test_reports_the_constructed_top1_and_top5(ten_class_set, capsys):
    root, checkpoint = ten_class_set
    code, out, err = run(capsys, ARCH, "--data", root, "--checkpoint", checkpoint, "--format", "json")
    assert code == 0, err
    result = json.loads(out)
    assert result["num_images"] == 24 and result["num_classes"] == 10
    assert result["correct_top1"] == 16 and result["correct_top5"] == 20
    assert result["top1"] == pytest.approx(100 * 16 / 24) and result["top5"] == pytest.approx(100 * 20 / 24)
    assert result["dtype"] == "float32"
    prep = result["preprocessing"]
    assert (prep["resize_size"], prep["input_size"], prep["interpolation"]) == (71, [3, 64, 64], "bicubic")


def test_batching_bf16_progress_and_table(ten_class_set, capsys):
    root, checkpoint = ten_class_set
    argv = [ARCH, "--data", root, "--checkpoint", checkpoint, "--batch-size", "5", "--bf16", "--progress"]
    code, out, err = run(capsys, *argv, "--format", "json")
    assert code == 0, err
    result = json.loads(out)
    assert result["dtype"] == "bfloat16" and result["batch_size"] == 5
    assert (result["correct_top1"], result["correct_top5"]) == (16, 20)
    assert "24/24 images" in err
    code, out, err = run(capsys, *argv[:-2], "--no-progress")
    assert code == 0 and err == ""
    assert "top-1         66.667%  (16/24)" in out and "top-5         83.333%  (20/24)" in out


@pytest.mark.parametrize("fastest", [torch.float32, torch.bfloat16])
def test_optimize_counts_the_same(ten_class_set, capsys, monkeypatch, fastest):
    """--optimize runs swin.optimize's model in the machine's fastest dtype (float32 on a CPU without bf16
    hardware, bfloat16 weights on one with it: both asked here on any machine): same hits, as the kept images'
    deciding gaps are wider than bf16's error (test_batching_bf16_progress_and_table). Uncompiled here (a compile
    takes most of a minute on two cores; tests/test_optimize.py checks compiled outputs)."""
    from swin import optimized

    real = optimized.optimize
    calls = []
    monkeypatch.setattr(optimized, "optimize", lambda model, dtype: calls.append(dtype) or real(model, dtype, False))
    monkeypatch.setattr(optimized, "fastest_dtype", lambda device, features=None: fastest)
    root, checkpoint = ten_class_set
    code, out, err = run(capsys, ARCH, "--data", root, "--weights", checkpoint, "--optimize", "--format", "json")
    assert code == 0, err
    result = json.loads(out)
    assert calls == ["auto"] and result["optimized"]
    assert result["dtype"] == str(fastest).removeprefix("torch.")
    assert (result["correct_top1"], result["correct_top5"]) == (16, 20)


def test_wordnet_folders_map_through_imagenet_1k(tiny_arch, tmp_path, capsys):
    model, checkpoint = reference_model(tmp_path, num_classes=1000)
    images = random_images(10, seed=1)
    predicted = reference_logits(model, images).argmax(dim=1).tolist()
    # ImageNet-1k's class index is the position of its WordNet id in sorted order.
    wordnet_ids = sorted(timm.data.ImageNetInfo("imagenet-1k").label_names())
    write_folder(tmp_path / "val", images, predicted, lambda label: wordnet_ids[label])
    code, out, err = run(capsys, ARCH, "--data", tmp_path / "val", "--checkpoint", checkpoint, "--format", "json")
    assert code == 0, err
    result = json.loads(out)
    assert result["num_classes"] == 1000 and result["num_images"] == 10
    assert result["correct_top1"] == 10 and result["top1"] == 100.0


def test_fails_clearly_without_images(tiny_arch, tmp_path, capsys):
    _, checkpoint = reference_model(tmp_path, num_classes=10)
    (tmp_path / "val" / "0").mkdir(parents=True)
    (tmp_path / "val" / "0" / "notes.txt").write_text("not an image")
    code, out, err = run(capsys, ARCH, "--data", tmp_path / "val", "--checkpoint", checkpoint)
    assert code == 2 and out == ""
    assert "no images in class folders" in err and str(tmp_path / "val") in err
    Image.new("RGB", (8, 8)).save(tmp_path / "val" / "loose.png")
    code, _, err = run(capsys, ARCH, "--data", tmp_path / "val", "--checkpoint", checkpoint)
    assert code == 2 and "directly in it need to be in one folder per class" in err
    code, _, err = run(capsys, ARCH, "--data", tmp_path / "missing", "--checkpoint", checkpoint)
    assert code == 2 and "no such directory" in err


def test_fails_clearly_on_classes_the_head_cannot_map(tiny_arch, tmp_path, capsys):
    _, checkpoint = reference_model(tmp_path, num_classes=10)
    write_folder(tmp_path / "val", random_images(5), ["3", "cat", "dog", "12", "n01440764"], str)
    code, out, err = run(capsys, ARCH, "--data", tmp_path / "val", "--checkpoint", checkpoint)
    assert code == 2 and out == ""
    assert "4 class folder(s) map to no class of the 10-class head: 12, cat, dog, n01440764" in err
    assert "integer class indices 0..9" in err and "WordNet ids need a head of 1000" in err


def test_fails_clearly_on_unknown_tag_and_missing_weights(tmp_path, capsys, monkeypatch):
    write_folder(tmp_path / "val", random_images(1), [0], str)
    code, _, err = run(capsys, "swin_t.no_such_tag", "--data", tmp_path / "val")
    assert code == 2 and "no pretrained tag 'no_such_tag' for swin_t" in err
    code, _, err = run(capsys, "swin_t", "--data", tmp_path / "val", "--checkpoint", tmp_path / "nope.pth")
    assert code == 2 and f"--weights {tmp_path / 'nope.pth'}: no such file" in err
    monkeypatch.setenv("SWIN_HOME", str(tmp_path / ("a_long_cache_folder_name_" * 4)))
    monkeypatch.setenv("SWIN_OFFLINE", "1")
    code, _, err = run(capsys, "swin_t", "--data", tmp_path / "val")
    assert code == 2 and "offline" in err
    assert err.count("\n") == 1 and "place it (any supported layout) at:" in err  # one line, as every command's
    assert err.endswith("swin_tiny_patch4_window7_224.pth\n")  # whole: the last place to put a copy included


def test_a_torchvision_file_is_scored_with_torchvision_preprocessing(tmp_path, capsys):
    """A torchvision checkpoint given with --weights is evaluated as torchvision publishes it (its weights' own
    transforms: resize 232, bicubic, crop 224 for swin_t), as swin predict does; a file with NaN weights is
    refused with the tensor's name."""
    import torchvision

    torch.manual_seed(0)
    torch.save(torchvision.models.swin_t().state_dict(), tmp_path / "tv.pth")
    write_folder(tmp_path / "val", random_images(1), [0], str)
    code, out, err = run(
        capsys, "swin_t", "--data", tmp_path / "val", "--weights", tmp_path / "tv.pth", "--format", "json"
    )
    assert code == 0, err
    published = torchvision.models.Swin_T_Weights.IMAGENET1K_V1.transforms()
    prep = json.loads(out)["preprocessing"]
    assert prep["resize_size"] == published.resize_size[0] and prep["input_size"][1:] == published.crop_size * 2
    assert prep["interpolation"] == published.interpolation.value

    state = torch.load(tmp_path / "tv.pth")
    state["features.1.0.mlp.0.weight"][0, 0] = float("nan")
    torch.save(state, tmp_path / "nan.pth")
    code, _, err = run(capsys, "swin_t", "--data", tmp_path / "val", "--weights", tmp_path / "nan.pth")
    assert code == 2 and "non-finite weights" in err and "layers.0.blocks.0.mlp.fc1.weight" in err


def test_a_22k_checkpoint_maps_wordnet_folders_through_imagenet_22k(tmp_path, capsys):
    """A swin_t checkpoint with a 21841-class head, given without a tag: the preprocessing is the published
    one for the layout, the class names those of its head (ImageNet-22k, as timm names them), not the
    default tag's 1000."""
    from timm.data import ImageNetInfo

    torch.manual_seed(0)
    state = swin.create_model("swin_t", num_classes=21841).state_dict()
    torch.save(state, tmp_path / "in22k.pth")
    wordnet = ImageNetInfo("imagenet-22k").index_to_label_name(0)
    write_folder(tmp_path / "val", random_images(1), [wordnet], str)
    code, out, err = run(capsys, "swin_t", "--data", tmp_path / "val", "--weights", tmp_path / "in22k.pth")
    assert code == 0, err
    assert "1 images, 1 class folders" in out


def test_refuses_a_checkpoint_of_another_window(tiny_arch, tmp_path, capsys):
    """validate_tiny has windows 7, 7, 4, 2 at its 64x64 input (shrunk to the maps); a checkpoint trained with
    window 4 has 7x7 bias tables at stage 1: refused, not interpolated into another model."""
    torch.manual_seed(0)
    torch.save(swin.create_model(ARCH, num_classes=10, window_size=4).state_dict(), tmp_path / "w4.pth")
    write_folder(tmp_path / "val", random_images(1), [0], str)
    code, out, err = run(capsys, ARCH, "--data", tmp_path / "val", "--weights", tmp_path / "w4.pth")
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert "w4.pth has window 4 (7x7 bias table) at stage 1 but validate_tiny has window 7" in err
    assert "the checkpoint's windows (4, 4, 4, 2;" in err and "--models-file" in err


def test_a_1k_checkpoint_under_a_22k_tag_maps_wordnet_folders_through_imagenet_1k(tmp_path, capsys):
    """The tag's label set (ImageNet-22k) does not fit a 1000-class head: the head's own (ImageNet-1k) is used."""
    torch.manual_seed(0)
    torch.save(swin.create_model("swin_t", num_classes=1000).state_dict(), tmp_path / "in1k.pth")
    wordnet = sorted(timm.data.ImageNetInfo("imagenet-1k").label_names())
    write_folder(tmp_path / "val", random_images(2), [wordnet[0], wordnet[999]], str)
    argv = ["swin_t.ms_in22k", "--data", tmp_path / "val", "--weights", tmp_path / "in1k.pth", "--format", "json"]
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    result = json.loads(out)
    assert result["num_classes"] == 1000 and result["num_class_folders"] == 2


def test_class_indices_keep_the_first_label_set_that_fits():
    from swin.tools.validate_cmd import class_indices

    first = sorted(timm.data.ImageNetInfo("imagenet-1k").label_names())[5]
    assert class_indices([first, "7"], 1000, "imagenet-22k") == {first: 5, "7": 7}
    assert class_indices([first], 1000, "no-such-label-set") == {first: 5}


@pytest.mark.parametrize(
    "option, value, expected",
    [
        ("--batch-size", "0", "at least 1, got '0'"),
        ("--batch-size", "-3", "at least 1, got '-3'"),
        ("--batch-size", "two", "at least 1, got 'two'"),
        ("--workers", "-1", "at least 0, got '-1'"),
        ("--workers", "1.5", "at least 0, got '1.5'"),
    ],
)
def test_bad_batch_size_and_workers_are_refused_by_the_parser(tmp_path, capsys, option, value, expected):
    with pytest.raises(SystemExit) as exit_info:
        main(["validate", "swin_t", "--data", str(tmp_path), option, value])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and f"argument {option}: takes a whole number of {expected}" in err


@pytest.mark.parametrize("device", ["meta", "mps", "xpu"])
def test_devices_it_does_not_run_on_are_refused_before_anything_loads(tmp_path, capsys, monkeypatch, device):
    """Only the CUDA checks ran before: other device types failed in torch once the data had loaded."""
    monkeypatch.setenv("SWIN_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("SWIN_OFFLINE", "1")
    write_folder(tmp_path / "val", random_images(1), [0], str)
    code, out, err = run(capsys, "swin_t", "--data", tmp_path / "val", "--device", device)
    assert code == 2 and out == ""
    assert f"--device {device}: swin validate runs on cpu or cuda" in err


def test_a_class_folder_without_images_is_named_not_dropped_silently(ten_class_set, capsys):
    """torchvision's ImageFolder refuses an empty class folder; here classes are mapped by folder name, so it
    changes no index and is left out, and the report says so (it said nothing: 10 folders counted as 9)."""
    root, checkpoint = ten_class_set
    (root / "7_empty").mkdir()
    code, out, err = run(capsys, ARCH, "--data", root, "--checkpoint", checkpoint, "--format", "json")
    assert code == 0, err
    assert json.loads(out)["empty_class_folders"] == ["7_empty"] and json.loads(out)["correct_top1"] == 16
    code, out, err = run(capsys, ARCH, "--data", root, "--checkpoint", checkpoint)
    assert "left out      1 folder(s) without an image: 7_empty" in out


def test_images_under_linked_folders_are_found_as_imagefolder_finds_them(tmp_path):
    """torchvision's ImageFolder walks linked folders inside a class folder (os.walk(followlinks=True)); they
    were skipped silently. A link back up the tree is walked once, not looped."""
    from torchvision.datasets import ImageFolder

    from swin.tools.validate_cmd import find_images

    root, elsewhere = tmp_path / "val", tmp_path / "elsewhere"
    (root / "n01").mkdir(parents=True)
    elsewhere.mkdir()
    Image.new("RGB", (8, 8)).save(root / "n01" / "a.png")
    Image.new("RGB", (8, 8)).save(elsewhere / "b.png")
    try:
        (root / "n01" / "linked").symlink_to(elsewhere, target_is_directory=True)
        (elsewhere / "up").symlink_to(elsewhere, target_is_directory=True)  # a loop
    except (OSError, NotImplementedError):
        pytest.skip("no symbolic links here")
    theirs = sorted(path for path, _ in ImageFolder(str(root)).samples if "/up/" not in path)
    assert sorted(str(p) for p in find_images(root)["n01"]) == theirs
    assert len(theirs) == 2


def test_a_transformers_folder_is_scored_with_its_classes_and_processor(tmp_path, capsys):
    """``swin validate local-dir:FOLDER`` (or hf-hub:) of a transformers repository: its weights, its class names
    as folder names, its processor. Expected: transformers' own model and PIL processor over the same images."""
    transformers = pytest.importorskip("transformers")
    names = ["cat", "dog", "cow"]
    model = transformers_classifier_folder(tmp_path / "model", names)
    images = random_images(12)
    labels = [i % 3 for i in range(12)]
    write_folder(tmp_path / "data", images, labels, names.__getitem__)
    pil = transformers.AutoImageProcessor.from_pretrained(str(tmp_path / "model"), backend="pil")
    with torch.no_grad():
        logits = model(pil(images, return_tensors="pt")["pixel_values"]).logits
    expected = int((logits.argmax(-1) == torch.tensor(labels)).sum())

    code, out, err = run(capsys, f"local-dir:{tmp_path / 'model'}", "--data", tmp_path / "data", "--format", "json")
    assert code == 0, err
    result = json.loads(out)
    assert (result["model"], result["num_images"], result["correct_top1"]) == (
        f"local-dir:{tmp_path / 'model'}",
        12,
        expected,
    )
    assert result["preprocessing"]["crop_mode"] == "squash"
    code, _, err = run(capsys, f"local-dir:{tmp_path / 'model'}", "--data", tmp_path / "data", "--weights", "x.pth")
    assert code and "names its own weights" in err


def test_the_models_own_class_names_come_before_imagenets_order():
    """A 1000-class hub head whose label_names are WordNet ids in its own order: a folder is its index in that
    order (ImageNet-1k's sorted order was taken first, silently scoring against other classes)."""
    from swin.tools.validate_cmd import class_indices

    own = sorted(timm.data.ImageNetInfo("imagenet-1k").label_names())[::-1]
    assert class_indices([own[0], own[999]], 1000, None, names=own) == {own[0]: 0, own[999]: 999}


@pytest.mark.parametrize(
    "error",
    [SyntaxError("broken PNG file (bad header checksum in IDAT)"), ValueError("tile cannot extend outside image")],
)
def test_a_damaged_image_pil_refuses_is_named(tmp_path, monkeypatch, error):
    """PIL's decoders refuse some damaged files with SyntaxError or ValueError, not OSError: the error names the
    file (it reached the command as a bare "SyntaxError: broken PNG file"); the same in predict's read_image."""
    from swin.tools import images
    from swin.tools.validate_cmd import DatasetError, ImageFolder

    path = tmp_path / "0" / "damaged.png"
    path.parent.mkdir()
    Image.new("RGB", (8, 8)).save(path)

    def damaged(*args, **kwargs):
        raise error

    monkeypatch.setattr(images, "open_rgb", damaged)
    with pytest.raises(DatasetError, match="damaged.png: not a readable image"):
        ImageFolder({"0": [path]}, {"0": 0}, transform=lambda image: image)[0]
    with pytest.raises(ValueError, match="damaged.png is not an image PIL can read"):
        images.read_image(str(path))
