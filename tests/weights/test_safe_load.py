"""Reading checkpoint files: metadata of real training checkpoints is tolerated, code never runs."""

from __future__ import annotations

import argparse
import sys
import types

import numpy as np
import pytest
import torch

from swin.weights import convert
from swin.weights.safe_load import CorruptCheckpointError, UnsafeCheckpointError, check_file, load_file
from tests.weights.conftest import safetensors_bytes, torch_bytes


@pytest.fixture
def fake_yacs(monkeypatch):
    """A stand-in for ``yacs.config.CfgNode`` (not installed here) so a checkpoint can be pickled with that
    global, as the official training code's ``save_checkpoint`` does (``'config': config``)."""

    class CfgNode(dict):
        def __init__(self, *args):
            super().__init__(*args)
            self.__dict__["__immutable__"] = False

    CfgNode.__module__, CfgNode.__qualname__ = "yacs.config", "CfgNode"
    module = types.ModuleType("yacs.config")
    module.CfgNode = CfgNode
    monkeypatch.setitem(sys.modules, "yacs", types.ModuleType("yacs"))
    monkeypatch.setitem(sys.modules, "yacs.config", module)
    return CfgNode


def test_training_checkpoint_metadata_is_read_without_unpickling_code(tmp_path, fake_yacs, monkeypatch):
    """What the official code saves: model, optimizer, lr_scheduler, max_accuracy, epoch, config (yacs),
    plus numpy scalars and argparse args that other training scripts add."""
    config = fake_yacs()
    config["MODEL"] = fake_yacs({"TYPE": "swin", "NAME": "swin_tiny_patch4_window7_224"})
    model = {"patch_embed.proj.weight": torch.randn(96, 3, 4, 4), "head.bias": torch.zeros(1000)}
    checkpoint = {
        "model": model,
        "optimizer": {"state": {0: {"exp_avg": torch.zeros(3)}}, "param_groups": [{"lr": 1e-3, "params": [0]}]},
        "lr_scheduler": {"t_initial": 300},
        "max_accuracy": np.float64(81.2),
        "epoch": 299,
        "config": config,
        "args": argparse.Namespace(batch_size=128),
        "val_top1": np.array([81.2, 95.5]),
    }
    path = tmp_path / "ckpt_epoch_299.pth"
    path.write_bytes(torch_bytes(checkpoint))
    monkeypatch.delitem(sys.modules, "yacs.config")  # nothing is imported while reading: yacs is not needed
    monkeypatch.delitem(sys.modules, "yacs")
    loaded = load_file(path)
    assert loaded["config"]["MODEL"]["TYPE"] == "swin" and loaded["epoch"] == 299
    assert set(convert(loaded)) == set(model)
    assert torch.equal(convert(loaded)["patch_embed.proj.weight"], model["patch_embed.proj.weight"])


class Thing:
    pass


def test_unknown_class_is_refused_by_name(tmp_path):
    path = tmp_path / "custom.pth"
    path.write_bytes(torch_bytes({"model": {"w": torch.ones(1)}, "thing": Thing()}))
    with pytest.raises(UnsafeCheckpointError, match=r"would import or call tests\.weights\.test_safe_load\.Thing"):
        load_file(path)


def test_safetensors_truncated_or_not_a_checkpoint(tmp_path):
    body = safetensors_bytes({"w": torch.ones(100)})
    path = tmp_path / "model.safetensors"
    path.write_bytes(body[:-7])
    with pytest.raises(CorruptCheckpointError, match="truncated"):
        check_file(path)
    path.write_bytes(body)
    assert check_file(path) == "safetensors" and torch.equal(load_file(path)["w"], torch.ones(100))
    html = tmp_path / "model.pth"
    html.write_bytes(b"<!DOCTYPE html><html><body>rate limited</body></html>")
    with pytest.raises(CorruptCheckpointError, match=r"is not a checkpoint .* starts with b'<!DOCTYPE"):
        load_file(html)
    html.write_bytes(b"")
    with pytest.raises(CorruptCheckpointError, match="empty file"):
        load_file(html)
