"""``swin export`` options: ``--static`` (ONNX only; one size and one batch), ``--max-batch 1`` and the
contradictory combinations, refused before any weights are read; a model built for a rectangle gets a range
per axis (``--size-range HMIN,HMAX:WMIN,WMAX``). Exports use tiny architectures (a few seconds each); the eager
model is the reference for the exported numerics."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import swin
from swin.export import dynamic_size_range, export_program
from swin.registry import lookup
from swin.tools import export_cmd
from swin.tools.cli import main
from tests.conftest import transformers_classifier_folder

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
    out, err = capsys.readouterr()
    assert "static input 1x3x288x288" in out
    # the exporter's own progress lines and attribute warnings are not the command's output (a dozen lines)
    assert "[torch.onnx]" not in out + err and "ambiguous" not in out + err
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


# The two models of the review, tiny (one block a stage): built for a rectangle, each axis has its own range.
# By hand, at 32k pixels the stages' maps are 8k, 4k, 2k and k along each axis, and a stage changes behaviour
# where its map outgrows its window (swin.export.valid_size_ranges); the default range of an axis is the one
# around its side of img_size (k = 7 for 224, k = 5 for 160).
# export_cmd_wide: img_size 224x160, window 7, so the last stage's window is 7x5 (its map at 160 is 5 wide).
#   Heights change at k = 2, 4 (2k > 7), 8 (k > 7): 128..224. Widths at k = 2, 4, 6 (k > 5): 128..160.
# export_cmd_rect: window 8x6 at 224 (the last stage's map, 7 high, clips the height to 7).
#   Heights change at k = 2 (8k > 8), 3 (4k > 8), 5 (2k > 8), 8 (k > 7): 160..224.
#   Widths at k = 2 (4k > 6), 4 (2k > 6), 7 (k > 6): 224..2048.
RECTANGLES = """
export_cmd_wide:
  embed_dim: 16
  depths: [1, 1, 1, 1]
  num_heads: [1, 1, 1, 1]
  window_size: 7
  img_size: [224, 160]
export_cmd_rect:
  embed_dim: 16
  depths: [1, 1, 1, 1]
  num_heads: [1, 1, 1, 1]
  window_size: [8, 6]
  img_size: 224
"""


@pytest.fixture
def rectangles(tmp_path, monkeypatch):
    """The --models-file of the two rectangular models, registered here too (for the eager reference) in a
    copy of the registry that the test's end throws away."""
    swin.list_models()  # load the bundled entries before taking the copy
    monkeypatch.setattr(lookup, "_configs", dict(lookup._configs))
    monkeypatch.setattr(lookup, "_aliases", dict(lookup._aliases))
    path = tmp_path / "rectangles.yaml"
    path.write_text(RECTANGLES)
    swin.register_model(path)
    return path


def test_a_rectangle_gets_a_range_per_axis(rectangles, tmp_path, capsys):
    """export_cmd_wide used to get one range for both sides, 128..160, and its file refused its own 224x160."""
    torch.manual_seed(0)
    model = swin.create_model("export_cmd_wide", num_classes=10).eval()
    torch.save(model.state_dict(), tmp_path / "wide.pth")
    path = tmp_path / "m.pt2"
    argv = ["--models-file", str(rectangles), "export", "export_cmd_wide", str(path), "--max-batch", "1"]
    assert main([*argv, "--weights", str(tmp_path / "wide.pth")]) == 0
    out = capsys.readouterr().out
    assert "batch 1, height and width multiples of 32, height in 128..224 and width in 128..160" in out, out
    program = torch.export.load(str(path)).module()
    for size in [(224, 160), (128, 128), (192, 160), (224, 128)]:  # both ends of both ranges
        x = torch.randn(1, 3, *size)
        with torch.no_grad():
            expected, got = model(x), program(x)
        assert (got - expected).abs().max().item() <= 1e-5, size
    for size, guard in [((224, 192), r"size\(\)\[3\] <= 160"), ((256, 160), r"size\(\)\[2\] <= 224")]:
        with pytest.raises(Exception, match=guard):  # a width, then a height, beyond its range
            program(torch.randn(1, 3, *size))


def test_window_not_square_gets_a_range_per_axis(rectangles, tmp_path, capsys, fake_onnx):
    """export_cmd_rect used to get 224..224: the one size valid for both its heights and its widths."""
    path = tmp_path / "m.onnx"
    assert main(["--models-file", str(rectangles), "export", "export_cmd_rect", str(path), "--random-weights"]) == 0
    out = capsys.readouterr().out
    assert "batch 1..64, height and width multiples of 32, height in 160..224 and width in 224..2048" in out, out


def test_static_per_axis_size_is_a_rectangle(rectangles, tmp_path, capsys):
    """``--static --size-range H,H:W,W``: the file's one input shape is 1 x 3 x H x W."""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    torch.manual_seed(0)
    model = swin.create_model("export_cmd_wide", num_classes=10).eval()
    torch.save(model.state_dict(), tmp_path / "wide.pth")
    path = tmp_path / "m.onnx"
    args = ["export_cmd_wide", str(path), "--weights", str(tmp_path / "wide.pth"), "--max-batch", "1", "--static"]
    assert main(["--models-file", str(rectangles), "export", *args, "--size-range", "224,224:160,160"]) == 0
    assert "static input 1x3x224x160" in capsys.readouterr().out
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [tuple(i.shape) for i in session.get_inputs()] == [(1, 3, 224, 160)]
    x = torch.randn(1, 3, 224, 160)
    with torch.no_grad():
        expected = model(x).numpy()
    assert abs(session.run(None, {"x": x.numpy()})[0] - expected).max() <= 1e-4
    props = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
    ranges = [props[f"{axis}_{end}"] for axis in ("height", "width") for end in ("min", "max")]
    assert ranges == ["224", "224", "160", "160"] and "size_min" not in props


WIDE, RECT = "export_cmd_wide", "export_cmd_rect"
SYNTAX = "--size-range takes MIN,MAX or HMIN,HMAX:WMIN,WMAX"


@pytest.mark.parametrize(
    "name, options, message",
    [
        (WIDE, ["128,224:128"], SYNTAX),
        (WIDE, ["128,224:128,160:1,2"], SYNTAX),
        (WIDE, ["224,224:128,160", "--static"], "give each side its size twice (e.g. --size-range 224,224:160,160)"),
        (WIDE, ["224,224:160,160"], "--size-range 224,224:160,160 is a single size; export it with --static"),
        (WIDE, ["128,224:128,224"], "width range 128..224 is wider than one exported graph"),
        # one range for both sides: the hint is the command's syntax (not Python's) with the model's default
        (WIDE, ["128,224"], "--size-range HMIN,HMAX:WMIN,WMAX (its default: 128,224:128,160)"),
        (RECT, ["160,224:160,224"], "width range 160..224 is wider than one exported graph"),
    ],
)
def test_per_axis_ranges_are_checked_before_weights(rectangles, tmp_path, capsys, no_work, name, options, message):
    argv = [name, str(tmp_path / "m.onnx"), "--weights", "ms_in1k", "--size-range", *options]
    status = main(["--models-file", str(rectangles), "export", *argv])
    err = capsys.readouterr().err
    assert status == 1 and len(err.strip().splitlines()) == 1, err
    assert message in err, err
    assert "((min, max), (min, max))" not in err  # the Python API's spelling, not the command's
    assert list(tmp_path.iterdir()) == [rectangles]


def test_help_documents_the_per_axis_syntax(capsys):
    with pytest.raises(SystemExit):
        main(["export", "--help"])
    assert "HMIN,HMAX:WMIN,WMAX" in " ".join(capsys.readouterr().out.split())


def test_weights_of_another_window_are_refused(checkpoint, tmp_path, capsys):
    """As predict and validate refuse them (the export resized the bias tables and wrote a file naming the
    weights and their preprocessing as if it were the trained model)."""
    arch, _, _ = checkpoint
    torch.manual_seed(0)
    torch.save(swin.create_model(arch, num_classes=10, window_size=14).state_dict(), tmp_path / "w14.pth")
    err = _refused([arch, str(tmp_path / "m.pt2"), "--weights", str(tmp_path / "w14.pth")], capsys)
    assert f"has window 14 (27x27 bias table) at stage 1 but {arch} has window 7" in err
    assert not (tmp_path / "m.pt2").exists()


SMALL_DIMS = {"embed_dim": 32, "depths": (2, 2, 2, 2), "num_heads": (1, 2, 4, 8)}


def test_a_transformers_folder_exports_with_its_weights_and_preprocessing(tmp_path, capsys):
    """``swin export local-dir:FOLDER`` (or hf-hub:) of a transformers repository: the file computes transformers'
    logits (onnxruntime against transformers' own model) and carries the folder's preprocessing."""

    import numpy as np

    ort = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    theirs = transformers_classifier_folder(tmp_path / "model", ["cat", "dog", "cow"])
    out = tmp_path / "model.onnx"
    name = f"local-dir:{tmp_path / 'model'}"
    assert main(["export", name, str(out), "--static", "--max-batch", "2", "--size-range", "224,224"]) == 0
    assert "its own weights" in capsys.readouterr().out
    x = np.random.default_rng(0).standard_normal((2, 3, 224, 224)).astype(np.float32)
    session = ort.InferenceSession(str(out))
    with torch.no_grad():
        expected = theirs(torch.from_numpy(x)).logits.numpy()
    np.testing.assert_allclose(session.run(None, {session.get_inputs()[0].name: x})[0], expected, atol=1e-4)
    metadata = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
    assert (metadata["model"], metadata["crop_mode"], metadata["mean"]) == (name, "squash", "[0.5, 0.5, 0.5]")
    assert main(["export", name, str(tmp_path / "again.onnx"), "--weights", "ms_in1k"]) != 0
    assert "names its own weights" in capsys.readouterr().err
    # a headless model (transformers' SwinModel) is no classifier: its pooled features are no logits
    swin.save_for_transformers(swin.create_model("swin_t", num_classes=0, **SMALL_DIMS), tmp_path / "trunk")
    assert main(["export", f"local-dir:{tmp_path / 'trunk'}", str(tmp_path / "trunk.onnx")]) != 0
    assert (
        "without a classifier head: it cannot classify (export its backbone with swin export NAME OUT --features-only"
        in (capsys.readouterr().err)
    )
    assert not (tmp_path / "trunk.onnx").exists()
