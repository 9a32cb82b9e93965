"""Shared helpers: reference models from timm / torchvision with the same random weights as ours."""

from __future__ import annotations

import os

import pytest
import torch

import swin
from swin.weights import convert

# Under pytest-xdist (the README's test command runs one worker per core) each worker gets its share of the
# cores, so that workers do not oversubscribe the machine with torch's intra-op threads.
if os.environ.get("PYTEST_XDIST_WORKER"):
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))

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
