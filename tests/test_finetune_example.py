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


# -- --data checked before a model is built ---------------------------------------------------------------


@pytest.fixture
def folder(tmp_path):
    """An ImageFolder of 3 classes, 2 tiny images each."""
    from PIL import Image

    root = tmp_path / "data"
    for c, name in enumerate(("cat", "dog", "eel")):
        (root / name).mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (24, 24), (80 * c, 40 * i, 120)).save(root / name / f"{i}.png")
    return root


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if a model is built: the data must be checked first (and a hang becomes a failure)."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(swin, "create_model", lambda *a, **k: pytest.fail("a model was built before the check"))


DATA_ARGS = ["--model-kwargs", json.dumps(TINY), "--drop-path", "0", "--workers", "0", "--steps", "1"]


@pytest.mark.parametrize(("world", "batch", "needed"), [(1, 8, 8), (2, 4, 7)])
def test_data_smaller_than_one_batch_is_an_error(folder, no_model, monkeypatch, world, batch, needed):
    """6 images and drop_last: the loader was empty and the training loop waited for a batch forever."""
    monkeypatch.setenv("WORLD_SIZE", str(world))  # checked before joining the process group
    with pytest.raises(SystemExit) as exit_:
        load_example().main([*DATA_ARGS, "--data", str(folder), "--batch-size", str(batch)])
    message = str(exit_.value)
    assert message.startswith("finetune.py: error: ") and "has 6 images, fewer than one full batch" in message
    assert f"--batch-size {batch} per process x world size {world} needs at least {needed}" in message


@pytest.mark.parametrize("classes", ["2", "10"])
def test_num_classes_must_match_the_folders(folder, no_model, classes):
    """--num-classes 2 on 3 folders was an IndexError mid-training; 10 silently trained a 10-way head."""
    with pytest.raises(SystemExit) as exit_:
        load_example().main([*DATA_ARGS, "--data", str(folder), "--batch-size", "2", "--num-classes", classes])
    message = str(exit_.value)
    assert f"--num-classes {classes} does not match" in message and "3 class folders (cat, dog, eel)" in message
    assert "--num-classes 3" in message


def test_num_classes_defaults_to_the_folders(folder, tmp_path, monkeypatch, one_thread):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    out = tmp_path / "out"
    metrics = load_example().main([*DATA_ARGS, "--data", str(folder), "--batch-size", "2", "--output", str(out)])
    assert metrics["steps"] == 1
    assert torch.load(out / "model.pth", weights_only=True)["head.weight"].shape[0] == 3


def test_an_epoch_without_a_batch_is_an_error():
    """The guard in batches(): an empty loader raises instead of spinning (an alarm turns a hang into a failure)."""
    import signal

    from torch.utils.data import DataLoader, TensorDataset

    loader = DataLoader(TensorDataset(torch.zeros(3, 1)), batch_size=8, drop_last=True)

    def hung(*_):
        raise TimeoutError("batches() spun on an empty loader")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(5)
    try:
        with pytest.raises(RuntimeError, match="gave no batch of 8"):
            next(load_example().batches(loader))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
