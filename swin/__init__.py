"""swin: Swin Transformer backbones, exact against the official checkpoints.

>>> import swin
>>> model = swin.create_model("swin_t")
"""

from .backbone import SwinBackbone
from .detection import SwinFPN, detection_backbone
from .factory import create_model
from .flops import flops
from .model import SwinTransformer
from .optim import param_groups
from .registry import SwinConfig, get_config, list_models, register_model
from .weights.data_config import data_config

__version__ = "0.1.0"

__all__ = [
    "SwinBackbone",
    "SwinConfig",
    "SwinFPN",
    "SwinTransformer",
    "create_model",
    "data_config",
    "detection_backbone",
    "flops",
    "get_config",
    "list_models",
    "param_groups",
    "register_model",
]
