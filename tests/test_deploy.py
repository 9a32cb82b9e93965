"""Deployment paths: torch.export and ONNX with dynamic sizes, torch.compile without graph breaks,
and a clear TorchScript refusal."""

from __future__ import annotations

import copy

import pytest
import torch

import swin
from swin.export import dynamic_size_range, export_onnx, export_program


def small(**kwargs):
    """Two blocks per stage (a regular and a shifted one), narrow, two stages: more stages trace the same code
    again at twice the export time. (The 4-stage classifier, whose last stage shrinks its window and drops the
    shift, is exported and checked at every accepted size in tests/test_export_guard.py.) A backbone returns
    the levels of those two stages."""
    torch.manual_seed(0)
    if kwargs.get("features_only"):
        kwargs.setdefault("out_indices", (0, 1))
        shape = {"depths": (2, 2, 2, 2), "embed_dim": 32, "num_heads": (1, 2, 4, 8)}
    else:
        shape = {"depths": (2, 2), "embed_dim": 32, "num_heads": (1, 2)}
    return swin.create_model("swin_t", **{**shape, **kwargs}).eval()


def test_size_ranges():
    assert dynamic_size_range(swin.create_model("swin_t")) == (128, 224)
    assert dynamic_size_range(swin.create_model("swin_t", img_size=256)) == (256, 2048)
    assert dynamic_size_range(swin.create_model("swin_t", features_only=True)) == (256, 2048)


@pytest.mark.parametrize("features_only", [False, True])
def test_torch_export_dynamic_batch_and_size(features_only):
    model = small(features_only=features_only)
    program = export_program(model, max_batch=8).module()
    shapes = [(1, 3, 256, 800), (3, 3, 544, 320)] if features_only else [(1, 3, 224, 160), (3, 3, 128, 192)]
    for shape in shapes:
        x = torch.randn(*shape)
        with torch.no_grad():
            expected, got = model(x), program(x)
        for e, g in zip(expected if features_only else [expected], got if features_only else [got], strict=True):
            assert e.shape == g.shape
            assert (e - g).abs().max().item() <= 1e-5


@pytest.mark.parametrize("features_only", [True])  # the classifier's file: tests/test_export_guard.py
def test_onnx_two_sizes_from_one_file(tmp_path, features_only):
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    model = small(features_only=features_only)
    path = export_onnx(model, tmp_path / "model.onnx", max_batch=4)
    graph = onnx.load(path).graph
    assert {node.domain for node in graph.node} <= {"", "ai.onnx"}, "custom ops in the graph"
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for shape in [(2, 3, 288, 320), (1, 3, 256, 416)] if features_only else [(2, 3, 224, 192), (1, 3, 128, 160)]:
        x = torch.randn(*shape)
        with torch.no_grad():
            expected = model(x)
        got = session.run(None, {"x": x.numpy()})
        for e, g in zip(expected if features_only else [expected], got, strict=True):
            assert tuple(e.shape) == g.shape
            assert abs(e.numpy() - g).max() <= 1e-4


def test_onnx_static_size(tmp_path):
    """``swin export --static``: one size, no symbolic dimension, which traces the static-size code paths (the
    ONNX exporter fails on a reshape of attention's transposed output there unless it is copied first)."""
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    model = small()
    session = ort.InferenceSession(
        export_onnx(model, tmp_path / "m.onnx", dynamic=False), providers=["CPUExecutionProvider"]
    )
    (shape,) = [tuple(i.shape) for i in session.get_inputs()]
    assert all(isinstance(d, int) for d in shape), shape
    x = torch.randn(*shape)
    with torch.no_grad():
        expected = model(x).numpy()
    assert abs(session.run(None, {"x": x.numpy()})[0] - expected).max() <= 1e-4


def test_compile_has_no_graph_breaks_and_recompiles_only_for_new_sizes():
    from torch._dynamo.testing import CompileCounter

    model = small()
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter)
    first = torch.randn(2, 3, 224, 224)
    torch._dynamo.mark_dynamic(first, 0)
    with torch.no_grad():
        compiled(first)
        if counter.frame_count != 1:  # each graph break makes one more graph; say where they are
            torch._dynamo.reset()
            explanation = torch._dynamo.explain(model)(first)
            reasons = [b.reason for b in explanation.break_reasons]
            pytest.fail(f"{explanation.graph_break_count} graph breaks: {reasons}")
        compiled(torch.randn(3, 3, 224, 224))
        compiled(torch.randn(5, 3, 224, 224))
        assert counter.frame_count == 1, "recompiled for a new batch size"
        compiled(torch.randn(2, 3, 160, 192))
        compiled(torch.randn(2, 3, 160, 192))
        assert counter.frame_count <= 2, "a new image size recompiled more than once"


def test_compile_inductor_matches_eager():
    model = small()
    torch._dynamo.reset()
    compiled = torch.compile(model)
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        assert (compiled(x) - model(x)).abs().max().item() <= 1e-4


def test_torchscript_says_export_is_the_way():
    with pytest.raises(RuntimeError, match=r"TorchScript.*not supported.*torch.export.*ONNX"):
        torch.jit.script(small())


def test_a_static_backbone_export_at_any_one_size(tmp_path):
    """A static export is one traced shape, exact there: a backbone at 224 (below the 256 where its dynamic graph
    starts) exports and matches eager (it was refused as 'wider than one exported graph computes correctly')."""
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    model = small(features_only=True, out_indices=(0, 1, 2, 3))
    path = export_onnx(model, tmp_path / "b.onnx", dynamic=False, size_range=(224, 224), max_batch=1)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        expected = [level.numpy() for level in model(x)]
    got = session.run(None, {"x": x.numpy()})
    assert len(got) == 4 and all(abs(g - e).max() <= 1e-4 for g, e in zip(got, expected, strict=True))


def test_onnx_export_leaves_the_model_as_it_was_and_writes_float32(tmp_path, monkeypatch):
    """A model exported in the middle of training trains on as it was (each module's mode, its dtype) and the
    caller's random stream is untouched; a bfloat16 model (swin.optimize casts where the CPU has bf16 matmul)
    is exported from a float32 copy, which ONNX Runtime's CPU provider loads (it refuses a bfloat16 Conv)."""
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    model = small().train().to(torch.bfloat16)
    model.patch_embed.eval()  # e.g. a frozen stem
    modes = [m.training for m in model.modules()]
    torch.manual_seed(1)
    expected_draw = torch.rand(3)
    torch.manual_seed(1)
    path = export_onnx(model, tmp_path / "m.onnx", dynamic=False)
    assert torch.equal(torch.rand(3), expected_draw)
    assert [m.training for m in model.modules()] == modes
    assert next(model.parameters()).dtype == torch.bfloat16
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    (shape,) = [tuple(i.shape) for i in session.get_inputs()]
    x = torch.randn(*shape)
    with torch.no_grad():
        expected = copy.deepcopy(model).float().eval()(x).numpy()
    assert abs(session.run(None, {"x": x.numpy()})[0] - expected).max() <= 1e-4
    # a failed export restores the modes too, and a missing folder is refused before any tracing
    monkeypatch.setattr(torch.onnx, "export", lambda *a, **k: pytest.fail("traced before checking the path"))
    with pytest.raises(FileNotFoundError):
        export_onnx(model, tmp_path / "missing" / "m.onnx", dynamic=False)
    monkeypatch.setattr(torch.onnx, "export", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        export_onnx(model, tmp_path / "m2.onnx", dynamic=False)
    assert [m.training for m in model.modules()] == modes and not (tmp_path / "m2.onnx").exists()


def test_export_program_restores_modes_and_names_what_to_export_of_an_optimized_model():
    model = small().train()
    model.patch_embed.eval()
    modes = [m.training for m in model.modules()]
    export_program(model, max_batch=2, size_range=(64, 64))
    assert [m.training for m in model.modules()] == modes
    with pytest.raises(TypeError, match=r"got OptimizedModel: export the model it runs \(its .model\)"):
        export_program(swin.optimize(small(), dtype=torch.float32, compile=False))
