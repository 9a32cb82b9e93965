"""Shared helpers: reference models from timm / torchvision with the same random weights as ours."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest
import torch

import swin
from swin.weights import convert

# Under pytest-xdist (the README's test command runs one worker per core) each worker gets its share of the
# cores, so that workers do not oversubscribe the machine with torch's intra-op threads.
if os.environ.get("PYTEST_XDIST_WORKER"):
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))

# The fused attention kernel (swin.layers.window_kernel) builds into torch's extension cache on first use: here
# a private one per test process (about 2 s to build), removed at exit, never the user's.
if "TORCH_EXTENSIONS_DIR" not in os.environ:
    os.environ["TORCH_EXTENSIONS_DIR"] = tempfile.mkdtemp(prefix="swin-tests-extensions-")
    atexit.register(shutil.rmtree, os.environ["TORCH_EXTENSIONS_DIR"], ignore_errors=True)

# Our registered name -> timm's name (timm is an independent implementation of the same architectures).
TIMM_NAMES = {name: swin.get_config(name).aliases[0] for name in swin.list_models()}


# SWIN_FULL_PARITY=1: parity tests build every model at its full depth (else the expensive ones at two blocks
# per stage, a regular and a shifted one: more blocks of the same stage prove nothing more).
FULL_PARITY = os.environ.get("SWIN_FULL_PARITY") == "1"


def parity_depths(name: str) -> dict:
    """Depth override for the S/B/L models unless SWIN_FULL_PARITY=1 (the T models run at full depth)."""
    return {} if FULL_PARITY or "_t" in name else {"depths": (2, 2, 2, 2)}


def timm_pair(
    name: str,
    depths: tuple[int, ...] | None = None,
    shape: dict | None = None,
    position_bias_std: float | None = None,
    **timm_kwargs,
):
    """A randomly initialised timm model and ours carrying its weights, both in eval mode (both built with
    ``depths`` and the arguments in ``shape`` when given; ``timm_kwargs`` for timm's alone).
    ``position_bias_std``: the position-bias tables drawn with this std instead (at their initial 0.02 the
    bias hardly changes the logits, so a test that must notice it being wrong draws them larger)."""
    import timm

    torch.manual_seed(0)
    shape = {**(shape or {}), **({} if depths is None else {"depths": depths})}
    reference = timm.create_model(TIMM_NAMES[name], **shape, **timm_kwargs).eval()
    if position_bias_std is not None:
        with torch.no_grad():
            for parameter_name, table in reference.named_parameters():
                if parameter_name.endswith("relative_position_bias_table"):
                    table.normal_(0, position_bias_std)
    ours = swin.create_model(name, **shape).eval()
    ours.load_state_dict(convert(reference.state_dict(), source="timm"))
    return reference, ours


@pytest.fixture
def seeded():
    torch.manual_seed(0)


@pytest.fixture
def one_thread():
    """Small models train several times faster on one thread than on a contended pool (the examples' tests)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
