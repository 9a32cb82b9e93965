"""Named Swin architectures, described as YAML (``models.yaml``), and their lookup."""

from .config import SwinConfig, describe_window, window_size_field
from .lookup import UnknownModelError, get_config, list_models, register_model, resolve_name

__all__ = [
    "SwinConfig",
    "UnknownModelError",
    "get_config",
    "list_models",
    "register_model",
    "resolve_name",
    "describe_window",
    "window_size_field",
]
