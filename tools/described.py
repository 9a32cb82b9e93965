"""The commands' route for ``hf-hub:OWNER/NAME`` and ``local-dir:FOLDER`` names (a timm or transformers
repository or folder): the model its description builds, with its own weights, and errors in the commands' words
(options, not the Python API's arguments)."""

from __future__ import annotations

from torch import nn

from ..weights.hub_model import HUB_PREFIX, LOCAL_PREFIX

__all__ = ["described_model", "is_described"]

# The Python API's advice in an error, and the commands' own (added to the message).
_ADVICE = {
    "pass pretrained=False for the described model without them": (
        "swin export NAME OUT --random-weights exports the described model without them"
    ),
    "load a checkpoint file with pretrained=PATH instead": "a checkpoint file goes with its architecture's name "
    "(swin_t, ...) and --weights FILE",
    "build it with features_only=True": "it cannot classify; swin export NAME OUT --features-only exports it",
}


def is_described(name: str) -> bool:
    """Whether ``name`` names a repository or folder whose config.json describes the model."""
    return name.startswith((HUB_PREFIX, LOCAL_PREFIX))


def described_model(name: str, weights: str | None, *, classifier: bool, random: bool = False) -> nn.Module:
    """The model ``name`` describes, with its own weights (random ones with ``random``), in eval mode. A
    ``--weights`` beside it, or (``classifier``) a model without a head, is refused."""
    from ..factory import create_model

    if weights:
        raise ValueError(
            f"{name} names its own weights: leave --weights out, or name the architecture (swin_t, ...) with --weights"
        )
    try:
        model = create_model(name, pretrained=not random, features_only=not classifier)
    except (FileNotFoundError, ValueError) as error:
        for theirs, ours in _ADVICE.items():
            if theirs in str(error):
                raise type(error)(f"{error} ({ours})") from None
        raise
    if classifier and not model.num_classes:
        raise ValueError(
            f"{name} describes a model without a classifier head: it cannot classify (export its "
            "backbone with swin export NAME OUT --features-only)"
        )
    return model.eval()
