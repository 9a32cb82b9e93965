"""The fused bf16 window-attention kernel (swin.layers.window_kernel): its outputs against float32 attention
computed by torch's SDPA (an independent implementation) and against timm's model, where it is used and where
not, and how it is built (cache, failure).

Tests that run the kernel are skipped on a CPU without AVX512-BF16 (there the kernel is never used).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time

import pytest
import torch
import torch.nn.functional as F

import swin
from swin.layers import window_kernel

from ..conftest import timm_pair

needs_kernel = pytest.mark.skipif(
    not window_kernel.available(), reason="no AVX512-BF16 here, or the kernel could not be built"
)


def _windows(batch, windows, heads, n, head_dim, seed=0, spread=1.0):
    """q, k, v as the attention module makes them: strided views of one (B, nW, N, 3*C) projection."""
    generator = torch.Generator().manual_seed(seed)
    qkv = torch.randn(batch, windows, n, 3 * heads * head_dim, generator=generator) * spread
    qkv = qkv.bfloat16().view(batch, windows, n, 3, heads, head_dim).permute(3, 0, 1, 4, 2, 5)
    return qkv.unbind(0)


def _reference(q, k, v, bias, mask, scale):
    """float32 SDPA on the same bf16 values, the heads side by side as (B, nW, N, heads*d)."""
    batch, windows, heads, n, head_dim = q.shape
    additive = bias.unsqueeze(0) if mask is None else bias.unsqueeze(0) + mask.unsqueeze(1)  # (1|nW, heads, N, N)
    out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=additive, scale=scale)
    return out.transpose(2, 3).reshape(batch, windows, n, heads * head_dim)


def _error(out, reference):
    return ((out.float() - reference).norm() / reference.norm()).item()


@needs_kernel
@pytest.mark.parametrize(
    "batch, windows, heads, n, head_dim, mask_windows",
    [
        (2, 4, 3, 49, 32, 4),  # Swin's 7x7 windows, a shift mask per window
        (1, 3, 2, 49, 64, None),  # no mask, wider heads
        (3, 2, 2, 144, 32, 2),  # 12x12 windows (384 models): 9 vectors of keys
        (2, 3, 2, 100, 32, 3),  # 7 vectors of keys: two query rows at a time
        (1, 2, 1, 5, 32, 1),  # fewer tokens than one vector, one mask for all windows
        (1, 1, 2, 256, 128, None),  # the largest it takes
        (2, 1, 1, 64, 96, 1),  # a whole number of vectors
    ],
)
def test_matches_float32_attention(batch, windows, heads, n, head_dim, mask_windows):
    q, k, v = _windows(batch, windows, heads, n, head_dim)
    generator = torch.Generator().manual_seed(1)
    bias = torch.randn(heads, n, n, generator=generator) * 3
    mask = None
    if mask_windows:  # Swin's value, a different pattern in each window; no row masked whole
        mask = (torch.rand(mask_windows, n, n, generator=generator) < 0.4) * -100.0
        mask[:, torch.arange(n), torch.arange(n)] = 0.0
    scale = head_dim**-0.5
    out = window_kernel.window_attention(q, k, v, bias, mask, scale)
    assert out.shape == (batch, windows, n, heads * head_dim) and out.dtype == torch.bfloat16
    # bf16 output rounding alone is ~2e-3; the matmul path (bf16 scores) is ~8e-3
    assert _error(out, _reference(q, k, v, bias, mask, scale)) <= 4e-3


@needs_kernel
def test_large_scores_stay_finite_and_exact():
    """Scores thousands apart (a peaked softmax, most terms exactly zero) and a scale of 1, as Swin V2 runs."""
    q, k, v = _windows(2, 2, 2, 49, 32, spread=8.0)
    bias = torch.zeros(2, 49, 49)
    out = window_kernel.window_attention(q, k, v, bias, None, 1.0)
    assert torch.isfinite(out.float()).all()
    assert _error(out, _reference(q, k, v, bias, None, 1.0)) <= 4e-3


@needs_kernel
def test_rows_masked_whole_or_holding_nan():
    """A row masked whole gives zeros (as SDPA's CPU kernels), one at float32's lowest value the softmax of its
    scores, and a NaN score makes its row NaN (it is not hidden)."""
    q, k, v = _windows(1, 1, 1, 49, 32)
    bias = torch.zeros(1, 49, 49)
    mask = torch.zeros(1, 49, 49)
    mask[0, 3] = -float("inf")
    mask[0, 5] = torch.finfo(torch.float32).min
    mask[0, 7, 11] = float("nan")
    out = window_kernel.window_attention(q, k, v, bias, mask, 32**-0.5).float()
    assert torch.equal(out[0, 0, 3], torch.zeros(32))
    reference = _reference(q, k, v, bias, mask, 32**-0.5)
    assert torch.allclose(out[0, 0, 5], reference[0, 0, 5], rtol=1e-2, atol=1e-2)
    assert torch.isnan(out[0, 0, 7]).all()
    others = [i for i in range(49) if i not in (3, 5, 7)]
    assert torch.isfinite(out[0, 0, others]).all()
    assert _error(out[0, 0, others], reference[0, 0, others]) <= 4e-3


@needs_kernel
def test_contiguous_and_strided_inputs_agree():
    q, k, v = _windows(2, 3, 2, 49, 32)
    bias = torch.randn(2, 49, 49)
    strided = window_kernel.window_attention(q, k, v, bias, None, 0.2)
    contiguous = window_kernel.window_attention(q.contiguous(), k.contiguous(), v.contiguous(), bias, None, 0.2)
    assert torch.equal(strided, contiguous)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda q, bias, mask: (q.float(), bias, mask), "bfloat16"),
        (lambda q, bias, mask: (q, bias.bfloat16(), mask), "bias must be float32"),
        (lambda q, bias, mask: (q, bias[:1], mask), "bias must be float32"),
        (lambda q, bias, mask: (q, bias, torch.zeros(3, 49, 49)), "mask must be float32"),
        (lambda q, bias, mask: (q, bias.to("meta"), mask), "runs on CPU tensors"),
    ],
)
def test_refuses_what_it_does_not_compute(change, message):
    q, k, v = _windows(1, 2, 2, 49, 32)
    q, bias, mask = change(q, torch.zeros(2, 49, 49), torch.zeros(2, 49, 49))
    with pytest.raises(ValueError, match=message):
        window_kernel.window_attention(q, k, v, bias, mask, 1.0)


def _spy(monkeypatch):
    calls = []
    run = window_kernel._run
    monkeypatch.setattr(window_kernel, "_run", lambda *a: calls.append(a[0].shape) or run(*a))
    return calls


@needs_kernel
def test_bf16_model_uses_it_and_matches_timm_float32(monkeypatch):
    """Inference of a model cast to bf16: every block's attention through the kernel, logits within bf16
    tolerance of timm's in float32 (per-token logits, position biases large enough to matter)."""
    shape = {"depths": (2, 2), "num_heads": (2, 4), "embed_dim": 64, "global_pool": "", "num_classes": 16}
    reference, ours = timm_pair("swin_t", shape=shape, position_bias_std=5.0, img_size=112)
    calls = _spy(monkeypatch)
    x = torch.randn(2, 3, 112, 112)
    with torch.no_grad():
        expected = reference(x).permute(0, 3, 1, 2)
        got = ours.to(torch.bfloat16)(x.bfloat16())
    assert len(calls) == 4
    assert _error(got, expected) <= 1e-2


@needs_kernel
def test_swin_v2_bf16_uses_it_and_matches_timm_float32(monkeypatch):
    """Swin V2's cosine attention (scale 1, the temperature inside q) through the kernel. Its post-norms start
    at zero, which would hide attention: set to one, the logit scales spread out."""
    from swin.weights import convert

    shape = {"depths": (2, 2), "num_heads": (2, 4), "embed_dim": 64, "global_pool": "", "num_classes": 16}
    reference, ours = timm_pair("swinv2_t_w8", shape=shape, img_size=128)
    with torch.no_grad():
        for name, parameter in reference.named_parameters():
            if ".norm" in name and name.endswith("weight"):
                parameter.fill_(1.0)
            elif name.endswith("logit_scale"):
                parameter.uniform_(0.5, 2.3)
    ours.load_state_dict(convert(reference.state_dict(), source="timm"))
    calls = _spy(monkeypatch)
    x = torch.randn(2, 3, 128, 128)
    with torch.no_grad():
        expected = reference(x).permute(0, 3, 1, 2)
        got = ours.to(torch.bfloat16)(x.bfloat16())
        timm_bf16 = reference.to(torch.bfloat16)(x.bfloat16()).permute(0, 3, 1, 2)
    assert len(calls) == 4
    # V2 in bf16 is ~1% off float32 here whatever runs attention (normalised q, k and the temperature in
    # bf16): ours no further off than timm's own model cast to bf16
    assert _error(got, expected) <= _error(timm_bf16, expected)


@needs_kernel
@pytest.mark.parametrize("setting", ["grad", "training", "flop counter", "disabled", "float32", "autocast"])
def test_not_used_where_autograd_or_an_observer_needs_aten_ops(monkeypatch, setting):
    model = swin.create_model("swin_t", num_classes=10, depths=(2, 2), num_heads=(2, 4), embed_dim=64).eval()
    model.to(torch.bfloat16)
    x = torch.randn(1, 3, 112, 112, dtype=torch.bfloat16)
    calls = _spy(monkeypatch)
    if setting == "grad":
        model(x).float().sum().backward()  # parameters require grad: the kernel has no backward
        assert model.layers[0].blocks[0].attn.relative_position_bias_table.grad is not None
    elif setting == "training":
        model.train()(x).float().sum().backward()
    elif setting == "flop counter":
        from torch.utils.flop_counter import FlopCounterMode

        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(x)
        assert counter.get_total_flops() > 0
    elif setting == "disabled":
        monkeypatch.setattr(window_kernel, "ENABLED", False)
        with torch.no_grad():
            model(x)
    elif setting == "float32":
        with torch.no_grad():
            model.float()(x.float())
    else:  # autocast keeps timm's semantics (tests/test_parity.py)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            model.float()(x.float())
    assert calls == []


@needs_kernel
def test_compiled_graph_calls_the_op(monkeypatch):
    """Under torch.compile (swin.optimize's frozen bf16 graph) attention is the custom op swin::window_attention,
    one call per block, and the logits stay within bf16 tolerance of timm's in float32."""
    shape = {"depths": (2,), "num_heads": (2,), "embed_dim": 64, "global_pool": "", "num_classes": 16}
    reference, ours = timm_pair("swin_t", shape=shape, position_bias_std=5.0, img_size=112)
    fast = swin.optimize(ours, dtype="bfloat16", compile="force")
    x = torch.randn(2, 3, 112, 112)
    with torch.no_grad():
        expected = reference(x).permute(0, 3, 1, 2)
    fast(x)  # compiles (after one eager image)
    calls = _spy(monkeypatch)  # the op's implementation, called by the compiled graph
    assert _error(fast(x), expected) <= 1e-2
    assert calls == [(2, 16, 2, 49, 32)] * 2  # one call per block, the whole batch


def _fresh_state(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(window_kernel, "_function", None)
    monkeypatch.setattr(window_kernel, "_failed", None)
    monkeypatch.setattr(window_kernel, "READY", False)
    monkeypatch.setattr(window_kernel, "_cpu_has_bf16_dot", lambda: True)


def test_a_failed_build_warns_once_and_attention_runs_without_it(monkeypatch, tmp_path):
    _fresh_state(monkeypatch, tmp_path)
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.warns(UserWarning, match="could not be built.*no-such-compiler.*SWIN_FUSED_ATTENTION=0"):
        assert not window_kernel.available()
    assert not window_kernel.available()  # not tried again, no second warning
    assert not window_kernel.READY
    model = swin.create_model("swin_t", num_classes=10, depths=(2,), num_heads=(2,), embed_dim=64).eval()
    with torch.no_grad():
        assert torch.isfinite(model.to(torch.bfloat16)(torch.randn(1, 3, 112, 112).bfloat16()).float()).all()
    assert not any(p.name.startswith(".build-") for p in tmp_path.rglob("*"))


def test_a_compiler_error_leaves_no_library(monkeypatch, tmp_path):
    """A compiler that fails (here: one that prints an error and exits 1) leaves nothing in the cache."""
    _fresh_state(monkeypatch, tmp_path / "cache")
    compiler = tmp_path / "cc"
    compiler.write_text(
        "#!/bin/sh\n[ \"$1\" = --version ] && echo fake 1.0 && exit 0\necho 'error: no bf16' >&2\nexit 1\n"
    )
    compiler.chmod(0o755)
    monkeypatch.setenv("CXX", str(compiler))
    with pytest.warns(UserWarning, match="error: no bf16"):
        assert not window_kernel.available()
    left = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert left == []


@needs_kernel
def test_built_once_then_read_from_the_cache(monkeypatch, tmp_path):
    _fresh_state(monkeypatch, tmp_path)
    (tmp_path / "swin").mkdir()
    (tmp_path / "swin" / "window_attention_0123456789abcdef.so").write_bytes(b"an older source's build")
    path = window_kernel._build()
    assert os.path.isfile(path) and os.path.dirname(path) == str(tmp_path / "swin")
    # no build leftovers, and the older build removed; beside the library, the sha256 it was written with
    name = os.path.basename(path)
    assert sorted(p.name for p in (tmp_path / "swin").iterdir()) == [name, name + ".sha256"]
    runs = []
    real_run = subprocess.run
    monkeypatch.setattr(subprocess, "run", lambda args, **kw: runs.append(args) or real_run(args, **kw))
    assert window_kernel._build() == path
    assert runs == [[*window_kernel._compiler(), "--version"]]  # asked for its version (the key), not run


@needs_kernel
def test_a_damaged_cached_library_is_built_again(monkeypatch, tmp_path):
    _fresh_state(monkeypatch, tmp_path)
    path = window_kernel._build()
    with open(path, "r+b") as f:
        f.truncate(100)
    assert window_kernel.available()
    assert os.path.getsize(path) > 100


@needs_kernel
def test_a_cached_library_cut_short_is_built_again_not_loaded(tmp_path):
    """A library cut short after its build (an interrupted copy of the cache, a full disk) still loads, and the
    first call into it killed the process (SIGBUS) on every bf16 forward: its recorded sha256 is checked first.
    In a child process, since the failure this guards against is a crash."""
    script = f"""
import os, torch
os.environ["TORCH_EXTENSIONS_DIR"] = {str(tmp_path)!r}
from swin.layers import window_kernel
path = window_kernel._build()
with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) * 3 // 4)
q = k = v = torch.randn(1, 1, 1, 49, 32).bfloat16()
print(window_kernel.available(), window_kernel.window_attention(q, k, v, torch.zeros(1, 49, 49), None, 0.2).shape)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[0] == "True"


@needs_kernel
def test_a_negated_view_is_not_read_as_its_memory():
    """torch._neg_view(q) holds q's memory with a negation bit: the kernel read the memory (relative error 1.2);
    it leaves such views to the other paths."""
    q, k, v = _windows(1, 2, 2, 49, 32)
    assert not window_kernel.supports(torch._neg_view(q), k, v, 0.0)
    bias = torch.zeros(2, 49, 49)
    out = swin.layers.execution.window_sdpa(torch._neg_view(q), k, v, bias, None)
    assert _error(out, _reference(-q, k, v, bias, None, 32**-0.5)) <= 1e-2


def test_cxx_may_be_a_command_with_arguments(monkeypatch):
    monkeypatch.setenv("CXX", "ccache g++")
    assert window_kernel._compiler() == ["ccache", "g++"]
    monkeypatch.delenv("CXX")
    assert window_kernel._compiler() == ["c++"]


def test_a_compiler_that_writes_nothing_is_named(monkeypatch, tmp_path):
    _fresh_state(monkeypatch, tmp_path / "cache")
    monkeypatch.setenv("CXX", "true")  # exits 0, writes no library
    with pytest.warns(UserWarning, match="exited without error but wrote no library"):
        assert not window_kernel.available()


@needs_kernel
def test_an_unwritable_cache_builds_into_a_private_directory(monkeypatch, tmp_path):
    """A cache that cannot be written (here: a file where the directory should be) still gives the kernel."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    _fresh_state(monkeypatch, blocker)
    assert window_kernel.available()
    assert not blocker.is_dir()


@needs_kernel
def test_named_in_a_profile():
    q, k, v = _windows(1, 2, 2, 49, 32)
    with torch.profiler.profile() as profile:
        window_kernel.window_attention(q, k, v, torch.zeros(2, 49, 49), None, 1.0)
    assert "swin::window_attention" in {event.key for event in profile.key_averages()}


@needs_kernel
def test_a_cache_whose_libraries_do_not_load_builds_a_private_copy(monkeypatch, tmp_path):
    """A cache on a noexec mount holds a library that builds and hashes right but does not load ("failed to map
    segment from shared object"): it was built twice into the cache, then given up with a warning that it could
    not be built, in every process. Now: one private build, which loads; a cached library goes straight there."""
    cache = tmp_path / "cache"
    real_cdll = ctypes.CDLL

    def noexec(path, *args, **kwargs):
        if str(path).startswith(str(cache)):
            raise OSError(f"{path}: failed to map segment from shared object")
        return real_cdll(path, *args, **kwargs)

    monkeypatch.setattr(window_kernel.ctypes, "CDLL", noexec)
    real_compile = window_kernel._compile
    for cached in (False, True):
        _fresh_state(monkeypatch, cache)
        built = []
        monkeypatch.setattr(window_kernel, "_compile", lambda *a, built=built: built.append(a[-1]) or real_compile(*a))
        assert window_kernel.available()
        assert len(built) == (1 if cached else 2) and not built[-1].startswith(str(cache))


def test_a_library_that_loads_nowhere_is_named_in_the_warning(monkeypatch, tmp_path):
    _fresh_state(monkeypatch, tmp_path)
    monkeypatch.setattr(window_kernel, "_build", lambda private=False: str(tmp_path / f"lib{private}.so"))

    def refuse(path, *args, **kwargs):
        raise OSError(f"{path}: failed to map segment from shared object")

    monkeypatch.setattr(window_kernel.ctypes, "CDLL", refuse)
    with pytest.warns(
        UserWarning, match=r"could not be built or loaded \(it was built but does not load .*failed to map"
    ):
        assert not window_kernel.available()


@needs_kernel
def test_a_killed_builds_folder_is_removed_by_a_later_build(monkeypatch, tmp_path):
    """A process killed while compiling left its .build- folder (with a library in it) for good."""
    _fresh_state(monkeypatch, tmp_path)
    old, live = tmp_path / "swin" / ".build-old", tmp_path / "swin" / ".build-live"
    for folder in (old, live):
        folder.mkdir(parents=True)
        (folder / "window_attention.so").write_bytes(b"half")
    hours_ago = time.time() - 3 * 3600
    os.utime(old, (hours_ago, hours_ago))
    window_kernel._build()
    assert not old.exists() and live.exists()  # another process's build in progress is left alone


def test_switched_off_by_the_usual_spellings():
    """SWIN_FUSED_ATTENTION=off (or false, no) left the kernel on: only '0' was read."""
    script = "from swin.layers import window_kernel as k; print(k.ENABLED)"
    env = {**os.environ, "SWIN_FUSED_ATTENTION": "Off"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert result.stdout.split() == ["False"], result.stderr[-2000:]
