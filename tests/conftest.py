"""Shared helpers: reference models from timm / torchvision with the same random weights as ours."""

from __future__ import annotations

import pytest
import torch

import swin
from swin.weights import convert

# Our registered name -> timm's name (timm is an independent implementation of the same architectures).
TIMM_NAMES = {name: swin.get_config(name).aliases[0] for name in swin.list_models()}


def timm_pair(name: str, **timm_kwargs):
    """A randomly initialised timm model and ours carrying its weights, both in eval mode."""
    import timm

    torch.manual_seed(0)
    reference = timm.create_model(TIMM_NAMES[name], **timm_kwargs).eval()
    ours = swin.create_model(name).eval()
    ours.load_state_dict(convert(reference.state_dict(), source="timm"))
    return reference, ours


@pytest.fixture
def seeded():
    torch.manual_seed(0)
