"""Checkpoints: layout conversion, the pretrained manifest, safe loading, cached downloads, adaptation.

>>> from swin.weights import convert, export
>>> ours = convert(torch.load("swin_tiny_patch4_window7_224.pth", weights_only=True))  # any layout
>>> timm_sd = export(ours, target="timm")
"""

from .adapt import adapt_input_conv, fit_state_dict, resize_relative_position_bias_table
from .convert import convert, detect_layout, unwrap
from .data_config import create_transform, data_config
from .download import DownloadError
from .export_layout import export
from .layouts import LAYOUTS
from .manifest import PretrainedEntry, get_entry, list_pretrained, register_pretrained
from .pretrained import WeightsNotFoundError, fetch, fetch_url, load_checkpoint, load_pretrained
from .safe_load import CorruptCheckpointError, UnsafeCheckpointError, load_file
from .storage import CacheDirError

__all__ = [
    "LAYOUTS",
    "CacheDirError",
    "CorruptCheckpointError",
    "DownloadError",
    "PretrainedEntry",
    "UnsafeCheckpointError",
    "WeightsNotFoundError",
    "adapt_input_conv",
    "convert",
    "create_transform",
    "data_config",
    "detect_layout",
    "export",
    "fetch",
    "fetch_url",
    "fit_state_dict",
    "get_entry",
    "list_pretrained",
    "load_checkpoint",
    "load_file",
    "load_pretrained",
    "register_pretrained",
    "resize_relative_position_bias_table",
    "unwrap",
]
