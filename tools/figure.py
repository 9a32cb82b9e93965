"""What every drawing command shares: the output file checked before any slow work, and matplotlib without a
display.

The format comes from the file name (png, svg or pdf, as ``swin flops --plot``), so a typo in the extension
is reported at once instead of after a forward pass, and a figure is never written in a format its name
does not say.
"""

from __future__ import annotations

import os

from .flops_cmd import _PLOT_HINT, PLOT_FORMATS

__all__ = ["check_figure_path", "pyplot", "save"]


def check_figure_path(path: str, option: str = "--out") -> str:
    """The format of ``path`` (png, svg, pdf), or a ``ValueError`` that names ``option`` and the fix: an
    unknown extension, a folder that does not exist, or a name that is a directory."""
    extension = os.path.splitext(path)[1].lower().lstrip(".")
    if extension not in PLOT_FORMATS:
        told = "." + extension if extension else "no extension"
        raise ValueError(
            f"{option} {path}: cannot tell the image format from {told}; "
            f"end the file name in {', '.join('.' + f for f in PLOT_FORMATS)}"
        )
    if os.path.isdir(path):
        raise ValueError(f"{option} {path} is a directory; give a file name such as {path.rstrip('/')}/figure.png")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"{option} {path}: the folder {folder} does not exist; create it or choose another path")
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


def save(figure, path: str, dpi: int = 120) -> None:
    """Write ``figure`` to ``path`` in the format its extension names, and free it."""
    plt = pyplot()
    try:
        figure.savefig(path, format=check_figure_path(path), dpi=dpi)
    finally:
        plt.close(figure)
