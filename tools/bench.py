"""``swin bench``: ours against timm and torchvision, same architecture and weights, one process, interleaved.

Every case runs each implementation once per round, in turn (A B C A B C ...), after a warm-up; the
reported time is the median over rounds and the ratio is peer time over ours, so drifts of a noisy
machine hit every implementation alike. Each peer runs in its fastest documented setting: timm both with
its fused attention off (its default for Swin) and on (where its model has the flag), keeping the faster; with
``--ways`` each peer also runs the ways of tools/bench_ways.py, in the reduced precision ours optimized runs in.
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
    if device == "cpu" and torch.backends.mkldnn.is_available() and dtype in (torch.float32, torch.bfloat16):
        try:  # oneDNN has no kernel for some dtypes on some CPUs (bfloat16 on AVX2-only ones): ATen's rate alone
            _onednn_matmul(a, b)
            ways.append(lambda: _onednn_matmul(a, b))
        except RuntimeError:
            pass
    times = {way: [] for way in ways}
    for _ in range(rounds + 2):
        for way in ways:
            start = time.perf_counter()
            way()
            _sync(device)
            times[way].append(time.perf_counter() - start)
    return 2 * size**3 / min(statistics.median(t[2:]) for t in times.values())


def _onednn_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(a, b, None, "none", [], "")


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

        previous, execution.ENABLED = execution.ENABLED, False
        try:
            return self.model(x)
        finally:
            execution.ENABLED = previous


def _torchvision_model(arch: str) -> torch.nn.Module:
    """torchvision's ``arch`` with stochastic depth off, as ours and timm are built (its default, 0.2 to 0.5, would
    make a training step do other, random work). LookupError, saying why, where torchvision cannot build it."""
    try:
        import torchvision
    except ImportError as error:
        raise LookupError("torchvision is not installed") from error
    if arch not in torchvision.models.list_models(module=torchvision.models):
        raise LookupError(f"torchvision has no {arch}")
    model = torchvision.models.get_model(arch)
    for module in model.modules():  # its builders fix the rate (no argument for it): turned off where it is used
        if isinstance(module, torchvision.ops.StochasticDepth):
            module.p = 0.0
    return model


def _timm_models(case: Case, ours: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """timm's model of ``case`` with ours's weights: with its fused attention off (``timm``, its default for Swin)
    and on (``timm-fused``, only where its modules have the flag: not Swin V2's). {} where timm cannot build it
    (said on stderr); an error loading our exported weights is raised, not hidden."""
    import timm

    import swin
    from swin.weights import export

    size = {} if tuple(case.size) == tuple(swin.get_config(case.arch).img_size) else {"img_size": case.size}
    try:
        model = timm.create_model(_timm_name(case.arch), drop_path_rate=0.0, **size)
    except Exception as error:  # a model timm does not have, or cannot build at this size
        print(f"  {case.name}: timm left out ({type(error).__name__}: {error})", file=sys.stderr)
        return {}
    weights, own = export(ours.state_dict(), target="timm"), model.state_dict()
    differ = [key for key, value in weights.items() if key in own and own[key].shape != value.shape]
    if differ:  # e.g. at another size timm clamps windows to the maps where ours keeps the configured window
        key = differ[0]
        print(
            f"  {case.name}: timm left out (its model at this size has other shapes: {key} "
            f"{tuple(own[key].shape)} against ours {tuple(weights[key].shape)})",
            file=sys.stderr,
        )
        return {}
    model.load_state_dict(weights)
    models = {"timm": model}
    if any(hasattr(module, "fused_attn") for module in model.modules()):
        models["timm-fused"] = copy.deepcopy(model)
    for name, each in models.items():
        for module in each.modules():
            if hasattr(module, "fused_attn"):
                module.fused_attn = name == "timm-fused"
    return models


# The peers as built (eager); --ways runs each of them each way, as "<peer> <way>".
_PEERS = ("timm", "timm-fused", "torchvision")


def _implementations(
    case: Case, device: str, compile: bool = False, unchunked: bool = False, ways: tuple[str, ...] = ()
) -> dict[str, Callable[[torch.Tensor], object]]:
    """Same weights everywhere: torchvision's random init (when it has the architecture) converted to ours,
    and ours exported to timm's layout. ``compile``: every implementation under ``torch.compile`` (each
    peer compiled too, so ratios stay like for like), and ours uncompiled as ``ours-eager`` for the gain.
    ``unchunked``: ours also with chunked inference off, as ``ours-unchunked``. ``ways``: each peer (timm with
    its fused attention off and on, torchvision) also runs each of those ways (tools/bench_ways.py), as
    ``timm <way>``, ``timm-fused <way>`` and ``torchvision <way>``, and ours also through :func:`swin.optimize`,
    as ``ours-optimized``."""
    import swin
    from swin.weights import convert

    torch.manual_seed(0)
    features = case.kind == "features"
    ours = swin.create_model(case.arch, features_only=features, drop_path_rate=0.0)
    impls: dict[str, torch.nn.Module] = {}
    try:
        tv = _torchvision_model(case.arch)
    except LookupError as error:
        print(f"  {case.name}: torchvision left out ({error})", file=sys.stderr)
    else:
        weights = convert(tv.state_dict(), source="torchvision")
        if features:
            weights = {k: v for k, v in weights.items() if not k.startswith(("norm.", "head."))}
        ours.load_state_dict(weights, strict=not features)
        impls["torchvision"] = tv.features if features else tv
    impls["ours"] = ours
    if not features:  # timm builds for one size; the backbone case (800x1333) is not one it can take
        impls.update(_timm_models(case, ours))
    for model in impls.values():
        model.to(device).train(case.kind == "train")
    if ways:
        from .bench_ways import peer_way

        for name in [n for n in _PEERS if n in impls]:
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
    """Where the time goes in ``case``, ours beside each peer (same weights and input): torch.profiler over
    ``rounds`` calls of each implementation after a warm-up call, self time per call of each op, as a markdown
    table of the ``top`` ops (by their largest time in any implementation) with ours's share of its total, and
    the totals. An op one implementation never calls shows 0."""
    from torch.profiler import ProfilerActivity, profile

    key = "self_device_time_total" if device.startswith("cuda") else "self_cpu_time_total"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    x = torch.randn(case.batch, 3, *case.size, device=device)
    models = _implementations(case, device)
    names = ["ours", *(name for name in _PEERS if name in models)]
    per_call: dict[str, dict[str, float]] = {}  # implementation -> op -> ms per call
    for name in names:
        run = _runner(models[name], case, name, device)
        run(x)
        with profile(activities=activities) as prof:
            for _ in range(rounds):
                run(x)
        per_call[name] = {e.key: getattr(e, key) / 1e3 / rounds for e in prof.key_averages() if getattr(e, key)}
    totals = {name: sum(ops.values()) for name, ops in per_call.items()}
    ops = sorted(
        {op for each in per_call.values() for op in each},
        key=lambda op: -max(each.get(op, 0.0) for each in per_call.values()),
    )[:top]
    lines = [
        f"{case.name}: self time per call by op, ms ({rounds} calls of each implementation profiled)",
        "",
        "| op | ours share | " + " | ".join(names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for op in ops:
        share = 100 * per_call["ours"].get(op, 0.0) / (totals["ours"] or 1)
        lines.append(f"| {op} | {share:.1f}% | " + " | ".join(f"{per_call[n].get(op, 0.0):.1f}" for n in names) + " |")
    lines.append("| total | 100% | " + " | ".join(f"{totals[n]:.1f}" for n in names) + " |")
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
        dtype = _DTYPES[dtype_name]
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
    alone = [w for w in ("auto", "all") if w in args.ways]
    if alone and len(args.ways) > 1:
        raise ValueError(
            f"--ways {' '.join(args.ways)}: {alone[0]} picks the ways itself and must be given alone "
            f"(--ways {alone[0]}), or name the ways without it: {', '.join(WAYS)}"
        )
    if alone:
        return ways_for_machine(args.device) if alone[0] == "auto" else WAYS
    unknown = [w for w in args.ways if w not in WAYS]
    if unknown:
        raise ValueError(f"--ways: unknown {', '.join(unknown)}; choose from auto, all, {', '.join(WAYS)}")
    return tuple(args.ways)


def _check_options(args) -> None:
    """Refuse values out of range, and options that would be ignored or would measure something else."""
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
    if args.compile and args.unchunked:
        raise ValueError(
            "--unchunked times ours eager, but --compile compiles ours (and compiled models are never chunked), so "
            "the gain shown would be compiling's: leave out one of them"
        )
    if args.profile:
        ignored = [
            option
            for option, value in (
                ("--compile", args.compile),
                ("--ways", args.ways),
                ("--unchunked", args.unchunked),
                ("--format json", args.format == "json"),
            )
            if value
        ]
        if ignored:
            raise ValueError(
                f"--profile profiles ours and the peers eager, by op, as a table; it does not take "
                f"{', '.join(ignored)}: leave them out, or leave out --profile to time the implementations"
            )


_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}  # --dtype's names


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).split(".")[-1]


def _rate_line(rate: dict[str, float], rounds: int) -> str:
    return (
        f"matrix multiply (1024^3): float32 {rate['float32'] / 1e9:.0f} GFLOP/s, "
        f"bfloat16 {rate['bfloat16'] / 1e9:.0f} GFLOP/s; {rounds} rounds, medians"
    )


def _floors(case: Case, rate: dict[str, float], device: str) -> tuple[float | None, float | None]:
    """Seconds an eval case's multiply-adds take at the matmul rate of its dtype, and at that of the dtype ours
    optimized runs in; (None, None) for the other kinds."""
    if case.kind != "eval":
        return None, None
    import swin
    from swin.optimized import fastest_dtype

    flop = 2 * swin.flops(case.arch, img_size=case.size, measure=False)["macs"]["analytic"] * case.batch
    return flop / rate[_dtype_name(case.dtype)], flop / rate[_dtype_name(fastest_dtype(device))]


def _row(case: str, times: dict[str, float], floor: float | None = None, optimized_floor: float | None = None) -> dict:
    """A case's row from the median seconds per implementation: ms, and each ratio as the other's time over ours
    (above 1: ours is faster). ``speedup_vs_timm`` is against the faster of timm's two eager settings;
    ``fastest_peer`` is the fastest of every peer's ways (never ours), against ours optimized. ``floor``,
    ``optimized_floor``: see :func:`_floors`. A ratio whose implementation did not run is left out."""
    ours = times["ours"]
    row: dict = {"case": case, "ms": {k: round(v * 1e3, 2) for k, v in times.items()}}
    against = {
        "speedup_vs_timm": min((v for k, v in times.items() if k in ("timm", "timm-fused")), default=None),
        "speedup_vs_torchvision": times.get("torchvision"),
        "chunking_gain": times.get("ours-unchunked"),
        "compile_gain": times.get("ours-eager"),
    }
    row.update({key: round(other / ours, 3) for key, other in against.items() if other is not None})
    peers = {k: v for k, v in times.items() if k.split(" ")[0] in _PEERS}
    if "ours-optimized" in times and peers:
        fastest = min(peers, key=peers.get)
        row["fastest_peer"] = fastest
        row["optimized_vs_fastest_peer"] = round(peers[fastest] / times["ours-optimized"], 3)
    if floor is not None:
        row["floor_ms"] = round(floor * 1e3, 2)
        row["over_floor"] = round(ours / floor, 2)
    if optimized_floor is not None and "ours-optimized" in times:
        row["optimized_over_floor"] = round(times["ours-optimized"] / optimized_floor, 2)
    return row


def cmd_bench(args) -> int:
    _check_options(args)
    from .machine import describe, machine_info

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(
            "swin bench: --device cuda but no CUDA device is available; run on the CPU with --device cpu",
            file=sys.stderr,
        )
        return 2
    cases = _selected_cases(args)
    ways = _selected_ways(args)
    if ways and args.compile:
        raise ValueError("--ways already includes compiled peers and ours optimized; leave out --compile")
    if ways and all(case.kind == "train" for case in cases):
        raise ValueError(
            "--ways runs inference (the peers' ways, ours optimized), not training steps; leave out --ways"
        )
    machine = machine_info(args.device)
    print(describe(machine), file=sys.stderr)
    if args.profile:
        for case in cases:
            print(profile_case(case, rounds=args.rounds, device=args.device))
        return 0
    from swin.optimized import fastest_dtype

    dtypes = dict.fromkeys((torch.float32, torch.bfloat16, fastest_dtype(args.device), *(c.dtype for c in cases)))
    rate = {_dtype_name(dt): matmul_rate(dt, device=args.device) for dt in dtypes}
    print(_rate_line(rate, args.rounds), file=sys.stderr)
    if ways:
        print(_ways_line(ways, cases, args.device), file=sys.stderr)
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
        row = _row(case.name, result.times, *_floors(case, rate, args.device))
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
        print(_rate_line(rate, args.rounds))
        print()
        print(_table(rows))
        if any("fastest_peer" in r for r in rows):
            print()
            print(_ways_table(rows))
            for r in rows:
                print(_format_row(r).replace("  ", "- ", 1))
    return 0


def _ways_line(ways: tuple[str, ...], cases: list[Case], device: str) -> str:
    from .bench_ways import reduced_dtype

    low = f"; autocast and bf16 in {_dtype_name(reduced_dtype(device))}" if {"autocast", "bf16"} & set(ways) else ""
    train = " (not for the training cases)" if any(case.kind == "train" for case in cases) else ""
    return f"peer ways: {', '.join(ways)}{low} (see tools/bench_ways.py); ours also optimized{train}"


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


def _ratio(row: dict, key: str) -> str:
    return f"{row[key]}x" if key in row else "-"


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
            f"| {_ratio(r, 'speedup_vs_timm')} | {_ratio(r, 'speedup_vs_torchvision')} "
            f"| {r.get('floor_ms', '-')} | {r.get('over_floor', '-')} |"
        )
        line += "".join(f" {ms.get(name, '-')} | {_ratio(r, ratio)} |" for name, ratio, _ in extra)
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
            f"| {r['case']} | {cells} | {r.get('fastest_peer', '-')} | {_ratio(r, 'optimized_vs_fastest_peer')} "
            f"| {r.get('optimized_over_floor', '-')} |"
        )
    return "\n".join(lines)


def register(sub) -> None:
    p = sub.add_parser("bench", help="time ours against timm and torchvision (same weights, interleaved)")
    p.add_argument("--only", nargs="*", help="run only cases whose name contains one of these strings")
    p.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="interleaved rounds per case; the median is shown (default 5); with --profile, the calls profiled",
    )
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
    p.add_argument(
        "--dtype",
        choices=tuple(_DTYPES),
        help="with --model: fp32 (default), bf16 or fp16 (autocast for all; fp16 for GPUs before Ampere)",
    )
    p.add_argument(
        "--ways",
        nargs="+",
        metavar="WAY",
        help="also run the peers (timm with fused attention off and on, torchvision) these ways and ours optimized "
        "(swin.optimize): eager, autocast, bf16 (float16 on CUDA devices without bf16), compiled (torch.compile "
        "with freezing); or, alone, 'auto' (those that can be fastest on this machine) or 'all'",
    )
    p.add_argument("--format", choices=("table", "json"), default="table", help="output format (default: table)")
    p.add_argument(
        "--compile",
        action="store_true",
        help="run every implementation under torch.compile (ours also eager, for what compiling gains)",
    )
    p.add_argument(
        "--profile", action="store_true", help="instead of timing: where the time goes, by op, ours beside the peers"
    )
    p.add_argument(
        "--unchunked", action="store_true", help="also time ours with chunked CPU inference off (what it gains)"
    )
    p.set_defaults(func=cmd_bench)
