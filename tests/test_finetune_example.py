"""examples/finetune.py runs a few steps on synthetic data, alone and under torchrun with two gloo ranks."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import swin

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "finetune.py"
TINY = {"depths": [1, 1, 1, 1], "embed_dim": 16, "num_heads": [1, 2, 4, 8], "img_size": 64}
ARGS = ["--model-kwargs", json.dumps(TINY), "--num-classes", "10", "--drop-path", "0", "--log-every", "100"]


def load_example():
    spec = importlib.util.spec_from_file_location("finetune_example", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_few_steps_learn_with_layer_decayed_groups_and_schedule(tmp_path, monkeypatch, one_thread):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    lr, layer_decay, warmup, steps = 2e-3, 0.5, 3, 12
    metrics = load_example().main(
        [
            *ARGS,
            *("--steps", str(steps), "--warmup-steps", str(warmup), "--batch-size", "8", "--lr", str(lr)),
            *("--layer-decay", str(layer_decay), "--amp", "bf16", "--output", str(tmp_path)),
        ]
    )
    assert metrics["world_size"] == 1 and metrics["steps"] == steps
    losses = torch.tensor(metrics["losses"])
    assert torch.isfinite(losses).all()
    assert losses[-4:].mean() < losses[:4].mean() - 0.3, losses  # the fixed pool of 32 images is being learned

    rates = torch.tensor(metrics["lr"])  # (steps, groups): ordered from the patch embedding to the head
    head, stem = rates[:, -1], rates[:, 0]
    # The schedule scales every group alike: the stem keeps layer_decay ** (blocks + 1) of the head's rate.
    torch.testing.assert_close(stem / head, torch.full_like(head, layer_decay ** (sum(TINY["depths"]) + 1)))
    assert head[0] == pytest.approx(lr / warmup) and head[warmup - 1] == pytest.approx(lr)
    assert (head[warmup:].diff() < 0).all() and 1e-6 < head[-1] < 0.1 * lr

    state = torch.load(tmp_path / "model.pth", weights_only=True)
    reloaded = swin.create_model("swin_t", pretrained=tmp_path / "model.pth", num_classes=10, **TINY)
    for key, value in reloaded.state_dict().items():
        assert torch.equal(value, state[key]), key
    assert json.loads((tmp_path / "metrics.json").read_text())["losses"] == metrics["losses"]


def test_runs_under_torchrun_with_two_ranks(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    command = [
        *(sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"),
        *("--master-addr", "127.0.0.1", "--master-port", str(port)),
        *(str(SCRIPT), *ARGS, "--steps", "3", "--batch-size", "4", "--amp", "off", "--output", str(tmp_path)),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["steps"] == 3
    assert all(torch.isfinite(torch.tensor(metrics["losses"])))
