"""Nothing silently wrong: bad inputs get one clear error, in Python and on the command line."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import torch

import swin
from swin.tools.cli import main
from swin.weights import convert, unwrap


@pytest.mark.parametrize("value", ["", 0, [], 0.0])
def test_false_like_pretrained_is_an_error_not_random_weights(value):
    with pytest.raises(ValueError, match="pretrained="):
        swin.create_model("swin_t", pretrained=value)


def test_pretrained_error_never_prints_tensors():
    with pytest.raises((TypeError, ValueError)) as info:
        swin.create_model("swin_t", pretrained=[torch.zeros(100_000)])
    assert len(str(info.value)) < 400


def test_pretrained_accepts_a_state_dict_in_any_layout():
    import timm

    torch.manual_seed(0)
    reference = timm.create_model("swin_tiny_patch4_window7_224", depths=(2, 2, 2, 2), num_classes=10).eval()
    ours = swin.create_model("swin_t", depths=(2, 2, 2, 2), num_classes=10, pretrained=reference.state_dict()).eval()
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        assert (ours(x) - reference(x)).abs().max().item() <= 1e-5


def test_batch_of_zero_images_gives_empty_outputs_like_torchvision():
    import torchvision

    x = torch.zeros(0, 3, 224, 224)
    with torch.no_grad():
        expected = torchvision.models.swin_t().eval()(x)
        got = swin.create_model("swin_t").eval()(x)
        levels = swin.create_model("swin_t", features_only=True).eval()(torch.zeros(0, 3, 96, 128))
    assert got.shape == expected.shape == (0, 1000)
    assert [tuple(level.shape) for level in levels] == [
        (0, 96, 24, 32),
        (0, 192, 12, 16),
        (0, 384, 6, 8),
        (0, 768, 3, 4),
    ]


def test_self_containing_checkpoint_is_refused_at_once():
    nested: dict = {}
    nested["model"] = nested
    with pytest.raises(ValueError, match="cycle"):
        unwrap(nested)


def _small_state(prefix: str) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = swin.create_model("swin_t", depths=(2, 2, 2, 2), num_classes=10)
    return {prefix + k: v for k, v in model.state_dict().items()}, model


@pytest.mark.parametrize("prefix", ["_orig_mod.", "_orig_mod.module.", "module._orig_mod.", "module.model."])
def test_compiled_model_checkpoint_loads(prefix):
    """torch.compile(DDP(model)).state_dict() has _orig_mod.module. keys: both go, in either order, as timm's
    clean_state_dict removes them (only _orig_mod. was, and every trunk key was reported missing)."""
    state, model = _small_state(prefix)
    loaded = swin.create_model("swin_t", depths=(2, 2, 2, 2), num_classes=10, pretrained=state)
    assert torch.equal(loaded.head.weight, model.head.weight)


@pytest.mark.parametrize("prefix", ["encoder.", "student.backbone."])
def test_unknown_prefix_gets_a_hint_naming_it(prefix):
    state, _ = _small_state(prefix)
    with pytest.raises(ValueError) as info:
        swin.create_model("swin_t", depths=(2, 2, 2, 2), num_classes=10, pretrained=state)
    message = str(info.value)
    assert repr(prefix) in message and "removeprefix" in message and "the model lacks" in message
    assert convert(state)  # the keys themselves convert; only the prefix is in the way


def test_command_errors_are_one_line(tmp_path, capsys):
    cases = [
        (["export", "swin_t", str(tmp_path / "m.onnx")], "no weights given"),
        (["export", "swin_t", str(tmp_path / "m.txt"), "--random-weights"], "must end in .onnx"),
        (["export", "swin_t", str(tmp_path / "missing" / "m.onnx"), "--random-weights"], "does not exist"),
        (["convert", str(tmp_path / "nothing.pth"), str(tmp_path / "out.safetensors")], "nothing.pth"),
        (["info", "swin_q"], "unknown model 'swin_q'"),
        (["flops", "swin_tiny_patch4_window7_224.ms_in1k"], "here an architecture is expected: 'swin_t'"),
    ]
    for argv, expected in cases:
        status = main(argv)
        err = capsys.readouterr().err
        assert status != 0, argv
        assert expected in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (argv, err)


def test_command_error_traceback_on_request(tmp_path, monkeypatch):
    monkeypatch.setenv("SWIN_DEBUG", "1")
    with pytest.raises(FileNotFoundError):
        main(["export", "swin_t", str(tmp_path / "missing" / "m.onnx"), "--random-weights"])


def test_closed_pipe_is_quiet():
    """``swin list | head -1``: the reader goes away; the command stops without a traceback."""
    exe = shutil.which("swin")
    if exe is None:
        pytest.skip("the swin console script is not on PATH (package not installed)")
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody reads: the first write fails with EPIPE
    try:
        result = subprocess.run([exe, "list"], stdout=write_end, stderr=subprocess.PIPE, timeout=60)
    finally:
        os.close(write_end)
    assert b"Traceback" not in result.stderr and b"Exception ignored" not in result.stderr, result.stderr
    assert result.returncode == 0


TINY = """
tiny_err:
  embed_dim: 16
  depths: [1, 1, 1, 1]
  num_heads: [1, 1, 1, 1]
  window_size: 7
  img_size: 224
"""


@pytest.fixture(scope="module")
def error_files(tmp_path_factory):
    """A tiny registered model with its checkpoint, an image, a non-image, a corrupt checkpoint and an
    ImageFolder with one truncated JPEG."""
    from PIL import Image

    from swin.registry import lookup, register_model

    root = tmp_path_factory.mktemp("errors")
    (root / "tiny.yaml").write_text(TINY)
    register_model(root / "tiny.yaml", overwrite=True)
    torch.save(swin.create_model("tiny_err").state_dict(), root / "tiny.pth")
    (root / "corrupt.pth").write_bytes(b"PK\x03\x04garbage")
    Image.new("RGB", (64, 64), (200, 10, 10)).save(root / "img.png")
    (root / "notimg.png").write_text("hello")
    folder = root / "val" / "n01440764"
    folder.mkdir(parents=True)
    Image.new("RGB", (64, 64)).save(folder / "a.jpg")
    (folder / "b.jpg").write_bytes(b"\xff\xd8\xff\xe0 truncated")
    yield root
    lookup._configs.pop("tiny_err")  # the registry is per process: leave it as the other tests expect


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["predict", "{r}/missing.png", "--model", "tiny_err", "--weights", "{r}/tiny.pth"], "no such image file"),
        (["predict", "{r}/val", "--model", "tiny_err", "--weights", "{r}/tiny.pth"], "is a directory"),
        (["predict", "{r}/notimg.png", "--model", "tiny_err", "--weights", "{r}/tiny.pth"], "not an image"),
        (["predict", "{r}/img.png", "--model", "tiny_err", "--weights", "{r}/corrupt.pth"], "corrupt.pth"),
        (["predict", "{r}/img.png", "--model", "swin_t.nope"], "no pretrained tag 'nope'"),
        (["validate", "tiny_err", "--data", "{r}/val", "--weights", "{r}/tiny.pth", "--device", "cuda:7"], "--device"),
        (["validate", "tiny_err", "--data", "{r}/val", "--weights", "{r}/tiny.pth", "--workers", "0"], "b.jpg"),
        (["validate", "tiny_err", "--data", "{r}/val", "--weights", "{r}/tiny.pth", "--workers", "1"], "b.jpg"),
        (["flops", "swin_t", "--plot", "{r}/nodir/p.png"], "does not exist"),
        (["convert", "{r}/tiny.pth", "/nonexistent-dir/x.safetensors"], "does not exist"),
        (["export", "swin_t", "{r}/m.onnx", "--random-weights", "--size-range", "100,200"], "multiples of 32"),
        (["export", "swin_t", "{r}/m.onnx", "--random-weights", "--size-range", "224,224"], "single size"),
        (["bench", "--rounds", "0"], "--rounds must be at least 1"),
    ],
)
def test_every_listed_command_error_is_one_line(error_files, capsys, argv, expected):
    """The cases issue 14 found printing tracebacks: each is one line on stderr and a non-zero exit."""
    argv = [word.format(r=error_files) for word in argv]
    status = main(argv)
    err = capsys.readouterr().err
    assert status != 0, argv
    assert expected in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (argv, err)
