"""High-bit-depth images are rescaled to 8 bits by their nominal range, not clipped to white, in every command
that opens one (predict's read_image, validate's ImageFolder, show attention's prepare). The expected pixels
are computed here with numpy from the array the test wrote, never by the helper under test."""

from __future__ import annotations

import numpy as np
import pytest
import timm.data
import torch
from PIL import Image

import swin
from swin.registry import lookup
from swin.tools.images import UnsupportedImageError, check_resized_size, open_rgb, read_image, to_rgb
from swin.tools.show_attention import AttentionRequest, prepare
from swin.tools.validate_cmd import DatasetError, ImageFolder

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _random16(seed: int = 0, shape=(40, 48)) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 65536, shape, dtype=np.uint16)


def _rgb(gray: np.ndarray) -> np.ndarray:
    return np.repeat(gray[..., None], 3, axis=-1)


def _expected16(raw: np.ndarray) -> np.ndarray:
    """0..65535 -> 0..255 to the nearest level (v / 257; no ties exist)."""
    return _rgb(np.round(raw.astype(np.float64) / 257).astype(np.uint8))


@pytest.fixture
def png16(tmp_path):
    raw = _random16()
    path = tmp_path / "g16.png"
    Image.fromarray(raw).save(path)
    assert Image.open(path).mode == "I;16"  # what a 16-bit grayscale PNG decodes to
    return path, raw


def test_16_bit_png_is_rescaled_not_clipped(png16):
    path, raw = png16
    got = np.asarray(read_image(str(path)))
    assert got.dtype == np.uint8 and got.shape == (*raw.shape, 3)
    np.testing.assert_array_equal(got, _expected16(raw))
    assert abs(got.mean() - raw.mean() / 257) < 1  # ~127, not ~254


def test_16_bit_tiff_and_pgm(tmp_path):
    raw = _random16(1)
    tiff = tmp_path / "g16.tif"
    Image.fromarray(raw).save(tiff)
    np.testing.assert_array_equal(np.asarray(open_rgb(tiff)), _expected16(raw))

    pgm = tmp_path / "g16.pgm"  # written by hand: maxval 65535, big-endian samples; PIL decodes it to mode I
    pgm.write_bytes(b"P5 %d %d 65535\n" % (raw.shape[1], raw.shape[0]) + raw.astype(">u2").tobytes())
    assert Image.open(pgm).mode == "I"
    np.testing.assert_array_equal(np.asarray(open_rgb(pgm)), _expected16(raw))


def test_float_image_in_0_1(tmp_path):
    raw = np.random.default_rng(2).random((24, 20)).astype(np.float32)
    path = tmp_path / "f.tif"
    Image.fromarray(raw).save(path)
    assert Image.open(path).mode == "F"
    expected = _rgb(np.rint(raw.astype(np.float64) * 255).astype(np.uint8))
    np.testing.assert_array_equal(np.asarray(open_rgb(path)), expected)


@pytest.mark.parametrize("scale", [255.0, -1.0])
def test_float_image_outside_0_1_is_refused(tmp_path, scale):
    raw = np.random.default_rng(3).random((8, 8)).astype(np.float32) * np.float32(scale)
    path = tmp_path / "f.tif"
    Image.fromarray(raw).save(path)
    with pytest.raises(ValueError, match=r"f.tif: float pixels .* 0\.0 \(black\) to 1\.0 \(white\).*scale them"):
        read_image(str(path))
    raw[0, 0] = np.nan
    Image.fromarray(raw).save(path)
    with pytest.raises(ValueError, match=r"f.tif: float pixels .* NaN or infinite values; replace them"):
        read_image(str(path))


def test_32_bit_integer_without_a_known_depth_is_refused(tmp_path):
    raw = np.arange(64, dtype=np.int32).reshape(8, 8) * 1000
    path = tmp_path / "i32.tif"  # PIL writes mode I as signed 32-bit samples
    Image.fromarray(raw).save(path)
    with pytest.raises(ValueError, match=r"i32.tif: 32-bit integer pixels .* save it as an 8-bit or 16-bit PNG"):
        read_image(str(path))
    with pytest.raises(UnsupportedImageError, match="no range to map to 8 bits"):
        to_rgb(Image.fromarray(raw))  # an in-memory image: no file format, no depth


def test_8_bit_modes_unchanged(tmp_path):
    rng = np.random.default_rng(4)
    rgb = rng.integers(0, 256, (10, 12, 3), dtype=np.uint8)
    np.testing.assert_array_equal(np.asarray(to_rgb(Image.fromarray(rgb))), rgb)
    gray = rng.integers(0, 256, (10, 12), dtype=np.uint8)
    np.testing.assert_array_equal(np.asarray(to_rgb(Image.fromarray(gray))), _rgb(gray))


def test_validate_reads_16_bit_images_rescaled(png16, tmp_path):
    path, raw = png16
    folder = ImageFolder({"a": [path]}, {"a": 0}, transform=np.asarray)
    got, target = folder[0]
    assert target == 0
    np.testing.assert_array_equal(got, _expected16(raw))

    bad = tmp_path / "f.tif"
    Image.fromarray(np.full((8, 8), 3.0, np.float32)).save(bad)
    with pytest.raises(DatasetError, match=r"f.tif: float pixels .*and run again"):
        ImageFolder({"a": [bad]}, {"a": 0}, transform=np.asarray)[0]


@pytest.fixture
def tiny_arch(monkeypatch):
    """A tiny architecture registered for the test only (the registry is restored afterwards)."""
    swin.list_models()  # load the bundled entries before taking the copy
    monkeypatch.setattr(lookup, "_configs", dict(lookup._configs))
    swin.register_model(name="modes_tiny", img_size=32, embed_dim=16, depths=(1, 1, 1, 1), num_heads=(1, 2, 4, 8))
    return "modes_tiny"


def test_show_attention_preprocesses_16_bit_images_rescaled(png16, tiny_arch):
    path, raw = png16
    request = AttentionRequest(str(path), tiny_arch, None, None, True, 1, 1, None, (0, 0))
    prepared = prepare(request)
    # timm's evaluation transform (the fallback preprocessing of an architecture without weights) of the
    # 8-bit picture numpy made
    transform = timm.data.create_transform(
        input_size=(3, 32, 32), interpolation="bicubic", crop_pct=0.9, mean=MEAN, std=STD
    )
    expected = transform(Image.fromarray(_expected16(raw)))
    torch.testing.assert_close(prepared.image, expected.unsqueeze(0))


@pytest.fixture
def rotated_jpeg(tmp_path):
    """A 20x10 JPEG whose EXIF Orientation is 6 (shown turned 90 degrees clockwise), bright at its top left."""
    pixels = np.zeros((10, 20, 3), np.uint8)
    pixels[:4, :4] = 255
    image = Image.fromarray(pixels)
    exif = image.getexif()
    exif[0x0112] = 6
    path = tmp_path / "rotated.jpg"
    image.save(path, exif=exif, quality=100)
    return path


def test_predict_and_show_read_images_upright(rotated_jpeg):
    upright = np.asarray(read_image(str(rotated_jpeg)))
    assert upright.shape == (20, 10, 3)  # turned: 10 wide, 20 high
    assert upright[1, -2].min() > 200 and upright[1, 1].max() < 50  # the bright corner is now top right


def test_validate_reads_images_as_stored_as_timm_does(rotated_jpeg):
    got, _ = ImageFolder({"a": [rotated_jpeg]}, {"a": 0}, transform=np.asarray)[0]
    assert got.shape == (10, 20, 3) and got[1, 1].min() > 200


@pytest.mark.parametrize("mode", ["RGBA", "LA", "P"])
def test_transparent_pixels_read_as_white(tmp_path, mode):
    path = tmp_path / f"{mode}.png"
    if mode == "P":
        image = Image.new("P", (4, 3), 0)
        image.putpalette([0, 0, 0, 200, 10, 10])
        image.putpixel((1, 0), 1)
        image.save(path, transparency=0)  # palette index 0 (black) is transparent
    else:
        image = Image.new(mode, (4, 3), (0, 0) if mode == "LA" else (0, 0, 0, 0))
        image.putpixel((1, 0), (200, 255) if mode == "LA" else (200, 10, 10, 255))
        image.save(path)
    rgb = read_image(str(path))
    assert rgb.getpixel((0, 0)) == (255, 255, 255)
    assert rgb.getpixel((1, 0)) == ((200, 200, 200) if mode == "LA" else (200, 10, 10))  # opaque: unchanged


def test_an_elongated_image_is_refused_before_the_resize(tmp_path):
    path = tmp_path / "line.png"
    Image.new("RGB", (20000, 1)).save(path)
    config = {"input_size": (3, 224, 224), "resize_size": 248, "crop_pct": 0.9}
    with pytest.raises(ValueError, match=r"line.png: a 20000x1 image would be resized to 4960000x248 "):
        check_resized_size(read_image(str(path)), config, path)
    check_resized_size(Image.new("RGB", (4000, 1000)), config, path)  # 992x248: fine
    with pytest.raises(DatasetError, match=r"20000x1 image .*or remove it, and run again"):
        ImageFolder({"a": [path]}, {"a": 0}, lambda image: pytest.fail("transformed"), config)[0]
