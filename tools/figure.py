"""What every drawing command shares: the output file and ``--dpi`` checked before any slow work, matplotlib
without a display, and figures written atomically.

The format comes from the file name (png, svg or pdf, as ``swin flops --plot``), so a typo in the extension
is reported at once instead of after a forward pass, and a figure is never written in a format its name
does not say. The output name is checked as every other command's output is (:func:`check_output`): never
a symbolic link, FIFO, device or directory, never one of the command's inputs. The figure is written to a
temporary file beside it and renamed over it (:func:`atomic_output`), so a crash or Ctrl-C in the middle of
a long save leaves the old file, or none, never a truncated one.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable

from ..atomic import UnsafeOutputError, atomic_output, check_output
from .argtypes import whole_number
from .flops_cmd import _PLOT_HINT, PLOT_FORMATS

__all__ = ["MAX_DPI", "check_figure_path", "parse_dpi", "pyplot", "save"]

# Highest --dpi: 1200 dpi is beyond any printer; a 13 x 14 inch figure at it is already a ~1 GB raster.
MAX_DPI = 1200


# The argparse type of ``--dpi``: dots per inch from 1 to MAX_DPI, checked before any work (matplotlib only
# refuses 0 after the forward pass, and a huge one runs out of memory).
parse_dpi = whole_number(
    1,
    MAX_DPI,
    says=f"--dpi takes a whole number of dots per inch from 1 to {MAX_DPI} (e.g. 120 for the screen, 300 for print)",
)


def check_figure_path(path: str, option: str = "--out", inputs: Iterable[str | os.PathLike] = ()) -> str:
    """The format of ``path`` (png, svg, pdf), or a ``ValueError`` that names ``option`` and the fix: an
    unknown extension, a folder that does not exist, a name that is a directory, a symbolic link, a FIFO or
    another special file, one of ``inputs``, or a place that cannot be written."""
    extension = os.path.splitext(path)[1].lower().lstrip(".")
    if extension not in PLOT_FORMATS:
        told = "." + extension if extension else "no extension"
        raise ValueError(
            f"{option} {path}: cannot tell the image format from {told}; "
            f"end the file name in {', '.join('.' + f for f in PLOT_FORMATS)}"
        )
    if os.path.isdir(path) and not os.path.islink(path):
        raise ValueError(f"{option} {path} is a directory; give a file name such as {path.rstrip('/')}/figure.png")
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise ValueError(f"{option} {path}: {folder} is a file, not a folder; choose another path")
    if not os.path.isdir(folder):
        raise ValueError(f"{option} {path}: the folder {folder} does not exist; create it or choose another path")
    try:
        check_output(path, inputs)
    except (UnsafeOutputError, OSError) as error:
        raise ValueError(f"{option}: {error}") from None
    if importlib.util.find_spec("matplotlib") is None:  # before the model is built and run, not after
        raise ImportError(f"{option} {path}: drawing needs matplotlib, which is not installed: {_PLOT_HINT}")
    return extension


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (no display needed), or an ``ImportError`` saying how to
    install it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError(f"drawing needs matplotlib, which is not installed: {_PLOT_HINT}") from None
    return plt


def save(figure, path: str, dpi: int = 120, option: str = "--out") -> None:
    """Write ``figure`` to ``path`` in the format its extension names, atomically, and free it.

    The figure goes to a temporary file in ``path``'s folder, flushed and renamed over ``path`` only once
    complete; on any failure (Ctrl-C included) the temporary file is removed and ``path`` keeps what it had.
    """
    plt = pyplot()
    try:
        fmt = check_figure_path(path, option)
        with atomic_output(path) as temporary:
            figure.savefig(temporary, format=fmt, dpi=dpi)
    except OSError as error:  # named as given, not as the hidden temporary file the write went to
        raise OSError(f"{option} {path}: cannot write the figure ({error.strerror or error})") from None
    finally:
        plt.close(figure)
