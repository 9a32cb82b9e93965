"""The evaluation transform of a model with a non-square input size is timm's (resize keeping the aspect ratio
to cover the (floor(H / crop_pct), floor(W / crop_pct)) box, then center crop): no black bars, whatever the
image's shape; and ``resize_size`` reports that box. Square sizes keep the shorter-side resize. Every
expectation comes from timm's own ``create_transform`` of the config timm resolves for the model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import swin
from swin.registry import lookup
from swin.weights.data_config import create_transform

timm = pytest.importorskip("timm")
from timm.data import create_transform as timm_transform  # noqa: E402
from timm.data import resolve_model_data_config  # noqa: E402

TINY = {"embed_dim": 16, "depths": (1, 1, 1, 1), "num_heads": (1, 2, 4, 8)}
SHAPES = [(400, 400), (300, 500), (500, 300), (61, 97), (130, 90)]  # (height, width) of the test images


@pytest.fixture
def arch(monkeypatch):
    """Register architectures for the test only (the registry is restored afterwards)."""
    swin.list_models()  # load the bundled entries before taking the copy
    monkeypatch.setattr(lookup, "_configs", dict(lookup._configs))

    def register(img_size) -> str:
        name = "shapes_{}x{}".format(*img_size)
        swin.register_model(name=name, img_size=img_size, **TINY)
        return name

    return register


def _image(height: int, width: int) -> Image.Image:
    rng = np.random.default_rng(height * 1000 + width)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def _same_as_timm(model) -> None:
    """Our transform of ``data_config(model)`` gives timm's for the config timm resolves, for every image shape."""
    ours = create_transform(swin.data_config(model))
    theirs = timm_transform(**resolve_model_data_config(model))
    for shape in SHAPES:
        image = _image(*shape)
        torch.testing.assert_close(ours(image), theirs(image), msg=lambda m, s=shape: f"image {s}: {m}")


def _timm_scale_size(model) -> int | tuple[int, int]:
    """The resize timm's evaluation transform applies first (one side, or its box as a tuple)."""
    size = timm_transform(**resolve_model_data_config(model)).transforms[0].size
    return size if isinstance(size, int) else tuple(size)


@pytest.mark.parametrize("img_size", [(96, 128), (128, 96)])
def test_non_square_input_matches_timm(arch, img_size):
    model = swin.create_model(arch(img_size))
    config = swin.data_config(model)
    assert config["input_size"] == (3, *img_size)
    assert config["resize_size"] == model.pretrained_cfg["resize_size"] == _timm_scale_size(model)
    _same_as_timm(model)


def test_a_square_picture_gets_no_black_bars(arch):
    model = swin.create_model(arch((96, 128)))
    config = swin.data_config(model)
    x = create_transform(config)(Image.new("RGB", (400, 400), (200, 200, 200)))
    pixels = x * torch.tensor(config["std"])[:, None, None] + torch.tensor(config["mean"])[:, None, None]
    assert pixels.shape == (3, 96, 128)
    assert pixels.min() > 0.7  # a uniform light picture stays light to the edges


@pytest.mark.parametrize("crop_pct", [1.0, 0.875, 0.95])
@pytest.mark.parametrize("crop_mode", ["center", "squash", "border"])
def test_non_square_crop_and_mode_set_by_the_user(arch, crop_pct, crop_mode):
    model = swin.create_model(arch((96, 128)))
    model.pretrained_cfg = {**model.pretrained_cfg, "crop_pct": crop_pct, "crop_mode": crop_mode}
    assert resolve_model_data_config(model)["crop_mode"] == crop_mode
    assert model.pretrained_cfg["resize_size"] == _timm_scale_size(model)
    _same_as_timm(model)


@pytest.mark.parametrize("crop_mode", ["center", "squash", "border"])
def test_square_input_keeps_the_shorter_side_resize(arch, crop_mode):
    model = swin.create_model(arch((64, 64)))
    model.pretrained_cfg = {**model.pretrained_cfg, "crop_mode": crop_mode}
    config = swin.data_config(model)
    assert config["resize_size"] == 71 and isinstance(config["resize_size"], int)  # floor(64 / 0.9)
    assert _timm_scale_size(model) in (71, (71, 71))
    _same_as_timm(model)


def test_input_size_set_by_the_user_on_a_square_model(arch):
    model = swin.create_model(arch((64, 64)))
    model.pretrained_cfg = {**model.pretrained_cfg, "input_size": (3, 96, 128)}
    assert model.pretrained_cfg["resize_size"] == _timm_scale_size(model)
    _same_as_timm(model)


def test_one_side_resize_for_a_non_square_input_is_refused(arch):
    model = swin.create_model(arch((96, 128)))
    config = {**swin.data_config(model), "resize_size": 106}
    with pytest.raises(ValueError, match=r"resize_size 106 is one side, but input_size 96x128 is not square"):
        create_transform(config)
    with pytest.raises(ValueError, match=r"\[106, 142\]"):  # what to give instead
        create_transform(config)
    # a [height, width] box read back from JSON (a list) is accepted
    listed = {**config, "resize_size": [106, 142], "input_size": [3, 96, 128]}
    image = _image(300, 500)
    torch.testing.assert_close(create_transform(listed)(image), create_transform(swin.data_config(model))(image))


def test_unknown_crop_mode_is_refused(arch):
    config = {**swin.data_config(swin.create_model(arch((64, 64)))), "crop_mode": "zoom"}
    with pytest.raises(ValueError, match="crop_mode 'zoom' is not one of 'center', 'squash', 'border'"):
        create_transform(config)


@pytest.mark.parametrize("crop_mode", ["center", "border"])
def test_a_one_channel_model_gets_grey_images_normalised_by_one_value(crop_mode):
    """A one-channel model (in_chans=1) reports ImageNet's three means and stds, as timm's does; its transform
    makes a grey image (PIL's luminance) normalised by their average (what timm's save_for_hf writes for it),
    where it applied three values to one plane and failed (and gave a colour image three planes). Expected:
    timm's transform of the grey image with those averages."""
    model = swin.create_model("swin_t", in_chans=1, **TINY)
    config = {**swin.weights.data_config(model), "crop_mode": crop_mode}
    reference = timm_transform(
        input_size=(1, 224, 224),
        interpolation=config["interpolation"],
        mean=(sum(config["mean"]) / 3,),
        std=(sum(config["std"]) / 3,),
        crop_pct=config["crop_pct"],
        crop_mode=crop_mode,
    )
    for height, width in SHAPES:
        image = Image.fromarray(np.random.default_rng(height).integers(0, 256, (height, width, 3), dtype=np.uint8))
        for given in (image, image.convert("L")):
            out = create_transform(config)(given)
            assert out.shape == (1, 224, 224)
            torch.testing.assert_close(out, reference(image.convert("L")))
