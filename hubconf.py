"""torch.hub entry points, as torchvision's: ``torch.hub.load("OWNER/REPO", "swin_t", pretrained=True)`` builds
``swin.create_model("swin_t", pretrained=True)`` from this checkout (any registered name; other keywords go to
``create_model``: ``features_only=True``, ``num_classes=10``, ...). ``torch.hub.list`` names them,
``torch.hub.help`` describes one; ``create_model`` takes any name, timm's and ``hf-hub:`` ones included.

A checkout is not an installed package: ``layers/``, ``registry/``, ``weights/`` and ``tools/`` sit beside
``swin/`` and install as ``swin.layers``, ... (pyproject's package-dir). Loaded from a checkout, they are
registered under those names here, from their folders, as the installed package has them.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import warnings

dependencies = ["torch", "timm", "einops", "yaml", "safetensors", "filelock"]

_ROOT = os.path.dirname(os.path.abspath(__file__))
_SUBPACKAGES = ("layers", "registry", "weights", "tools")


def _swin():
    """The swin package, with its subpackages under their installed names when it is this checkout's."""
    import swin

    here = os.path.dirname(os.path.abspath(swin.__file__)) == os.path.join(_ROOT, "swin")
    if not here:
        warnings.warn(
            f"swin was imported from {os.path.dirname(swin.__file__)} before this hub entry: its models are "
            f"built, not those of {_ROOT}",
            stacklevel=3,
        )
    for sub in _SUBPACKAGES:
        name = f"swin.{sub}"
        if not here or name in sys.modules:
            continue
        folder = os.path.join(_ROOT, sub)
        spec = importlib.util.spec_from_file_location(
            name, os.path.join(folder, "__init__.py"), submodule_search_locations=[folder]
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        setattr(swin, sub, module)  # as an import of the installed subpackage does
    return swin


def create_model(name: str, *args, **kwargs):
    """``swin.create_model(name, ...)``: any registered name, timm alias, ``ARCH.TAG`` or ``hf-hub:`` name."""
    return _swin().create_model(name, *args, **kwargs)


def _entry(name: str):
    def entry(*args, **kwargs):
        return _swin().create_model(name, *args, **kwargs)

    entry.__name__ = entry.__qualname__ = name
    entry.__doc__ = (
        f"swin.create_model({name!r}, ...): pretrained=True for its default weights (or a tag, a file, a URL), "
        "features_only=True for the four NCHW feature maps, num_classes=N for a new head."
    )
    return entry


for _name in _swin().list_models():
    globals()[_name] = _entry(_name)
del _name
