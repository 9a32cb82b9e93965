"""``swin bench``: ours against timm and torchvision, same architecture and weights, one process, interleaved.

Every case runs each implementation once per round, in turn (A B C A B C ...), after a warm-up; the
reported time is the median over rounds and the ratio is peer time over ours, so drifts of a noisy
machine hit every implementation alike. Each peer runs in its fastest documented setting: timm both with
its fused attention off (its default for Swin) and on, keeping the faster, and bfloat16 for peers under
``torch.autocast``, their documented mixed-precision path.
"""

from __future__ import annotations

import contextlib
import copy
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

__all__ = ["Case", "matmul_rate", "run_case", "register"]


@dataclass
class Case:
    name: str
    arch: str
    batch: int
    size: tuple[int, int]
    dtype: torch.dtype = torch.float32
    kind: str = "eval"  # eval | features | train


@dataclass
class Result:
    case: str
    times: dict[str, float] = field(default_factory=dict)  # median seconds per implementation
    extra: dict[str, float] = field(default_factory=dict)
    faults: dict[str, int] = field(default_factory=dict)  # median minor page faults per call


def matmul_rate(dtype: torch.dtype = torch.float32, size: int = 1024, rounds: int = 5, device: str = "cpu") -> float:
    """FLOP/s of a square matmul on this machine (median of rounds): the rate the floor is computed at. On CPU
    the faster of ATen's matmul (MKL's sgemm in float32) and oneDNN's, which ours runs float32 linear layers on
    where it is faster (swin.layers.linear_kernel): a floor at the slower library's rate would not be one."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    ways = [lambda: a @ b]
    if device == "cpu" and torch.backends.mkldnn.is_available():
        ways.append(lambda: torch.ops.mkldnn._linear_pointwise(a, b, None, "none", [], ""))
    times = {way: [] for way in ways}
    for _ in range(rounds + 2):
        for way in ways:
            start = time.perf_counter()
            way()
            _sync(device)
            times[way].append(time.perf_counter() - start)
    return 2 * size**3 / min(statistics.median(t[2:]) for t in times.values())


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _timm_name(arch: str) -> str:
    import swin

    aliases = swin.get_config(arch).aliases
    if not aliases:
        raise KeyError(f"{arch} has no timm name (registered without aliases)")
    return aliases[0]


class _Unchunked(torch.nn.Module):
    """Ours with chunked inference off (``swin.layers.execution.ENABLED``) while it runs: what chunking gains."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor):
        from swin.layers import execution

        execution.ENABLED = False
        try:
            return self.model(x)
        finally:
            execution.ENABLED = True


def _implementations(
    case: Case, device: str, compile: bool = False, unchunked: bool = False, ways: tuple[str, ...] = ()
) -> dict[str, Callable[[torch.Tensor], object]]:
    """Same weights everywhere: torchvision's random init (when it has the architecture) converted to ours,
    and ours exported to timm's layout. ``compile``: every implementation under ``torch.compile`` (each
    peer compiled too, so ratios stay like for like), and ours uncompiled as ``ours-eager`` for the gain.
    ``unchunked``: ours also with chunked inference off, as ``ours-unchunked``. ``ways``: the peers also run
    each of those ways (tools/bench_ways.py; timm with its fused attention), as ``timm-fused <way>`` and
    ``torchvision <way>``, and ours also through :func:`swin.optimize`, as ``ours-optimized``."""
    import timm

    import swin
    from swin.weights import convert, export

    torch.manual_seed(0)
    features = case.kind == "features"
    ours = swin.create_model(case.arch, features_only=features, drop_path_rate=0.0)
    impls: dict[str, torch.nn.Module] = {}
    try:
        import torchvision

        tv = getattr(torchvision.models, case.arch)()
        weights = convert(tv.state_dict(), source="torchvision")
        if features:
            weights = {k: v for k, v in weights.items() if not k.startswith(("norm.", "head."))}
        ours.load_state_dict(weights, strict=not features)
        impls["torchvision"] = tv.features if features else tv
    except (ImportError, AttributeError):
        pass
    impls["ours"] = ours
    if not features:  # timm builds for one size; the backbone case (800x1333) is not one it can take
        try:
            size = {} if tuple(case.size) == tuple(swin.get_config(case.arch).img_size) else {"img_size": case.size}
            for fused in (False, True):
                model = timm.create_model(_timm_name(case.arch), drop_path_rate=0.0, **size)
                model.load_state_dict(export(ours.state_dict(), target="timm"))
                for module in model.modules():
                    if hasattr(module, "fused_attn"):
                        module.fused_attn = fused
                impls["timm-fused" if fused else "timm"] = model
        except Exception as error:  # a model timm does not have, or cannot build at this size
            print(f"  {case.name}: timm left out ({type(error).__name__}: {error})", file=sys.stderr)
    for model in impls.values():
        model.to(device).train(case.kind == "train")
    if ways:
        from .bench_ways import peer_way

        for name in [n for n in ("timm-fused", "torchvision") if n in impls]:
            for way in ways:
                if way != "eager":
                    impls[f"{name} {way}"] = peer_way(impls[name], way, device)
        impls["ours-optimized"] = swin.optimize(copy.deepcopy(ours))
    if compile:
        impls = {name: torch.compile(model) for name, model in impls.items()} | {"ours-eager": ours}
    if unchunked:
        impls["ours-unchunked"] = _Unchunked(ours)
    return impls


def _runner(model: torch.nn.Module, case: Case, name: str, device: str) -> Callable[[torch.Tensor], None]:
    autocast = (
        torch.autocast(device.split(":")[0], dtype=case.dtype)
        if case.dtype != torch.float32
        else contextlib.nullcontext()
    )

    def step(x: torch.Tensor) -> None:
        if case.kind == "train":
            with autocast:
                out = model(x)
            out = out if isinstance(out, torch.Tensor) else sum(o.float().mean() for o in out)
            out.float().mean().backward()
            model.zero_grad(set_to_none=True)
        else:
            with torch.inference_mode(), autocast:
                model(x)
        _sync(device)

    return step


def run_case(
    case: Case,
    rounds: int = 5,
    warmup: int = 2,
    device: str = "cpu",
    compile: bool = False,
    unchunked: bool = False,
    ways: tuple[str, ...] = (),
) -> Result:
    impls = _implementations(case, device, compile, unchunked, ways)
    x = torch.randn(case.batch, 3, *case.size, device=device)
    runners = {name: _runner(model, case, name, device) for name, model in impls.items()}
    samples: dict[str, list[float]] = {name: [] for name in runners}
    first_calls: dict[str, float] = {}
    for name, run in runners.items():
        start = time.perf_counter()
        run(x)  # the first call compiles what is compiled
        result_first = time.perf_counter() - start
        if (
            name == "ours-optimized"
            or " compiled" in name
            or (compile and name not in ("ours-eager", "ours-unchunked"))
        ):
            first_calls[name] = result_first
        for _ in range(warmup - 1):
            run(x)
    faults: dict[str, list[int]] = {name: [] for name in runners}
    for _ in range(rounds):
        for name, run in runners.items():
            before = _page_faults()
            start = time.perf_counter()
            run(x)
            samples[name].append(time.perf_counter() - start)
            faults[name].append(_page_faults() - before)
    result = Result(case.name, {name: statistics.median(values) for name, values in samples.items()})
    if _page_faults() >= 0:
        result.faults = {name: int(statistics.median(values)) for name, values in faults.items()}
    result.extra.update({f"first call s: {name}": seconds for name, seconds in first_calls.items()})
    if "ours-optimized" in impls and case.kind == "eval":
        with torch.inference_mode():
            reference, fast = impls["ours"](x), impls["ours-optimized"](x)
        result.extra["optimized_relative_error"] = _relative_error(fast, reference)
    if case.dtype != torch.float32 and case.kind == "eval":
        with torch.inference_mode():
            reference = impls["ours"](x)
            with torch.autocast(device.split(":")[0], dtype=case.dtype):
                low = impls["ours"](x)
        result.extra["relative_error"] = _relative_error(low, reference)
    return result


def _page_faults() -> int:
    """Minor page faults of this process so far (-1 where ``resource`` is missing, as on Windows): a call that
    takes back memory the allocator handed to the OS after the previous one faults once per 4 KiB page
    (docs/PERFORMANCE.md, "memory handed back between calls")."""
    try:
        import resource
    except ImportError:
        return -1
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _relative_error(output: torch.Tensor, reference: torch.Tensor) -> float:
    """Norm of the difference over the norm of the reference (float32)."""
    return ((output.float() - reference.float()).norm() / reference.float().norm()).item()


def profile_case(case: Case, rounds: int = 3, device: str = "cpu", top: int = 12) -> str:
    """Where our time goes in ``case``: torch.profiler over ``rounds`` calls after a warm-up, ops by self time,
    as a markdown table with each op's share of the total."""
    from torch.profiler import ProfilerActivity, profile

    model = _implementations(case, device)["ours"]
    run = _runner(model, case, "ours", device)
    x = torch.randn(case.batch, 3, *case.size, device=device)
    run(x)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with profile(activities=activities) as prof:
        for _ in range(rounds):
            run(x)
    events = [e for e in prof.key_averages() if e.self_device_time_total or e.self_cpu_time_total]
    key = "self_device_time_total" if device.startswith("cuda") else "self_cpu_time_total"
    total = sum(getattr(e, key) for e in events) or 1
    lines = [f"{case.name}: ours, {rounds} calls profiled", "", "| op | share | ms per call |", "|---|---|---|"]
    for e in sorted(events, key=lambda e: -getattr(e, key))[:top]:
        lines.append(f"| {e.key} | {100 * getattr(e, key) / total:.1f}% | {getattr(e, key) / 1e3 / rounds:.1f} |")
    return "\n".join(lines)


DEFAULT_CASES = [
    Case("swin_t eval b1 224 fp32", "swin_t", 1, (224, 224)),
    Case("swin_t eval b8 224 fp32", "swin_t", 8, (224, 224)),
    Case("swin_t eval b8 224 bf16", "swin_t", 8, (224, 224), torch.bfloat16),
    Case("swin_b eval b1 224 fp32", "swin_b", 1, (224, 224)),
    Case("swin_b eval b8 224 fp32", "swin_b", 8, (224, 224)),
    Case("swin_t backbone b1 800x1333 fp32", "swin_t", 1, (800, 1333), kind="features"),
    Case("swin_t train b8 224 fp32", "swin_t", 8, (224, 224), kind="train"),
]


def _selected_cases(args) -> list[Case]:
    """``--model`` makes one case of any registered model; otherwise the default cases (``--only`` filters)."""
    if args.model:
        import swin

        arch = swin.get_config(args.model).name  # a clear error for an unknown name
        size = _parse_size(args.img_size) if args.img_size else swin.get_config(arch).img_size
        batch = args.batch or 8
        kind, dtype_name = args.kind or "eval", args.dtype or "fp32"
        dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
        name = f"{arch} {kind} b{batch} {size[0]}x{size[1]} {dtype_name}"
        return [Case(name, arch, batch, tuple(size), dtype, kind)]
    cases = [c for c in DEFAULT_CASES if not args.only or any(s in c.name for s in args.only)]
    if not cases:
        names = "; ".join(c.name for c in DEFAULT_CASES)
        raise ValueError(f"--only {' '.join(args.only)}: no case's name contains that; the cases are: {names}")
    if args.device.startswith("cuda"):
        batch = args.batch or 64  # the b8 cases only; b1 and the backbone stay as they are
        cases = [
            Case(c.name.replace("b8", f"b{batch}"), c.arch, batch, c.size, c.dtype, c.kind) if c.batch == 8 else c
            for c in cases
        ]
    return cases


def _parse_size(text: str) -> tuple[int, int]:
    parts = text.split(",")
    if len(parts) not in (1, 2) or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"--img-size must be H or H,W in pixels (e.g. 224 or 800,1333), got {text!r}")
    sizes = [int(p) for p in parts]
    return (sizes[0], sizes[-1])


def _selected_ways(args) -> tuple[str, ...]:
    from .bench_ways import WAYS, ways_for_machine

    if not args.ways:
        return ()
    if args.ways == ["auto"]:
        return ways_for_machine(args.device)
    if args.ways == ["all"]:
        return WAYS
    unknown = [w for w in args.ways if w not in WAYS]
    if unknown:
        raise ValueError(f"--ways: unknown {', '.join(unknown)}; choose from auto, all, {', '.join(WAYS)}")
    return tuple(args.ways)


def cmd_bench(args) -> int:
    if args.rounds < 1:
        raise ValueError(f"--rounds must be at least 1 (the median of that many interleaved rounds), got {args.rounds}")
    if args.batch is not None and args.batch < 1:
        raise ValueError(f"--batch must be at least 1, got {args.batch}")
    if args.batch is not None and not args.model and not args.device.startswith("cuda"):
        raise ValueError("--batch sets the batch of a --model case (or of the b8 cases with --device cuda)")
    given = [
        option
        for option, value in (("--img-size", args.img_size), ("--kind", args.kind), ("--dtype", args.dtype))
        if value
    ]
    if given and not args.model:
        raise ValueError(f"{', '.join(given)} describe(s) a --model case; add --model NAME (e.g. --model swin_t)")
    if args.only is not None and args.model:
        raise ValueError("--only picks among the default cases; --model makes one case of its own: use one of them")
    import swin

    from .machine import describe, machine_info

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("swin bench: --device cuda but no CUDA device is available", file=sys.stderr)
        return 2
    cases = _selected_cases(args)
    ways = _selected_ways(args)
    if ways and args.compile:
        raise ValueError("--ways already includes compiled peers and ours optimized; leave out --compile")
    machine = machine_info(args.device)
    print(describe(machine), file=sys.stderr)
    if args.profile:
        for case in cases:
            print(profile_case(case, device=args.device))
        return 0
    from swin.optimized import fastest_dtype

    dtypes = dict.fromkeys((torch.float32, torch.bfloat16, fastest_dtype(args.device)))
    rate = {str(dt).split(".")[-1]: matmul_rate(dt, device=args.device) for dt in dtypes}
    print(
        f"matrix multiply (1024^3): float32 {rate['float32'] / 1e9:.0f} GFLOP/s, "
        f"bfloat16 {rate['bfloat16'] / 1e9:.0f} GFLOP/s; {args.rounds} rounds, medians",
        file=sys.stderr,
    )
    if ways:
        print(f"peer ways: {', '.join(ways)} (see tools/bench_ways.py); ours also optimized", file=sys.stderr)
    rows = []
    for case in cases:
        result = run_case(
            case,
            args.rounds,
            device=args.device,
            compile=args.compile,
            unchunked=args.unchunked,
            ways=ways if case.kind != "train" else (),  # swin.optimize and the ways are for inference
        )
        ours = result.times["ours"]
        timm_best = min((v for k, v in result.times.items() if k in ("timm", "timm-fused")), default=None)
        row = {"case": case.name, "ms": {k: round(v * 1e3, 2) for k, v in result.times.items()}}
        if timm_best is not None:
            row["speedup_vs_timm"] = round(timm_best / ours, 3)
        if "torchvision" in result.times:
            row["speedup_vs_torchvision"] = round(result.times["torchvision"] / ours, 3)
        if "ours-unchunked" in result.times:
            row["chunking_gain"] = round(result.times["ours-unchunked"] / ours, 3)
        if "ours-eager" in result.times:
            row["compile_gain"] = round(result.times["ours-eager"] / ours, 3)
        peers = {k: v for k, v in result.times.items() if k.startswith(("timm", "torchvision"))}
        if "ours-optimized" in result.times and peers:
            fastest = min(peers, key=peers.get)
            row["fastest_peer"] = fastest
            row["optimized_vs_fastest_peer"] = round(peers[fastest] / result.times["ours-optimized"], 3)
        if case.kind == "eval":
            macs = swin.flops(case.arch, img_size=case.size, measure=False)["macs"]["analytic"] * case.batch
            floor = 2 * macs / rate[str(case.dtype).split(".")[-1]]
            row["floor_ms"] = round(floor * 1e3, 2)
            row["over_floor"] = round(ours / floor, 2)
            if "ours-optimized" in result.times:
                from swin.optimized import fastest_dtype

                fast_floor = 2 * macs / rate[str(fastest_dtype(args.device)).split(".")[-1]]
                row["optimized_over_floor"] = round(result.times["ours-optimized"] / fast_floor, 2)
        row.update({k: float(f"{v:.3g}") for k, v in result.extra.items()})
        if result.faults:
            row["page_faults"] = result.faults
        rows.append(row)
        print(_format_row(row), file=sys.stderr)
    if args.format == "json":
        rates = {k: round(v / 1e9, 1) for k, v in rate.items()}
        print(json.dumps({"machine": machine, "matmul_gflops": rates, "cases": rows}, indent=2))
    else:
        print(describe(machine))
        print(
            f"matrix multiply (1024^3): float32 {rate['float32'] / 1e9:.0f} GFLOP/s, "
            f"bfloat16 {rate['bfloat16'] / 1e9:.0f} GFLOP/s; {args.rounds} rounds, medians"
        )
        print()
        print(_table(rows))
        if any("fastest_peer" in r for r in rows):
            print()
            print(_ways_table(rows))
            for r in rows:
                print(_format_row(r).replace("  ", "- ", 1))
    return 0


def _format_row(row: dict) -> str:
    times = ", ".join(f"{k} {v} ms" for k, v in row["ms"].items())
    error = f"; relative error of ours against float32 {row['relative_error']}" if "relative_error" in row else ""
    if "optimized_relative_error" in row:
        error += f"; ours optimized against ours eager: relative error {row['optimized_relative_error']}"
    firsts = ", ".join(f"{k.removeprefix('first call s: ')} {v:.2f} s" for k, v in row.items() if k.startswith("first"))
    firsts = f"; first call (compiles): {firsts}" if firsts else ""
    faults = ", ".join(f"{k} {v}" for k, v in row.get("page_faults", {}).items())
    faults = f"; page faults per call: {faults}" if faults else ""
    return f"  {row['case']}: {times}{error}{firsts}{faults}"


# Optional columns: (implementation whose time is shown, ratio key, header).
_BASELINES = (
    ("ours-eager", "compile_gain", "ours eager ms | compile gain"),
    ("ours-unchunked", "chunking_gain", "ours unchunked ms | chunking gain"),
)


def _table(rows: list[dict]) -> str:
    extra = [b for b in _BASELINES if any(b[0] in r["ms"] for r in rows)]
    header = "| case | ours ms | timm ms (best) | torchvision ms | vs timm | vs torchvision | floor ms | ours/floor |"
    header += "".join(f" {title} |" for *_, title in extra)
    errors = any("relative_error" in r for r in rows)
    header += " low-precision logits: relative error |" if errors else ""
    lines = [header, "|---" * (header.count("|") - 1) + "|"]
    for r in rows:
        ms = r["ms"]
        timm_ms = min((v for k, v in ms.items() if k in ("timm", "timm-fused")), default=None)
        line = (
            f"| {r['case']} | {ms['ours']} | {timm_ms if timm_ms is not None else '-'} | {ms.get('torchvision', '-')} "
            f"| {r.get('speedup_vs_timm', '-')}x | {r.get('speedup_vs_torchvision', '-')}x "
            f"| {r.get('floor_ms', '-')} | {r.get('over_floor', '-')} |"
        )
        line += "".join(f" {ms.get(name, '-')} | {r.get(ratio, '-')}x |" for name, ratio, _ in extra)
        if errors:
            line += f" {r.get('relative_error', '-')} |"
        lines.append(line)
    return "\n".join(lines)


def _ways_table(rows: list[dict]) -> str:
    """Every implementation and way, ms, and ours optimized against the fastest of the peers."""
    names = list(dict.fromkeys(k for r in rows for k in r["ms"]))
    header = "| case | " + " | ".join(f"{n} ms" for n in names)
    header += " | fastest peer | optimized vs it | optimized/floor |"
    lines = [header, "|---" * (header.count("|") - 1) + "|"]
    for r in rows:
        cells = " | ".join(str(r["ms"].get(n, "-")) for n in names)
        lines.append(
            f"| {r['case']} | {cells} | {r.get('fastest_peer', '-')} | {r.get('optimized_vs_fastest_peer', '-')}x "
            f"| {r.get('optimized_over_floor', '-')} |"
        )
    return "\n".join(lines)


def register(sub) -> None:
    p = sub.add_parser("bench", help="time ours against timm and torchvision (same weights, interleaved)")
    p.add_argument("--only", nargs="*", help="run only cases whose name contains one of these strings")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds per case; the median is shown (default 5)")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument(
        "--batch", type=int, help="batch of the --model case (default 8); on CUDA, of the b8 cases (default 64)"
    )
    p.add_argument("--model", help="time this registered model instead of the default cases (e.g. swinv2_t_w8)")
    p.add_argument("--img-size", help="with --model: H or H,W in pixels (default: the model's own)")
    p.add_argument(
        "--kind",
        choices=("eval", "features", "train"),
        help="with --model: classifier inference (default), backbone features, or a training step",
    )
    p.add_argument("--dtype", choices=("fp32", "bf16"), help="with --model: fp32 (default) or bf16 (autocast for all)")
    p.add_argument(
        "--ways",
        nargs="+",
        metavar="WAY",
        help="also run the peers these ways and ours optimized (swin.optimize): eager, autocast, bf16, compiled "
        "(torch.compile with freezing); 'auto' (those that can be fastest on this machine) or 'all'",
    )
    p.add_argument("--format", choices=("table", "json"), default="table", help="output format (default: table)")
    p.add_argument(
        "--compile",
        action="store_true",
        help="run every implementation under torch.compile (ours also eager, for what compiling gains)",
    )
    p.add_argument("--profile", action="store_true", help="instead of timing: where our time goes, by op")
    p.add_argument(
        "--unchunked", action="store_true", help="also time ours with chunked CPU inference off (what it gains)"
    )
    p.set_defaults(func=cmd_bench)
