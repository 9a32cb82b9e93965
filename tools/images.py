"""Reading the images a command is given as 8-bit RGB, with one-line errors that say what to do instead.

PIL's ``convert("RGB")`` clips high-bit-depth pixels to 255 instead of rescaling them (a 16-bit grayscale PNG
comes out nearly white, a float image in 0..1 black), so every command opens images through :func:`open_rgb`:

* ``I;16`` (16-bit unsigned grayscale, e.g. a 16-bit PNG or TIFF): 0..65535 -> 0..255, i.e. ``round(v / 257)``;
* ``I`` (PIL's 32-bit integer mode, which several formats decode into): scaled by the nominal range of the
  file's own depth, ``0..2**bits - 1`` -> 0..255, where that depth is known: 16 bits for PNG and PGM/PPM (PIL
  rescales a PGM's maxval to 65535), the ``BitsPerSample`` of an unsigned-integer TIFF. Signed samples, an
  unknown depth or a value outside the nominal range are refused (no range to map them by);
* ``F`` (32-bit float): the float-image convention 0.0..1.0 -> 0..255; a value outside 0..1 (or NaN) is refused,
  since such a file has no range that says what white is;
* every other mode (``L``, ``P``, ``RGBA``, ``CMYK``, ...) is 8 bits per channel already: PIL's conversion,
  after compositing an image with transparency (``RGBA``, ``LA``, a palette or ``tRNS`` colour) over white,
  as a viewer shows it (PIL's conversion drops the alpha: transparent pixels come out as whatever colour they
  hide, usually black).

Rescaled values are rounded to the nearest integer. :func:`read_image` (``swin predict``, ``swin show``) also
turns the image upright by its EXIF orientation, as a viewer does; :func:`open_rgb` does so only when asked,
since ``swin validate`` reads images as timm's evaluation does (no transpose), to keep its numbers comparable.
"""

from __future__ import annotations

import os

__all__ = [
    "MAX_RESIZED_PIXELS",
    "ImageTooElongatedError",
    "UnsupportedImageError",
    "check_resized_size",
    "open_rgb",
    "read_image",
    "to_rgb",
]

_SAVE_AS = "save it as an 8-bit or 16-bit PNG (or JPEG) and pass that"
# The most pixels the evaluation resize may produce before its crop: an elongated image (4000x1) resized to
# cover the crop would otherwise take gigabytes.
MAX_RESIZED_PIXELS = 64_000_000


class ImageTooElongatedError(ValueError):
    """An image whose resize before the crop would exceed :data:`MAX_RESIZED_PIXELS`."""


class UnsupportedImageError(ValueError):
    """An image PIL can read but whose pixel values have no known range to map to 8 bits (or no RGB form)."""


def read_image(path: str, folder_hint: str = ""):
    """The image at ``path`` as an 8-bit RGB PIL image (see :func:`open_rgb`); a directory, a missing file, a file
    PIL cannot read or whose depth cannot be mapped to 8 bits is a one-line error (``folder_hint`` is added to the
    directory case, e.g. which command scores a folder)."""
    from PIL import Image

    if os.path.isdir(path):
        raise IsADirectoryError(f"{path} is a directory; pass one image file{folder_hint}")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such image file; pass the path of a PNG or JPEG image")
    try:
        return open_rgb(path, upright=True)
    except Image.DecompressionBombError as error:
        raise ValueError(f"{path}: {error}") from None
    except UnsupportedImageError as error:
        raise ValueError(f"{path}: {error}") from None
    except (OSError, SyntaxError, ValueError) as error:  # PIL's UnidentifiedImageError; damaged data PIL refuses
        raise ValueError(f"{path} is not an image PIL can read ({error})") from None


def open_rgb(path, upright: bool = False):
    """The image at ``path`` (a path or a binary file) as an 8-bit RGB PIL image, 16-bit, 32-bit integer and float
    pixels rescaled by their nominal range (module docstring); ``upright``: turned by its EXIF orientation.

    Raises:
        UnsupportedImageError: no known range for its pixel values, or no RGB form.
        OSError, PIL.Image.DecompressionBombError: as ``PIL.Image.open`` and ``load``.
    """
    from PIL import Image

    with Image.open(path) as image:
        rgb = to_rgb(image)
        return _upright(image, rgb) if upright else rgb


def _upright(image, rgb):
    """``rgb`` turned by the EXIF orientation of ``image`` (its source), with ``PIL.ImageOps.exif_transpose``."""
    from PIL import Image, ImageOps

    orientation = image.getexif().get(0x0112, 1)
    if orientation == 1:
        return rgb
    # Transposed here, not the source: to_rgb reads the source's format and TIFF tags, which a transpose loses.
    exif = Image.Exif()
    exif[0x0112] = orientation
    rgb.info["exif"] = exif.tobytes()
    return ImageOps.exif_transpose(rgb)


def to_rgb(image):
    """An opened PIL image as 8-bit RGB, high-bit-depth modes rescaled (module docstring); the image is loaded."""
    import numpy as np

    image.load()
    mode = image.mode
    if mode.startswith("I;16"):
        pixels = np.asarray(image)
        if pixels.dtype.kind != "u":
            raise UnsupportedImageError(
                f"signed 16-bit pixels (PIL mode {mode}) have no range to map to 8 bits; {_SAVE_AS}"
            )
        return _gray(pixels, 65535)
    if mode == "I":
        top = _nominal_max(image)
        if top is None:
            raise UnsupportedImageError(
                f"32-bit integer pixels (PIL mode I) from {f'a {image.format} file' if image.format else 'an image'} "
                f"whose samples are signed or of unknown bit depth have no range to map to 8 bits; {_SAVE_AS}"
            )
        pixels = np.asarray(image)
        if pixels.size and (pixels.min() < 0 or pixels.max() > top):
            raise UnsupportedImageError(
                f"integer pixels from {pixels.min()} to {pixels.max()} exceed the file's nominal range 0..{top}; "
                f"{_SAVE_AS}"
            )
        return _gray(pixels, top)
    if mode == "F":
        pixels = np.asarray(image, dtype=np.float64)
        if not np.isfinite(pixels).all():
            raise UnsupportedImageError(
                f"float pixels (PIL mode F) include NaN or infinite values; replace them, scale the image to 0..1 "
                f"or {_SAVE_AS}"
            )
        if pixels.size and (pixels.min() < 0 or pixels.max() > 1):
            raise UnsupportedImageError(
                f"float pixels (PIL mode F) are read as 0.0 (black) to 1.0 (white), but these run from "
                f"{pixels.min():g} to {pixels.max():g}; scale them to 0..1 or {_SAVE_AS}"
            )
        return _gray(pixels, 1.0)
    try:
        return _over_white(image) if _has_alpha(image) else image.convert("RGB")
    except ValueError as error:  # a mode PIL has no RGB conversion for (e.g. LAB)
        raise UnsupportedImageError(f"{error} (PIL mode {mode}); {_SAVE_AS}") from None


def _has_alpha(image) -> bool:
    return image.mode in ("RGBA", "RGBa", "LA", "La", "PA") or "transparency" in image.info


def _over_white(image):
    """An 8-bit image with transparency composited over white, as 8-bit RGB."""
    from PIL import Image

    rgba = image.convert("RGBA")
    return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")


def check_resized_size(image, config, path) -> None:
    """Refuse ``image`` if the resize of ``config``'s evaluation transform (``create_transform``: the
    smallest size that covers ``resize_size``, keeping the aspect ratio) would exceed MAX_RESIZED_PIXELS."""
    if (config.get("crop_mode") or "center") != "center" or config.get("resize_size") is None:
        return  # squash resizes to the box itself, border fits inside it: no bigger than the box
    box = config["resize_size"]
    box = [int(v) for v in box] if isinstance(box, (list, tuple)) else [int(box)]
    box_height, box_width = box if len(box) == 2 else box * 2
    width, height = image.size
    scale = max(box_height / height, box_width / width)
    resized_width, resized_height = round(width * scale), round(height * scale)
    if resized_width * resized_height > MAX_RESIZED_PIXELS:
        raise ImageTooElongatedError(
            f"{path}: a {width}x{height} image would be resized to {resized_width}x{resized_height} "
            f"({resized_width * resized_height / 1e6:.0f} megapixels, over {MAX_RESIZED_PIXELS // 10**6}) to cover "
            f"the {box_width}x{box_height} resize before the crop; crop it nearer to square and pass that"
        )


def _gray(pixels, top: float):
    """A grayscale array whose nominal range is 0..top as an 8-bit RGB image (rounded to the nearest level)."""
    import numpy as np
    from PIL import Image

    levels = np.rint(pixels.astype(np.float64) * (255.0 / top)).astype(np.uint8)
    return Image.fromarray(levels, "L").convert("RGB")


def _nominal_max(image) -> int | None:
    """The largest value of the file's own sample depth for a PIL mode "I" image, or None where it is unknown."""
    if image.format in ("PNG", "PPM"):  # PNG's only deep grayscale is 16-bit; PIL rescales a PGM's maxval to 65535
        return 65535
    if image.format == "TIFF":
        tags = getattr(image, "tag_v2", {})
        bits = tags.get(258)  # BitsPerSample
        sample_format = tags.get(339, 1)  # SampleFormat: 1 unsigned integer, 2 signed
        bits = bits[0] if isinstance(bits, tuple) else bits
        sample_format = sample_format[0] if isinstance(sample_format, tuple) else sample_format
        if isinstance(bits, int) and 1 <= bits <= 32 and sample_format == 1:
            return 2**bits - 1
    return None
