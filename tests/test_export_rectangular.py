"""A model built for a rectangular size has windows that are not square (``img_size=(224, 160)``: the last
stage's map there is 7x5, so its window is 7x5), and a traced graph changes behaviour at another width than
height: at width 192 that stage's map (6 wide) is wider than its window and its shifted block starts shifting
along the width, at height 192 it does not. So an exported file serves one range per axis, heights 128..224
and widths 128..160 here, and refuses widths outside its range (measured before per-axis ranges: 0.03-0.04
max logit error at (160, 224), (224, 224) and (192, 192), all accepted). Expected values: the eager model.

One export of each kind for the module (tracing takes tens of seconds on two cores).
"""

from __future__ import annotations

import json

import pytest
import torch

import swin
from swin.export import check_size_range, export_onnx, export_program, valid_size_ranges

HEIGHTS = (128, 224)
WIDTHS = (128, 160)
INSIDE = [(224, 160), (128, 128), (192, 160), (160, 128)]  # both ends of both axes' ranges
OUTSIDE_WIDTH = [(160, 224), (224, 192)]  # heights inside their range, widths beyond 160


def rectangular() -> swin.SwinTransformer:
    """Narrow, one block per stage but two in the last (a regular and a shifted one), and position biases
    drawn with std 1 (at their initial 0.02 a wrong shift hardly shows in the logits)."""
    torch.manual_seed(0)
    model = swin.create_model(
        "swin_t", img_size=(224, 160), depths=(1, 1, 1, 2), embed_dim=16, num_heads=(1, 2, 4, 8)
    ).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("relative_position_bias_table"):
                parameter.normal_()
    return model


@pytest.fixture(scope="module")
def model():
    return rectangular()


def test_ranges_are_per_axis(model):
    """By hand: at 32k pixels the stages' maps are 8k, 4k, 2k and k on each axis; a stage changes behaviour
    where its map outgrows its window, 7 everywhere but the last stage's width, 5."""
    from swin.export import check_size_ranges

    assert [stage.window for stage in model.layers] == [(7, 7), (7, 7), (7, 7), (7, 5)]
    assert valid_size_ranges(model, axis=0) == [(32, 32), (64, 96), (128, 224), (256, 2048)]
    assert valid_size_ranges(model, axis=1) == [(32, 32), (64, 96), (128, 160), (192, 2048)]
    # one range for both sides is valid on both: the finer of the two partitions
    assert valid_size_ranges(model) == [(32, 32), (64, 96), (128, 160), (192, 224), (256, 2048)]
    assert check_size_ranges(model, None) == (HEIGHTS, WIDTHS)  # around each axis' own img_size
    assert check_size_ranges(model, (128, 160)) == ((128, 160), (128, 160))
    assert check_size_ranges(model, ((256, 512), (192, 320))) == ((256, 512), (192, 320))
    with pytest.raises(ValueError, match=r"size range 128\.\.224 .*widest valid range is 128\.\.160"):
        check_size_range(model, (128, 224))
    with pytest.raises(ValueError, match=r"width range 128\.\.224 .*widest valid width range is 128\.\.160"):
        check_size_ranges(model, ((128, 224), (128, 224)))
    with pytest.raises(ValueError, match=r"height range 100\.\.224: .*multiples of 32"):
        check_size_ranges(model, ((100, 224), (128, 160)))


def test_a_backbone_range_reads_each_stage_s_window():
    """Detection semantics, windows 12, 12, 12, 7 per stage: by hand, the maps at 32k pixels are 8k, 4k, 2k and k,
    all larger than their windows from k = 8 (stage 4: 8 > 7; stage 3: 16 > 12) on; the range started at
    416 = (12 + 1) * 32, as if stage 4 had the largest window."""
    backbone = swin.create_model(
        "swin_t",
        features_only=True,
        depths=(1, 1, 1, 1),
        embed_dim=16,
        num_heads=(1, 2, 4, 8),
        window_size=[12, 12, 12, 7],
    )
    assert valid_size_ranges(backbone) == [(256, 2048)]
    assert check_size_range(backbone, (256, 512)) == (256, 512)


def test_onnx_matches_eager_in_both_ranges_and_refuses_other_widths(model, tmp_path):
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    path = export_onnx(model, tmp_path / "rectangular.onnx", max_batch=1)
    options = ort.SessionOptions()
    options.log_severity_level = 4  # the refusals below are expected; keep ONNX Runtime's own log quiet
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    for size in INSIDE:
        x = torch.randn(1, 3, *size)
        with torch.no_grad():
            expected = model(x).numpy()
        (got,) = session.run(None, {"x": x.numpy()})
        assert got.shape == expected.shape and abs(got - expected).max() <= 1e-4, size
    for size in OUTSIDE_WIDTH:
        with pytest.raises(Exception, match="size_guard") as info:
            session.run(None, {"x": torch.randn(1, 3, *size).numpy()})
        assert "height in 128..224 and width in 128..160" in str(info.value), size
    props = {p.key: p.value for p in onnx.load(path, load_external_data=False).metadata_props}
    assert [props[f"{axis}_{end}"] for axis in ("height", "width") for end in ("min", "max")] == [
        "128",
        "224",
        "128",
        "160",
    ]
    assert "size_min" not in props and "size_max" not in props  # no one range serves both axes
    # export_onnx(model, path) writes the model's preprocessing, as timm resolves it (it wrote only the range)
    import timm

    expected = timm.data.resolve_model_data_config(model)
    assert json.loads(props["input_size"]) == list(expected["input_size"])
    assert json.loads(props["mean"]) == list(expected["mean"]) and json.loads(props["std"]) == list(expected["std"])
    assert float(props["crop_pct"]) == expected["crop_pct"] and props["interpolation"] == expected["interpolation"]


def test_program_matches_eager_in_both_ranges_and_refuses_other_widths(model):
    program = export_program(model, max_batch=1).module()
    for size in INSIDE[:2]:
        x = torch.randn(1, 3, *size)
        with torch.no_grad():
            assert (program(x) - model(x)).abs().max().item() <= 1e-4, size
    # the program's guard on the input's width names its largest width (it said 128..224 and then failed
    # inside the graph, at x.size()[3] // 32 <= 5, before widths had a range of their own)
    with pytest.raises(Exception, match=r"x\.size\(\)\[3\] <= 160"):
        program(torch.randn(1, 3, *OUTSIDE_WIDTH[0]))
