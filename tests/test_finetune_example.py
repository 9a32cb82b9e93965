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

    written = json.loads((tmp_path / "metrics.json").read_text())
    assert written["losses"] == metrics["losses"]
    # metrics.json names what rebuilds the model the weights belong to (it recorded none of it)
    assert (written["model"], written["model_kwargs"], written["num_classes"]) == ("swin_t", TINY, 10)
    assert written["img_size"] == [64, 64] and written["amp"] == "bfloat16"
    weights = tmp_path / "model.pth"
    name, kwargs, classes = written["model"], written["model_kwargs"], written["num_classes"]
    reloaded = swin.create_model(name, pretrained=weights, num_classes=classes, **kwargs)
    assert list(reloaded.config.img_size) == written["img_size"]
    state = torch.load(weights, weights_only=True)
    for key, value in reloaded.state_dict().items():
        assert torch.equal(value, state[key]), key
    # and as a timm folder, which timm builds with the same outputs
    timm = pytest.importorskip("timm")
    theirs = timm.create_model(f"local-dir:{tmp_path / 'hf'}", pretrained=True).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(theirs(x), reloaded.eval()(x), rtol=1e-5, atol=1e-5)


def test_runs_under_torchrun_with_two_ranks(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # torchrun's logs (else a /tmp/torchelastic_* directory left behind) and any other temporary file of the
    # launcher and its ranks: under tmp_path
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "TMPDIR": str(scratch)}
    command = [
        *(sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"),
        *("--master-addr", "127.0.0.1", "--master-port", str(port), "--log-dir", str(tmp_path / "torchrun-logs")),
        *(str(SCRIPT), *ARGS, "--steps", "3", "--batch-size", "4", "--amp", "off", "--output", str(tmp_path)),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["steps"] == 3
    assert all(torch.isfinite(torch.tensor(metrics["losses"])))
    assert (tmp_path / "torchrun-logs").is_dir()  # the launcher took the log directory given


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
    # the timm folder names the classes by their folders, as timm reads them (predict and validate use them)
    import timm

    assert timm.create_model(f"local-dir:{out / 'hf'}").pretrained_cfg["label_names"] == ["cat", "dog", "eel"]


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


# -- reproducible runs, the model's own preprocessing ------------------------------------------------------


def test_same_seed_same_losses_with_augmentation(folder, monkeypatch, one_thread):
    """timm's random resized crop and RandAugment draw from Python's random and numpy: with torch's seed
    alone two runs in one process trained on different crops."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    example = load_example()
    argv = [*DATA_ARGS, "--data", str(folder), "--batch-size", "2", "--steps", "2", "--amp", "off", "--seed", "3"]
    first, second = example.main(argv)["losses"], example.main(argv)["losses"]
    assert len(first) == 2 and first == second


def test_each_rank_seeds_with_seed_plus_rank(monkeypatch):
    """Every DDP rank had the same seed: the same drop-path masks and augmentations on every process."""
    example = load_example()
    monkeypatch.setattr(example, "setup_distributed", lambda: (3, 4, torch.device("cpu")))
    seeds = []

    class Built(Exception):
        pass

    def create_model(*args, **kwargs):
        raise Built

    monkeypatch.setattr(example, "seed_everything", seeds.append)
    monkeypatch.setattr(swin, "create_model", create_model)
    with pytest.raises(Built):
        example.main([*ARGS, "--seed", "10"])
    assert seeds == [13]  # before the model's initialisation


@pytest.mark.parametrize("pinned", [{}, {"mean": (0.5, 0.4, 0.3), "std": (0.2, 0.3, 0.4), "interpolation": "bilinear"}])
def test_train_transform_uses_the_models_preprocessing(pinned):
    """The transform was timm's default: bilinear (Swin's weights expect bicubic) and ImageNet's mean/std
    whatever the model's pretrained_cfg said."""
    from torchvision.transforms import Normalize

    model = swin.create_model("swin_t", **{**TINY, "img_size": 96})
    model.pretrained_cfg = {**model.pretrained_cfg, **pinned}
    cfg = model.pretrained_cfg
    assert cfg["interpolation"] == pinned.get("interpolation", "bicubic")
    steps = load_example().train_transform(model).transforms
    crop, normalize = steps[0], next(step for step in steps if isinstance(step, Normalize))
    assert crop.size == (96, 96) and crop.interpolation.value == cfg["interpolation"]
    torch.testing.assert_close(torch.as_tensor(normalize.mean), torch.tensor(cfg["mean"]))
    torch.testing.assert_close(torch.as_tensor(normalize.std), torch.tensor(cfg["std"]))


@pytest.mark.parametrize(
    ("amp", "fastest", "expected"),
    [
        ("auto", torch.bfloat16, torch.bfloat16),
        ("auto", torch.float16, torch.float16),
        ("auto", torch.float32, None),  # bf16 autocast on an AVX2-only CPU: several times slower
        ("bf16", torch.float32, torch.bfloat16),
        ("fp16", torch.float32, torch.float16),
        ("off", torch.bfloat16, None),
    ],
)
def test_amp_auto_follows_the_fastest_dtype(monkeypatch, amp, fastest, expected):
    example = load_example()
    asked = []
    monkeypatch.setattr(swin, "fastest_dtype", lambda device: asked.append(device) or fastest)
    assert example.autocast_dtype(amp, torch.device("cpu")) is expected
    assert asked == ([torch.device("cpu")] if amp == "auto" else [])
    assert example.parse_args([]).amp == "auto"


# -- arguments checked in the parser, before a model is built ----------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "0"], "argument --steps: expected a positive whole number, got '0'"),
        (["--steps", "-5"], "argument --steps: expected a positive whole number, got '-5'"),
        (["--log-every", "0"], "argument --log-every: expected a positive whole number, got '0'"),
        (["--lr", "0"], "argument --lr: expected a positive number, got '0'"),
        (["--lr", "-0.001"], "argument --lr: expected a positive number, got '-0.001'"),
        (["--lr", "nan"], "argument --lr: expected a positive number, got 'nan'"),
        (["--layer-decay", "0"], "argument --layer-decay: expected a number in (0, 1], got '0'"),
        (["--layer-decay", "1.5"], "argument --layer-decay: expected a number in (0, 1], got '1.5'"),
        (["--warmup-steps", "-1"], "argument --warmup-steps: expected a non-negative whole number, got '-1'"),
        (["--workers", "-1"], "argument --workers: expected a non-negative whole number, got '-1'"),
        (["--model-kwargs", "{"], "argument --model-kwargs: not valid JSON"),
        (["--model-kwargs", "[96]"], "argument --model-kwargs: expected a JSON object"),
        (["--model-kwargs", '{"drop_path_rate": 0.2}'], "pass --drop-path instead of 'drop_path_rate'"),
        (["--model-kwargs", '{"num_classes": 5}'], "pass --num-classes instead of 'num_classes'"),
        (["--amp", "fp8"], "argument --amp: invalid choice: 'fp8'"),
    ],
)
def test_bad_arguments_are_argparse_errors(capsys, no_model, argv, message):
    with pytest.raises(SystemExit) as exit_:
        load_example().main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_good_arguments_parse():
    args = load_example().parse_args(
        ["--layer-decay", "1", "--lr", "1e-3", "--warmup-steps", "0", "--workers", "0", "--model-kwargs", "{}"]
    )
    assert (args.layer_decay, args.lr, args.warmup_steps, args.workers, args.model_kwargs) == (1.0, 1e-3, 0, 0, {})


@pytest.mark.parametrize(("kwargs", "says"), [({"drop": 0.1}, "unknown config field"), ({"img_size": 0}, "img_size")])
def test_a_model_option_no_model_takes_is_one_line(kwargs, says):
    """--model-kwargs a model refuses: a one-line argument error, as the script's own (it was a traceback)."""
    with pytest.raises(SystemExit, match=f"finetune.py: error: --model swin_t --model-kwargs .*{says}"):
        load_example().main(["--steps", "1", "--model-kwargs", json.dumps(kwargs)])
