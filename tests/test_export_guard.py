"""An exported ONNX graph computes correctly at every size it accepts and refuses every other size when run:
traced Swin graphs are silently wrong outside their size range (measured on swin_t: 0.041 max logit error at
256, 0.20 at 64, top-1 changed). The file carries its range and its weights' preprocessing as metadata, and a
range wider than one graph serves is refused before any tracing.

One export for the whole module (tracing takes most of a minute on two cores), through the command line.
"""

from __future__ import annotations

import os
import stat

import pytest
import torch

import swin
from swin.export import check_size_range, valid_size_ranges
from swin.registry import lookup
from swin.tools.cli import main

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

ARCH = "export_guard_tiny"
RULE = "multiples of 32 in 128..224"


@pytest.fixture(scope="module")
def tiny_arch():
    """A tiny architecture (swin_t's windows and img_size, so the same 128..224 range), registered for this
    module only."""
    swin.list_models()  # load the bundled entries before taking the copy
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lookup, "_configs", dict(lookup._configs))
        swin.register_model(name=ARCH, embed_dim=16, depths=(1, 1, 1, 1), num_heads=(1, 2, 4, 8), drop_path_rate=0.0)
        yield ARCH


@pytest.fixture(scope="module")
def exported(tiny_arch, tmp_path_factory):
    """(eager model, ONNX path): a 10-class checkpoint file exported by ``swin export``."""
    folder = tmp_path_factory.mktemp("export")
    torch.manual_seed(0)
    model = swin.create_model(tiny_arch, num_classes=10).eval()
    torch.save(model.state_dict(), folder / "tiny.pth")
    path = folder / "tiny.onnx"
    previous = os.umask(0o022)
    try:
        status = main(["export", tiny_arch, str(path), "--weights", str(folder / "tiny.pth"), "--max-batch", "4"])
    finally:
        os.umask(previous)
    assert status == 0
    return model, path


@pytest.fixture(scope="module")
def session(exported):
    options = ort.SessionOptions()
    options.log_severity_level = 4  # the refusals below are expected; keep ONNX Runtime's own log quiet
    return ort.InferenceSession(str(exported[1]), options, providers=["CPUExecutionProvider"])


def test_every_accepted_size_matches_eager(exported, session):
    model, path = exported
    assert {node.domain for node in onnx.load(path).graph.node} <= {"", "ai.onnx"}, "custom ops in the graph"
    for batch, (height, width) in enumerate([(128, 128), (160, 160), (192, 192), (224, 224), (128, 224), (224, 160)]):
        x = torch.randn(1 + batch % 4, 3, height, width)  # batch 1..4 (the file's max_batch)
        with torch.no_grad():
            expected = model(x).numpy()
        (got,) = session.run(None, {"x": x.numpy()})
        assert got.shape == expected.shape and abs(got - expected).max() <= 1e-4, (height, width)


@pytest.mark.parametrize("size", [(96, 160), (256, 224), (64, 64), (2048, 2048), (200, 224), (224, 230)])
def test_other_sizes_are_refused_when_run(session, size):
    with pytest.raises(Exception, match="size_guard") as info:
        session.run(None, {"x": torch.randn(1, 3, *size).numpy()})
    assert RULE in str(info.value)


def test_metadata_carries_range_and_preprocessing(exported):
    props = {p.key: p.value for p in onnx.load(str(exported[1]), load_external_data=False).metadata_props}
    assert (props["size_min"], props["size_max"], props["size_multiple"]) == ("128", "224", "32")
    assert RULE in props["valid_sizes"]
    assert props["model"] == ARCH and props["weights"] == "tiny.pth" and props["num_classes"] == "10"
    # a timm/official-layout file of an architecture without published weights: Swin's evaluation recipe
    assert props["crop_pct"] == "0.9" and props["interpolation"] == "bicubic"
    assert props["mean"] == "[0.485, 0.456, 0.406]" and props["std"] == "[0.229, 0.224, 0.225]"
    assert props["input_size"] == "[3, 224, 224]"


def test_written_atomically_with_a_normal_mode(exported):
    path = exported[1]
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert not [name for name in os.listdir(path.parent) if ".partial" in name]


def test_too_wide_size_range_is_refused_up_front(tiny_arch, tmp_path, capsys, monkeypatch):
    from swin.tools import export_cmd

    monkeypatch.setattr(export_cmd, "export_onnx", lambda *a, **k: pytest.fail("exported a refused range"))
    monkeypatch.setattr(export_cmd, "load_weights", lambda *a, **k: pytest.fail("read weights for a refused range"))
    status = main(["export", tiny_arch, str(tmp_path / "m.onnx"), "--random-weights", "--size-range", "128,512"])
    err = capsys.readouterr().err
    assert status == 1 and len(err.strip().splitlines()) == 1
    assert "128..512" in err and "widest valid range is 128..224" in err and "256..2048" in err
    assert os.listdir(tmp_path) == []


def test_size_range_checks():
    model = swin.create_model("swin_t")
    assert valid_size_ranges(model) == [(32, 32), (64, 96), (128, 224), (256, 2048)]
    assert check_size_range(model, None) == (128, 224)
    assert check_size_range(model, (256, 512)) == (256, 512)  # one graph serves it: every stage has windows
    assert check_size_range(model, (160, 192)) == (160, 192)
    for bad, message in [((128, 512), "widest valid range is 128..224"), ((100, 224), "multiples of 32")]:
        with pytest.raises(ValueError, match=message):
            check_size_range(model, bad)
    with pytest.raises(ValueError, match="widest valid range is 256..2048"):
        check_size_range(swin.create_model("swin_t", features_only=True), (128, 512))


def test_ranges_of_models_with_fewer_stages():
    """A two-stage model's maps are those of swin_t's first two stages (56 and 28 at 224): stage 2 fits in
    one window (7) only at 32 (a 4x4 map), so one graph serves 64..2048. Every range keeps each block's shift
    the same at both ends (the shift is what a traced graph cannot change)."""
    model = swin.create_model("swin_t", depths=(2, 2), num_heads=(1, 2), embed_dim=16)
    assert valid_size_ranges(model) == [(32, 32), (64, 2048)]
    sides = {}
    hooks = [
        s.register_forward_pre_hook(lambda m, a, i=i: sides.__setitem__(i, a[0].shape[1:3]))
        for i, s in enumerate(model.layers)
    ]

    def shifts(size):
        with torch.no_grad():
            model(torch.zeros(1, 3, size, size))
        return [b.shift_for(*sides[i]) for i, stage in enumerate(model.layers) for b in stage.blocks]

    for low, high in valid_size_ranges(model)[:2]:
        assert shifts(low) == shifts(high), (low, high)
    for hook in hooks:
        hook.remove()


def test_output_refusals_come_before_tracing(tiny_arch, tmp_path, capsys):
    (tmp_path / "target.onnx").write_bytes(b"keep")
    (tmp_path / "link.onnx").symlink_to(tmp_path / "target.onnx")
    status = main(["export", tiny_arch, str(tmp_path / "link.onnx"), "--random-weights"])
    assert status == 1 and "symbolic link" in capsys.readouterr().err
    assert (tmp_path / "target.onnx").read_bytes() == b"keep"
