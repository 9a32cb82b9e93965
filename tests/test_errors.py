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


def test_compiled_model_checkpoint_loads():
    state, model = _small_state("_orig_mod.")
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
