"""swin: Swin Transformer backbones, exact against the official checkpoints.

>>> import swin
>>> model = swin.create_model("swin_t")
"""

from .factory import create_model
from .model import SwinTransformer
from .registry import SwinConfig, get_config, list_models, register_model

__version__ = "0.1.0"

__all__ = ["SwinConfig", "SwinTransformer", "create_model", "get_config", "list_models", "register_model"]
