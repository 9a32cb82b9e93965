"""``swin export`` options: ``--static`` (ONNX only; one size and one batch), ``--max-batch 1`` and the
contradictory combinations, refused before any weights are read. Exports use a tiny two-stage architecture
(a few seconds each); the eager model is the reference for the exported numerics."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import swin
from swin.export import dynamic_size_range, export_program
from swin.registry import lookup
from swin.tools import export_cmd
from swin.tools.cli import main

ARCH = "export_cmd_tiny"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(architecture name, eager model, checkpoint path): a tiny two-stage classifier registered for this
    module only; one graph serves 64..2048 (see tests/test_export_guard.py)."""
    swin.list_models()  # load the bundled entries before taking the copy
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lookup, "_configs", dict(lookup._configs))
        swin.register_model(name=ARCH, embed_dim=16, depths=(1, 1), num_heads=(1, 2), drop_path_rate=0.0)
        torch.manual_seed(0)
        model = swin.create_model(ARCH, num_classes=10).eval()
        path = tmp_path_factory.mktemp("weights") / "tiny.pth"
        torch.save(model.state_dict(), path)
        yield ARCH, model, path


@pytest.fixture
def no_work(monkeypatch):
    """Fail a test that reads weights or exports: its refusal must come first."""
    for name in ("load_weights", "export_onnx", "export_program"):
        monkeypatch.setattr(export_cmd, name, lambda *a, _name=name, **k: pytest.fail(f"{_name} ran"))


def _refused(args, capsys) -> str:
    status = main(["export", *args])
    err = capsys.readouterr().err
    assert status == 1 and len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.parametrize(
    "options, message",
    [
        (["m.pt2", "--static"], "--static is for ONNX (.onnx) output only"),
        (["m.onnx", "--static", "--size-range", "128,224"], "give the size twice (e.g. --size-range 224,224)"),
        (["m.onnx", "--size-range", "224,224"], "export it with --static"),
        (["m.pt2", "--max-batch", "0"], "--max-batch must be at least 1"),
    ],
)
def test_contradictions_are_refused_before_weights(checkpoint, tmp_path, capsys, no_work, options, message):
    output, *rest = options
    err = _refused([checkpoint[0], str(tmp_path / output), "--weights", "ms_in1k", *rest], capsys)
    assert message in err
    if "--static is" in message:
        assert "--size-range MIN,MAX and --max-batch N" in err  # what to do instead
    assert list(tmp_path.iterdir()) == []


def test_export_program_refuses_a_batch_below_one(checkpoint):
    with pytest.raises(ValueError, match="max_batch must be a whole number of at least 1"):
        export_program(checkpoint[1], max_batch=0)


def test_max_batch_one_program_matches_eager(checkpoint, tmp_path, capsys):
    """``--max-batch 1``: a static batch of 1 (a symbolic dimension needs min < max)."""
    name, model, weights = checkpoint
    path = tmp_path / "m.pt2"
    assert main(["export", name, str(path), "--weights", str(weights), "--max-batch", "1"]) == 0
    assert "batch 1, height and width multiples of 32 in 64..2048" in capsys.readouterr().out
    program = torch.export.load(str(path)).module()
    for size in [(224, 224), (96, 320)]:
        x = torch.randn(1, 3, *size)
        with torch.no_grad():
            expected, got = model(x), program(x)
        assert got.shape == expected.shape == (1, 10)
        assert (got - expected).abs().max().item() <= 1e-5, size
    with pytest.raises(Exception, match=r"size\(\)\[0\] == 1"):  # the program accepts batch 1 only
        program(torch.randn(2, 3, 224, 224))


def test_static_onnx_takes_its_size_and_batch(checkpoint, tmp_path, capsys):
    """``--static --size-range S,S --max-batch N``: the file's one input shape is N x 3 x S x S."""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    name, model, weights = checkpoint
    path = tmp_path / "m.onnx"
    args = [name, str(path), "--weights", str(weights), "--static", "--size-range", "288,288", "--max-batch", "1"]
    assert main(["export", *args]) == 0
    assert "static input 1x3x288x288" in capsys.readouterr().out
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [tuple(i.shape) for i in session.get_inputs()] == [(1, 3, 288, 288)]
    x = torch.randn(1, 3, 288, 288)
    with torch.no_grad():
        expected = model(x).numpy()
    assert abs(session.run(None, {"x": x.numpy()})[0] - expected).max() <= 1e-4
    props = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
    assert (props["size_min"], props["size_max"], props["max_batch"]) == ("288", "288", "1")


def test_readme_states_the_backbone_ranges():
    """The README's backbone ranges are the code's, at both common windows (7 and 12)."""
    readme = " ".join((Path(__file__).parents[2] / "README.md").read_text().split())
    for name, window in [("swin_t", 7), ("swin_b_384", 12)]:
        with torch.device("meta"):
            backbone = swin.create_model(name, features_only=True)
        assert backbone.layers[0].window[0] == window
        low, high = dynamic_size_range(backbone)
        assert f"{low}-{high} at window {window}" in readme


@pytest.fixture
def fake_onnx(monkeypatch):
    """export_onnx replaced by one that records the model and writes a stand-in file (no minutes of tracing)."""
    exported = []

    def export(model, path, *args, **kwargs):
        exported.append((model, kwargs.get("metadata")))
        Path(path).write_bytes(b"onnx")

    monkeypatch.setattr(export_cmd, "export_onnx", export)
    return exported


@pytest.mark.parametrize("output", ["M.ONNX", "m.Onnx", "M.PT2"])
def test_extension_case_does_not_matter(checkpoint, tmp_path, capsys, fake_onnx, output):
    """``M.ONNX`` used to be refused ("must end in .onnx"); ``M.PT2`` must still be a torch.export program."""
    name, _, weights = checkpoint
    path = tmp_path / output
    assert main(["export", name, str(path), "--weights", str(weights), "--max-batch", "1"]) == 0, capsys.readouterr()
    assert f"wrote {path}" in capsys.readouterr().out
    if output.lower().endswith(".pt2"):
        assert not fake_onnx and torch.export.load(str(path)).module()(torch.randn(1, 3, 64, 64)).shape == (1, 10)
    else:
        assert len(fake_onnx) == 1 and path.read_bytes() == b"onnx"


@pytest.mark.parametrize("weights", [[], ["--weights", "ms_in22k"], ["--weights", "swin_t.ms_in22k"]])
def test_a_tag_in_the_name_names_the_weights(tmp_path, capsys, monkeypatch, fake_onnx, weights):
    """``swin export swin_t.ms_in22k`` loads that tag's weights (as create_model(..., pretrained=True) does):
    offline with an empty cache, the error names where that tag's file may be placed."""
    home = tmp_path / "home"
    monkeypatch.setenv("SWIN_HOME", str(home))
    monkeypatch.setenv("SWIN_OFFLINE", "1")
    status = main(["export", "swin_t.ms_in22k", str(tmp_path / "m.onnx"), *weights])
    err = capsys.readouterr().err
    assert status == 1 and err.count("\n") == 1 and "no weights given" not in err, err
    assert "swin_t.ms_in22k is not in the cache" in err and str(home / "weights" / "swin_t.ms_in22k") in err
    assert not fake_onnx and not (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize("weights", ["ms_in1k", "swin_t.ms_in1k", "elsewhere.pth"])
def test_a_tag_and_other_weights_are_refused(tmp_path, capsys, no_work, weights):
    err = _refused(["swin_t.ms_in22k", str(tmp_path / "m.onnx"), "--weights", weights], capsys)
    assert f"swin_t.ms_in22k and --weights {weights} name two different weights" in err
    assert list(tmp_path.iterdir()) == []


def test_random_weights_with_a_tag_take_its_head(tmp_path, capsys, fake_onnx):
    """--random-weights with ``swin_t.ms_in22k``: random weights in the tag's shape (a 21841-class head), as
    create_model("swin_t.ms_in22k") builds; said in the output, where it used to pass without a word."""
    path = tmp_path / "m.onnx"
    assert (
        main(["export", "swin_t.ms_in22k", str(path), "--random-weights", "--static", "--size-range", "224,224"]) == 0
    )
    out = capsys.readouterr().out
    ((model, metadata),) = fake_onnx
    assert model.num_classes == 21841 and metadata["num_classes"] == 21841 and metadata["weights"] == "random"
    assert "RANDOM weights (--random-weights) with the head of swin_t.ms_in22k (21841 classes)" in out
