"""``swin convert`` writes only a complete Swin checkpoint, only to a regular file it may replace, atomically,
never over its input; everything that can be refused without reading tensors is refused first."""

from __future__ import annotations

import os
import stat

import pytest
import torch

from swin.atomic import UnsafeOutputError, atomic_output, check_output
from swin.tools import convert_cmd
from swin.tools.cli import main


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A small timm-layout Swin (safetensors and torch.save) and a ResNet-18 checkpoint."""
    import timm
    import torchvision
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("checkpoints")
    torch.manual_seed(0)
    model = timm.create_model(
        "swin_tiny_patch4_window7_224", depths=(1, 1, 1, 1), embed_dim=32, num_heads=(1, 2, 4, 8), num_classes=10
    )
    save_file(model.state_dict(), folder / "timm.safetensors")
    torch.save(model.state_dict(), folder / "timm.pth")
    torch.save(torchvision.models.resnet18().state_dict(), folder / "resnet18.pth")
    return folder


def run(argv, capsys) -> tuple[int, str]:
    status = main(["convert", *map(str, argv)])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    if status:
        assert len(err.strip().splitlines()) == 1, err
    return status, err


def leftovers(folder) -> list[str]:
    return [name for name in os.listdir(folder) if ".partial" in name]


def test_writes_a_regular_file_with_the_umask_mode(checkpoints, tmp_path, capsys):
    previous = os.umask(0o022)
    try:
        assert run([checkpoints / "timm.safetensors", tmp_path / "ours.safetensors"], capsys)[0] == 0
        os.umask(0o077)
        assert run([checkpoints / "timm.safetensors", tmp_path / "private.pth"], capsys)[0] == 0
    finally:
        os.umask(previous)
    assert stat.S_IMODE(os.stat(tmp_path / "ours.safetensors").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(tmp_path / "private.pth").st_mode) == 0o600
    assert leftovers(tmp_path) == []


def test_replacing_a_file_keeps_its_mode(checkpoints, tmp_path, capsys):
    target = tmp_path / "out.pth"
    target.write_bytes(b"old")
    target.chmod(0o640)
    assert run([checkpoints / "timm.pth", target], capsys)[0] == 0
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert "head.weight" in torch.load(target, weights_only=True)


@pytest.mark.parametrize("how", ["same name", "another spelling", "hard link"])
def test_refuses_to_overwrite_its_input(checkpoints, tmp_path, capsys, monkeypatch, how):
    source = tmp_path / "x.safetensors"
    source.write_bytes((checkpoints / "timm.safetensors").read_bytes())
    before = source.read_bytes()
    output = source
    if how == "another spelling":
        monkeypatch.chdir(tmp_path)
        output = "./sub/../x.safetensors"
        (tmp_path / "sub").mkdir()
    elif how == "hard link":
        output = tmp_path / "x.pth"
        os.link(source, output)
    status, err = run([source, output], capsys)
    assert status == 1 and "would overwrite the input while reading it" in err and "choose another output name" in err
    assert source.read_bytes() == before


def test_same_name_with_contradicting_format_is_refused(checkpoints, tmp_path, capsys):
    source = tmp_path / "x.safetensors"
    source.write_bytes((checkpoints / "timm.safetensors").read_bytes())
    status, err = run([source, source, "--format", "torch"], capsys)
    assert status == 1 and "--format torch contradicts" in err
    assert source.read_bytes() == (checkpoints / "timm.safetensors").read_bytes()


def test_never_writes_through_a_symlink(checkpoints, tmp_path, capsys):
    victim = tmp_path / "victim.pth"
    victim.write_bytes(b"precious")
    (tmp_path / "link.pth").symlink_to(victim)
    status, err = run([checkpoints / "timm.pth", tmp_path / "link.pth"], capsys)
    assert status == 1 and "is a symbolic link" in err and "never through links" in err
    assert victim.read_bytes() == b"precious" and (tmp_path / "link.pth").is_symlink()


def test_refuses_fifo_directory_and_device(checkpoints, tmp_path, capsys):
    os.mkfifo(tmp_path / "pipe.pth")
    status, err = run([checkpoints / "timm.pth", tmp_path / "pipe.pth"], capsys)
    assert status == 1 and "is a FIFO" in err
    (tmp_path / "folder.pth").mkdir()
    status, err = run([checkpoints / "timm.pth", tmp_path / "folder.pth"], capsys)
    assert status == 1 and "is a directory" in err
    with pytest.raises(UnsafeOutputError, match="character device"):
        check_output(os.devnull)
    assert leftovers(tmp_path) == []


def test_output_checks_come_before_reading(checkpoints, tmp_path, capsys, monkeypatch):
    def no_reading(path):
        raise AssertionError(f"read {path} before checking the output")

    monkeypatch.setattr(convert_cmd.safe_load, "load_file", no_reading)
    cases = [
        (tmp_path / "model.onnx", "swin export"),
        (tmp_path / "model.txt", ".safetensors, .pt, .pth, .bin"),
        (tmp_path / "missing" / "out.pth", "does not exist"),
    ]
    for output, expected in cases:
        status, err = run([checkpoints / "timm.pth", output], capsys)
        assert status == 1 and expected in err, err
    status, err = run([checkpoints / "timm.pth", tmp_path / "x.pth", "--format", "safetensors"], capsys)
    assert status == 1 and "contradicts" in err
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        status, err = run([checkpoints / "timm.pth", locked / "out.pth"], capsys)
        assert status == 1 and "not writable" in err


def test_refuses_what_is_not_a_swin_checkpoint(checkpoints, tmp_path, capsys):
    status, err = run([checkpoints / "resnet18.pth", tmp_path / "r.safetensors"], capsys)
    assert status == 1 and "not a Swin checkpoint" in err
    assert not (tmp_path / "r.safetensors").exists() and leftovers(tmp_path) == []


def test_from_must_match_the_keys(checkpoints, tmp_path, capsys):
    status, err = run([checkpoints / "timm.pth", tmp_path / "x.safetensors", "--from", "torchvision"], capsys)
    assert status == 1 and "looks like a timm checkpoint, not torchvision" in err
    status, err = run([checkpoints / "resnet18.pth", tmp_path / "x.safetensors", "--from", "torchvision"], capsys)
    assert status == 1 and "not a torchvision checkpoint" in err
    assert run([checkpoints / "timm.pth", tmp_path / "x.safetensors", "--from", "timm"], capsys)[0] == 0


def test_incomplete_or_non_finite_checkpoint_is_refused(checkpoints, tmp_path, capsys):
    state = torch.load(checkpoints / "timm.pth", weights_only=True)
    broken = {k: v for k, v in state.items() if not k.startswith("layers.1.blocks.0.mlp.")}
    torch.save(broken, tmp_path / "incomplete.pth")
    status, err = run([tmp_path / "incomplete.pth", tmp_path / "out.pth"], capsys)
    assert status == 1 and "incomplete Swin checkpoint" in err
    state["head.fc.weight"][0, 0] = float("nan")
    torch.save(state, tmp_path / "nan.pth")
    status, err = run([tmp_path / "nan.pth", tmp_path / "out.pth"], capsys)
    assert status == 1 and "non-finite" in err
    assert not (tmp_path / "out.pth").exists()


def test_interrupted_write_leaves_the_old_output_and_no_temporary(checkpoints, tmp_path, capsys, monkeypatch):
    target = tmp_path / "out.safetensors"
    target.write_bytes(b"previous output")

    def interrupted(state, path, fmt, layout):
        with open(path, "wb") as handle:
            handle.write(b"half a checkpoint")
        raise KeyboardInterrupt

    monkeypatch.setattr(convert_cmd, "_write", interrupted)
    assert main(["convert", str(checkpoints / "timm.pth"), str(target)]) == 130
    assert target.read_bytes() == b"previous output" and leftovers(tmp_path) == []


def test_atomic_output_removes_the_temporary_on_error(tmp_path):
    with pytest.raises(RuntimeError), atomic_output(tmp_path / "a.bin") as temporary:
        assert os.path.dirname(temporary) == str(tmp_path) and temporary.endswith(".bin")
        with open(temporary, "wb") as handle:
            handle.write(b"partial")
        raise RuntimeError("writer failed")
    assert os.listdir(tmp_path) == []
    with atomic_output(tmp_path / "a.bin") as temporary, open(temporary, "wb") as handle:
        handle.write(b"complete")
    assert os.listdir(tmp_path) == ["a.bin"] and (tmp_path / "a.bin").read_bytes() == b"complete"


@pytest.fixture(scope="module")
def training(checkpoints):
    """A training checkpoint {"model": trained, "model_ema": moving average}, as the official code saves one
    with EMA: two timm models of different seeds (timm layout), and the path."""
    import timm

    states = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        model = timm.create_model(
            "swin_tiny_patch4_window7_224", depths=(1, 1, 1, 1), embed_dim=32, num_heads=(1, 2, 4, 8), num_classes=10
        )
        states.append(model.state_dict())
    trained, ema = states
    torch.save({"model": trained, "model_ema": ema, "epoch": 3}, checkpoints / "train.pth")
    return trained, ema, checkpoints / "train.pth"


def _same_weights(written: dict, expected: dict) -> bool:
    """Every tensor written equal to the one of that name in ``expected`` (timm's derived buffers aside)."""
    return set(written) <= set(expected) and all(torch.equal(written[k], expected[k]) for k in written)


@pytest.mark.parametrize("no_ema", [False, True])
def test_a_training_checkpoint_says_which_weights_it_took(training, tmp_path, capsys, no_ema):
    """EMA weights first, as timm reads them, and said so with the way to the others; --no-ema the trained."""
    from safetensors.torch import load_file

    trained, ema, source = training
    output = tmp_path / "out.safetensors"
    status = main(["convert", str(source), str(output), "--to", "timm", *(["--no-ema"] if no_ema else [])])
    out = capsys.readouterr().out
    assert status == 0
    written = load_file(output)
    assert len(written) > 10 and not torch.equal(trained["head.fc.weight"], ema["head.fc.weight"])
    if no_ema:
        assert _same_weights(written, trained) and not _same_weights(written, ema)
        assert f"{source} (timm layout, its weights model, not the EMA model_ema) -> {output}" in out, out
    else:
        assert _same_weights(written, ema) and not _same_weights(written, trained)
        assert f"{source} (timm layout, its EMA weights model_ema; --no-ema for model) -> {output}" in out, out


def test_no_ema_on_a_checkpoint_of_ema_weights_only(training, tmp_path, capsys):
    _, ema, _ = training
    torch.save({"model_ema": ema}, tmp_path / "ema.pth")
    status, err = run([tmp_path / "ema.pth", tmp_path / "out.pth", "--no-ema"], capsys)
    assert status == 1 and "holds only EMA weights" in err and "drop --no-ema" in err, err
    assert "use_ema" not in err  # the Python API's spelling, not the command's
    assert main(["convert", str(tmp_path / "ema.pth"), str(tmp_path / "out.pth")]) == 0
    assert "ema.pth (timm layout) ->" in capsys.readouterr().out  # one set of weights: nothing to choose


@pytest.mark.parametrize(
    ("left_out", "named"),
    [
        ("layers.3.", "the stage(s) after stage 2 (the final norm has 256 channels, the last stage here 128)"),
        ("layers.3.blocks.", "stage 3 (layers.3.*, which layers.2.downsample merges into)"),
        ("layers.2.downsample.", "layers.1.downsample.* (the patch merging into stage 2)"),  # timm: next stage's
        ("norm.", "norm.weight (the final norm before the classifier head)"),
    ],
)
def test_a_checkpoint_missing_a_whole_part_is_refused(checkpoints, tmp_path, capsys, left_out, named):
    """A last stage, a patch merging or the final norm left out (timm's keys) made a file every loader refused
    later ('9 trunk key(s) differ'); convert promises a complete Swin checkpoint."""
    state = torch.load(checkpoints / "timm.pth", weights_only=True)
    torch.save({k: v for k, v in state.items() if not k.startswith(left_out)}, tmp_path / "part.pth")
    status, err = run([tmp_path / "part.pth", tmp_path / "out.pth"], capsys)
    assert status == 1 and "incomplete Swin checkpoint" in err and named in err
    assert not (tmp_path / "out.pth").exists()


def test_a_detector_converted_to_timm_names_the_keys_timm_has_no_place_for(tmp_path, capsys):
    """The neck, heads and per-stage norms of a detector are kept as they are; timm's strict load refuses them,
    which the command now says (it wrote the file without a word)."""
    import timm

    import swin

    backbone = swin.create_model("swin_t", features_only=True)
    detector = {f"backbone.{k}": v for k, v in backbone.state_dict().items()} | {"neck.conv.weight": torch.zeros(1)}
    source, target = tmp_path / "det.pth", tmp_path / "timm.pth"
    torch.save({"state_dict": detector, "meta": {}}, source)
    assert main(["convert", str(source), str(target), "--to", "timm"]) == 0
    err = capsys.readouterr().err
    assert "9 key(s) are a detector's" in err and "neck.*" in err and "norm3.*" in err and "strict=False" in err
    unexpected = timm.create_model("swin_tiny_patch4_window7_224").load_state_dict(torch.load(target), strict=False)
    assert sorted(unexpected.unexpected_keys) == sorted(
        [f"norm{i}.{p}" for i in range(4) for p in ("weight", "bias")] + ["neck.conv.weight"]
    )
