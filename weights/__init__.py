"""Checkpoint handling: layout conversion (pretrained manifests and downloads build on it)."""

from .convert import convert, detect_layout, export, unwrap
from .layouts import LAYOUTS

__all__ = ["LAYOUTS", "convert", "detect_layout", "export", "unwrap"]
