"""``swin bench`` compares like with like: the same weights in every implementation, each measured."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from swin.layers import execution
from swin.tools import bench

pytest.importorskip("torchvision")


def test_every_implementation_computes_the_same_function():
    case = bench.Case("swin_t eval b1 224 fp32", "swin_t", 1, (224, 224))
    impls = bench._implementations(case, "cpu", unchunked=True)
    assert set(impls) == {"ours", "ours-unchunked", "timm", "timm-fused", "torchvision"}
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        outputs = {name: model(x) for name, model in impls.items()}
    for name, out in outputs.items():
        assert (out - outputs["torchvision"]).abs().max().item() <= 1e-4, name
    assert _stochastic_depths(impls["torchvision"]) == [0.0] * 12  # one per block, as ours and timm: off


def _stochastic_depths(model: torch.nn.Module) -> list[float]:
    from torchvision.ops import StochasticDepth

    return [module.p for module in model.modules() if isinstance(module, StochasticDepth)]


def test_torchvision_is_built_without_stochastic_depth():
    """torchvision's default (0.5 for swin_b) would make its training step drop blocks that ours and timm run."""
    assert set(_stochastic_depths(bench._torchvision_model("swin_b"))) == {0.0}


def test_architectures_a_peer_lacks_are_left_out_with_a_reason(capsys):
    """Swin V2: torchvision has none of ours (said), and timm's has no fused attention (no timm-fused twin)."""
    case = bench.Case("v2", "swinv2_t_w8", 1, (256, 256))
    assert set(bench._implementations(case, "cpu")) == {"ours", "timm"}
    assert "v2: torchvision left out (torchvision has no swinv2_t_w8)" in capsys.readouterr().err


def test_an_error_loading_our_weights_into_timm_is_raised(monkeypatch):
    import swin.weights

    monkeypatch.setattr(swin.weights, "export", lambda state, target: {"not a timm key": torch.zeros(1)})
    with pytest.raises(RuntimeError, match="state_dict"):
        bench._implementations(bench.Case("swin_t", "swin_t", 1, (224, 224)), "cpu")


def test_unchunked_baseline_turns_chunking_off_only_while_it_runs():
    seen = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen.append(execution.ENABLED)
            raise RuntimeError("stop")

    with pytest.raises(RuntimeError):
        bench._Unchunked(Probe())(torch.zeros(1))
    assert seen == [False] and execution.ENABLED


def test_unchunked_baseline_restores_what_it_found(monkeypatch):
    monkeypatch.setattr(execution, "ENABLED", False)
    bench._Unchunked(torch.nn.Identity())(torch.zeros(1))
    assert execution.ENABLED is False


def test_backbone_case_feeds_torchvision_the_same_weights():
    case = bench.Case("swin_t backbone", "swin_t", 1, (224, 224), kind="features")
    impls = bench._implementations(case, "cpu")
    assert set(impls) == {"ours", "torchvision"}
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        stage3 = impls["torchvision"][:6](x)  # patch embedding, stage 1, merge, stage 2, merge, stage 3
        ours = impls["ours"](x)[2]  # stage 3 through norm2, which is left at its initial (identity) affine
    expected = F.layer_norm(stage3, stage3.shape[-1:]).permute(0, 3, 1, 2)
    assert (ours - expected).abs().max().item() <= 1e-4


@pytest.fixture
def narrow_swin_t(monkeypatch):
    """swin_t in all three implementations built with one block per stage at a quarter of the width; the bench's
    own code still builds them, moves the weights between them and runs them: a case costs milliseconds
    instead of seconds."""
    import timm
    import torchvision
    from torchvision.models.swin_transformer import SwinTransformer

    import swin

    shape = {"embed_dim": 24, "depths": (1, 1, 1, 1), "num_heads": (1, 2, 4, 8)}
    create_ours, create_timm = swin.create_model, timm.create_model
    monkeypatch.setattr(swin, "create_model", lambda name, **kwargs: create_ours(name, **shape, **kwargs))
    monkeypatch.setattr(timm, "create_model", lambda name, **kwargs: create_timm(name, **shape, **kwargs))

    def torchvision_model(name):
        assert name == "swin_t"
        return SwinTransformer(
            patch_size=[4, 4],
            embed_dim=shape["embed_dim"],
            depths=list(shape["depths"]),
            num_heads=list(shape["num_heads"]),
            window_size=[7, 7],
            stochastic_depth_prob=0.2,  # torchvision's swin_t's: the bench turns it off
        )

    monkeypatch.setattr(torchvision.models, "get_model", torchvision_model)


def test_run_case_reports_a_median_per_implementation(narrow_swin_t):
    case = bench.Case("swin_t train", "swin_t", 1, (224, 224), kind="train")
    result = bench.run_case(case, rounds=1, warmup=0)
    assert set(result.times) == {"ours", "timm", "timm-fused", "torchvision"}
    assert all(t > 0 for t in result.times.values())
    if bench._page_faults() >= 0:  # (no resource module on Windows: no counts)
        assert set(result.faults) == set(result.times) and all(f >= 0 for f in result.faults.values())
        line = bench._format_row({"case": "c", "ms": {}, "page_faults": result.faults})
        assert f"page faults per call: torchvision {result.faults['torchvision']}, ours {result.faults['ours']}" in line


def test_run_case_interleaves_and_leaves_warm_ups_out(monkeypatch):
    """Each implementation warms up in turn, then every round runs each once (A B C A B C); the medians are of
    the rounds only."""
    import types

    calls, clock = [], types.SimpleNamespace(now=0.0)
    durations = {"ours": [100.0, 1.0, 3.0], "timm": [100.0, 2.0, 4.0], "torchvision": [100.0, 5.0, 7.0]}

    def fake(name):
        def call(x):
            clock.now += durations[name][sum(c == name for c in calls)]
            calls.append(name)

        return call

    monkeypatch.setattr(bench, "_implementations", lambda *args: {name: fake(name) for name in durations})
    monkeypatch.setattr(bench, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))
    result = bench.run_case(bench.Case("c", "swin_t", 1, (8, 8)), rounds=2, warmup=1)
    assert calls == ["ours", "timm", "torchvision"] * 3
    assert result.times == {"ours": 2.0, "timm": 3.0, "torchvision": 6.0}


def test_row_ratios_are_peer_time_over_ours():
    times = {
        "ours": 2.0,
        "timm": 5.0,
        "timm-fused": 4.0,
        "torchvision": 3.0,
        "timm-fused compiled": 1.5,
        "torchvision compiled": 1.8,
        "ours-optimized": 1.0,
        "ours-unchunked": 3.0,
    }
    row = bench._row("c", times, floor=0.5, optimized_floor=0.25)
    assert row["ms"]["timm-fused compiled"] == 1500.0
    assert row["speedup_vs_timm"] == 2.0  # the faster of timm's eager settings over ours: above 1, ours faster
    assert row["speedup_vs_torchvision"] == 1.5 and row["chunking_gain"] == 1.5
    # the fastest of the peers' names, though ours-optimized is faster still
    assert row["fastest_peer"] == "timm-fused compiled" and row["optimized_vs_fastest_peer"] == 1.5
    assert (row["floor_ms"], row["over_floor"], row["optimized_over_floor"]) == (500.0, 4.0, 4.0)
    alone = bench._row("d", {"ours": 2.0})
    assert set(alone) == {"case", "ms"}
    table = bench._table([row, alone]).splitlines()
    assert table[3] == "| d | 2000.0 | - | - | - | - | - | - | - | - |"
    assert bench._ways_table([alone]).splitlines()[2] == "| d | 2000.0 | - | - | - |"


def test_page_faults_counts_fresh_pages():
    """The counter against the kernel: writing once into each page of a fresh anonymous mapping faults once
    per page."""
    import mmap
    import sys

    if bench._page_faults() < 0 or not sys.platform.startswith("linux"):
        pytest.skip("counts Linux's minor page faults")
    pages = 2048
    with mmap.mmap(-1, pages * mmap.PAGESIZE) as memory:
        if hasattr(mmap, "MADV_NOHUGEPAGE"):  # one fault per 4 KiB page, not per transparent huge page
            memory.madvise(mmap.MADV_NOHUGEPAGE)
        before = bench._page_faults()
        for page in range(pages):
            memory[page * mmap.PAGESIZE] = 1
        faults = bench._page_faults() - before
    assert pages <= faults < 2 * pages


def test_table_lists_ratios():
    row = {"case": "c", "ms": {"ours": 1.0, "timm": 2.0}, "speedup_vs_timm": 2.0}
    table = bench._table([row]).splitlines()
    assert len(table) == 3 and table[2].startswith("| c | 1.0 | 2.0 |") and "2.0x" in table[2]


def test_profile_names_where_the_time_goes_beside_each_peer():
    report = bench.profile_case(bench.Case("swin_t eval b1", "swin_t", 1, (224, 224)), rounds=1)
    lines = report.splitlines()
    assert lines[2] == "| op | ours share | ours | timm | timm-fused | torchvision |" and len(lines) == 4 + 12 + 1
    rows = {line.split(" | ")[0][2:]: line.strip("| ").split(" | ")[1:] for line in lines[4:]}
    assert all(float(ms) > 0 for ms in rows["total"][1:])
    # the linear layers are most of the work: ATen's addmm (MKL), or oneDNN's linear where the process's timing
    # chose it for ours (swin.layers.linear_kernel); the peers' run on addmm
    linear = [op for op in rows if "addmm" in op or "mkldnn::_linear_pointwise" in op]
    assert linear and float(rows["aten::addmm"][2]) > 0 and float(rows["aten::addmm"][4]) > 0
    ours_linear = sum(float(rows[op][1]) for op in linear)
    assert ours_linear > 0.3 * float(rows["total"][1])
    # timm with fused attention calls SDPA; timm without it does not
    sdpa = next(op for op in rows if "scaled_dot_product" in op and float(rows[op][3]) > 0)
    assert float(rows[sdpa][2]) == 0


def test_peer_ways_keep_the_same_function():
    """Each way a user runs a peer for speed computes the same logits (bf16 ways within bf16 error), and ours
    optimized is swin.optimize in the machine's fastest dtype. Compiled ways are checked in test_optimize."""
    from swin.optimized import OptimizedModel, fastest_dtype

    case = bench.Case("swin_t eval b1 224 fp32", "swin_t", 1, (224, 224))
    impls = bench._implementations(case, "cpu", ways=("eager", "autocast", "bf16"))
    ways = {f"{peer} {way}" for peer in ("timm", "timm-fused", "torchvision") for way in ("autocast", "bf16")}
    assert set(impls) == {"ours", "timm", "timm-fused", "torchvision", "ours-optimized"} | ways
    for name in ("timm", "timm autocast", "timm bf16", "timm-fused", "timm-fused autocast", "timm-fused bf16"):
        flags = {m.fused_attn for m in impls[name].modules() if hasattr(m, "fused_attn")}
        assert flags == {name.startswith("timm-fused")}, name  # each way kept its peer's setting
    for name in ways:  # the ways that cast or compile have a model of their own; autocast runs the peer itself
        shared = {id(p) for p in impls[name].parameters()} & {id(p) for p in impls[name.split()[0]].parameters()}
        assert bool(shared) == name.endswith("autocast"), name
    assert isinstance(impls["ours-optimized"], OptimizedModel)
    assert impls["ours-optimized"].dtype == fastest_dtype("cpu")
    assert impls["ours-optimized"].model is not impls["ours"]  # optimized a copy, not the eager model
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        reference = impls["torchvision"](x)
        for name in ways:
            out = impls[name](x).float()
            assert ((out - reference).norm() / reference.norm()).item() <= 2e-2, name
        assert next(impls["torchvision"].parameters()).dtype == torch.float32  # cast a copy


def test_reduced_precision_ways_use_the_dtype_of_ours_optimized(monkeypatch):
    """Where ours optimized runs float16 (CUDA before compute capability 8.0), so do the peers' autocast and bf16
    ways; where it runs float32, they stay bfloat16."""
    import swin.optimized
    from swin.tools.bench_ways import peer_way, reduced_dtype

    model = torch.nn.Linear(4, 4)
    monkeypatch.setattr(swin.optimized, "fastest_dtype", lambda device: torch.float16)
    assert reduced_dtype("cuda") == torch.float16
    assert next(peer_way(model, "bf16", "cpu").parameters()).dtype == torch.float16
    assert peer_way(model, "autocast", "cpu").dtype == torch.float16
    assert peer_way(model, "autocast", "cpu")(torch.zeros(1, 4)).dtype == torch.float16  # CPU autocast takes fp16
    assert next(model.parameters()).dtype == torch.float32
    monkeypatch.setattr(swin.optimized, "fastest_dtype", lambda device: torch.float32)
    assert reduced_dtype("cpu") == torch.bfloat16


def test_model_case_and_machine_header():
    import argparse

    from swin.optimized import cpu_features
    from swin.tools.machine import describe, machine_info

    args = argparse.Namespace(
        model="swinv2_t_w8", img_size="256,320", batch=2, kind="features", dtype="fp32", only=None, device="cpu"
    )
    (case,) = bench._selected_cases(args)
    assert (case.name, case.arch, case.batch, case.size, case.kind) == (
        "swinv2_t_w8 features b2 256x320 fp32",
        "swinv2_t_w8",
        2,
        (256, 320),
        "features",
    )
    with pytest.raises(ValueError, match="--img-size must be H or H,W"):
        bench._selected_cases(argparse.Namespace(**{**vars(args), "img_size": "256x320"}))
    line = describe(machine_info())
    cpu = cpu_features()
    assert line.startswith(cpu["name"]) and f"AMX-BF16 {'yes' if cpu['amx_bf16'] else 'no'}" in line
    assert f"{torch.get_num_threads()} threads" in line and f"torch {torch.__version__}" in line
    assert line.endswith(" UTC") and "kernels " + torch.backends.cpu.get_cpu_capability() in line
    from swin.layers import window_kernel

    assert f"fused bf16 attention {'yes' if window_kernel.available() else 'no'}" in line


def test_ways_table_names_the_fastest_peer():
    row = {
        "case": "c",
        "ms": {"ours": 3.0, "timm-fused": 4.0, "timm-fused compiled": 2.0, "ours-optimized": 1.0},
        "fastest_peer": "timm-fused compiled",
        "optimized_vs_fastest_peer": 2.0,
        "optimized_over_floor": 1.2,
    }
    lines = bench._ways_table([row]).splitlines()
    assert "timm-fused compiled ms" in lines[0]
    assert lines[2] == "| c | 3.0 | 4.0 | 2.0 | 1.0 | timm-fused compiled | 2.0x | 1.2 |"


def test_bench_refuses_options_that_would_be_ignored(capsys):
    from swin.tools.cli import main

    assert main(["bench", "--batch", "4"]) != 0  # on CPU --batch belongs to a --model case
    assert "--batch sets the batch of a --model case" in capsys.readouterr().err
    assert main(["bench", "--model", "swin_t", "--ways", "auto", "--compile"]) != 0
    assert "leave out --compile" in capsys.readouterr().err
    for argv in (["--img-size", "512"], ["--kind", "train"], ["--dtype", "bf16"]):  # they describe a --model case
        assert main(["bench", *argv]) != 0
        assert f"{argv[0]} describe(s) a --model case" in capsys.readouterr().err
    assert main(["bench", "--model", "swin_t", "--only", "b8"]) != 0
    assert "--only picks among the default cases" in capsys.readouterr().err
    assert main(["bench", "--only", "no such case"]) != 0
    assert "no case's name contains that; the cases are: swin_t eval b1 224 fp32;" in capsys.readouterr().err
    assert main(["bench", "--compile", "--unchunked"]) != 0  # ours-unchunked would be eager against ours compiled
    assert "the gain shown would be compiling's: leave out one of them" in capsys.readouterr().err
    assert main(["bench", "--ways", "auto", "compiled"]) != 0
    assert "--ways auto compiled: auto picks the ways itself and must be given alone" in capsys.readouterr().err
    for argv in (["--compile"], ["--ways", "all"], ["--unchunked"], ["--format", "json"]):
        assert main(["bench", "--profile", *argv]) != 0
        assert f"--profile profiles ours and the peers eager, by op, as a table; it does not take {argv[0]}" in (
            capsys.readouterr().err
        )
    assert main(["bench", "--model", "swin_t", "--kind", "train", "--ways", "auto"]) != 0
    assert "--ways runs inference" in capsys.readouterr().err


def test_bench_without_cuda_points_to_the_cpu(monkeypatch, capsys):
    from swin.tools.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", "--device", "cuda"]) == 2
    assert "no CUDA device is available; run on the CPU with --device cpu" in capsys.readouterr().err


def test_profile_takes_rounds(monkeypatch, capsys):
    from swin.tools.cli import main

    profiled = []
    monkeypatch.setattr(bench, "profile_case", lambda case, rounds, device: profiled.append((case.name, rounds)))
    assert main(["bench", "--profile", "--only", "swin_t eval b1", "--rounds", "2"]) == 0
    assert profiled == [("swin_t eval b1 224 fp32", 2)]


def test_allocator_is_named_with_the_settings_the_process_started_with():
    """The settings glibc read at start-up, not the environment as changed since (glibc never rereads it)."""
    import os
    import platform
    import subprocess
    import sys

    from swin.tools.machine import allocator, describe, machine_info

    name = allocator()
    assert name in describe(machine_info())
    try:
        with open("/proc/self/maps") as maps:
            loaded = maps.read()
    except OSError:
        pytest.skip("no /proc here")
    if platform.libc_ver()[0] != "glibc" or any(f"lib{lib}" in loaded for lib in ("jemalloc", "tcmalloc", "mimalloc")):
        pytest.skip("not glibc's malloc")
    environment = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    environment.update(
        MALLOC_TRIM_THRESHOLD_="123",
        GLIBC_TUNABLES="glibc.rtld.optional_static_tls=512:glibc.malloc.mmap_threshold=456",
    )
    probe = (
        "import os; from swin.tools.machine import allocator; print(allocator()); "
        "os.environ['MALLOC_TOP_PAD_'] = '7'; del os.environ['MALLOC_TRIM_THRESHOLD_']; print(allocator())"
    )
    started, after = subprocess.run(
        [sys.executable, "-c", probe], env=environment, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert started.startswith(f"glibc {platform.libc_ver()[1]} malloc (")
    assert "MALLOC_TRIM_THRESHOLD_=123" in started and "glibc.malloc.mmap_threshold=456" in started
    assert "rtld" not in started and "default" not in started
    assert after == started  # changed after start-up: not what glibc runs with
    del environment["MALLOC_TRIM_THRESHOLD_"], environment["GLIBC_TUNABLES"]
    plain = subprocess.run(
        [sys.executable, "-c", "from swin.tools.machine import allocator; print(allocator())"],
        env=environment,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert plain.endswith("(default thresholds)")


def test_timm_at_a_size_where_its_windows_differ_is_left_out(capsys):
    """At 160 pixels timm clamps stage 4's window to its 5x5 map where ours keeps the configured 7 (detection
    semantics of the bench's --img-size case): timm is left out with the reason, not a crash."""
    import swin

    case = bench.Case("swin_t eval b1 160x160 fp32", "swin_t", 1, (160, 160))
    ours = swin.create_model("swin_t", drop_path_rate=0.0)
    assert bench._timm_models(case, ours) == {}
    assert "timm left out (its model at this size has other shapes" in capsys.readouterr().err


def test_a_model_case_runs_in_fp16_with_its_own_matmul_floor(capsys, monkeypatch):
    """--dtype fp16, for GPUs before Ampere (bf16 emulated there): a case under float16 autocast, its floor at
    the float16 matmul rate (only fp32 and bf16 were offered). The rates are measured on 256^3 here: a CPU
    without float16 arithmetic takes seconds per 1024^3 product."""
    from swin.tools import bench
    from swin.tools.cli import main

    measure = bench.matmul_rate
    monkeypatch.setattr(bench, "matmul_rate", lambda dtype, device="cpu": measure(dtype, size=256, device=device))

    args = ["bench", "--model", "swin_t", "--dtype", "fp16", "--batch", "1", "--img-size", "64", "--rounds", "1"]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "float16" in captured.err and "swin_t eval b1 64x64 fp16" in captured.out


@pytest.mark.parametrize(("granted", "said"), [(True, "(usable)"), (False, "(not enabled by the kernel)")])
def test_an_amx_cpu_says_whether_the_kernel_lets_this_process_use_it(monkeypatch, granted, said):
    """A CPU that lists AMX-BF16 (CPUID) runs oneDNN's AMX kernels only where Linux grants this process the tiles
    (torch asks for them): the machine line says which, as a figure made without them is no AMX figure."""
    from swin.tools import machine

    monkeypatch.setattr(machine, "_amx_usable", lambda: granted)
    real = __import__("swin.optimized", fromlist=["cpu_features"]).cpu_features
    monkeypatch.setattr("swin.optimized.cpu_features", lambda: {**real(), "amx_bf16": True})
    line = machine.describe(machine.machine_info())
    assert f"AMX-BF16 yes {said}" in line


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matmul_rate_is_atens_where_onednn_has_no_kernel_for_the_dtype(monkeypatch, dtype):
    """On an AVX2-only CPU oneDNN has no bfloat16 inner product ("could not create a primitive descriptor"):
    the rate is ATen's alone there, as the whole bench stopped at its first line."""

    def no_kernel(a, b):
        raise RuntimeError("could not create a primitive descriptor for the inner product forward propagation")

    monkeypatch.setattr(bench, "_onednn_matmul", no_kernel)
    assert bench.matmul_rate(dtype, size=64, rounds=1) > 0
