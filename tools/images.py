"""Reading the one image a command is given, with one-line errors that say what the path is instead."""

from __future__ import annotations

import os

__all__ = ["read_image"]


def read_image(path: str, folder_hint: str = ""):
    """The image at ``path`` as an RGB PIL image; a directory, a missing file or a file PIL cannot read is a
    one-line error (``folder_hint`` is added to the directory case, e.g. which command scores a folder)."""
    from PIL import Image

    if os.path.isdir(path):
        raise IsADirectoryError(f"{path} is a directory; pass one image file{folder_hint}")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such image file; pass the path of a PNG or JPEG image")
    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except Image.DecompressionBombError as error:
        raise ValueError(f"{path}: {error}") from None
    except (OSError, SyntaxError) as error:  # PIL's UnidentifiedImageError included
        raise ValueError(f"{path} is not an image PIL can read ({error})") from None
