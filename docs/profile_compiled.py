"""Where compiled time goes: swin_t through ``swin.optimize`` against timm's (fused attention) compiled with
freezing, same weights, torch.profiler over 3 calls after warm-up, ops by self time per call. Inductor's own
kernels are timed one by one (``torch._inductor.config.cpp.enable_kernel_profile``) and summed into one line,
with the softmax kernels (attention run as matmuls and a softmax) apart.

    python docs/profile_compiled.py [BATCH] [DTYPE] [--top N]   # default 1 float32, top 8 ops
    python docs/profile_compiled.py 8 bfloat16                  # compiles both first (minutes on 2 cores)

DTYPE: float32 or bfloat16 (both models' weights cast to it, as ``swin bench --ways``' "compiled" way).
"""

from __future__ import annotations

import argparse

from swin.tools.argtypes import whole_number

DTYPES = ("float32", "bfloat16")


_positive = whole_number(1, says="expected a positive whole number")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """``[BATCH] [DTYPE] [--top N]``, checked before torch is imported or anything compiled."""
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog="Compiles both models first: minutes on 2 cores."
    )
    p.add_argument("batch", nargs="?", type=_positive, default=1, metavar="BATCH", help="batch size (default 1)")
    p.add_argument(
        "dtype",
        nargs="?",
        choices=DTYPES,
        default="float32",
        metavar="DTYPE",
        help=f"{' or '.join(DTYPES)}: both models' weights cast to it (default float32)",
    )
    p.add_argument("--top", type=_positive, default=8, metavar="N", help="ops listed per model (default 8)")
    return p.parse_args(argv)


def main(batch: int = 1, dtype: str = "float32", top: int = 8) -> None:
    import timm
    import torch
    import torch._inductor.config as inductor_config
    from torch.profiler import profile

    import swin
    from swin.optimized import FrozenCompiled
    from swin.tools.machine import describe, machine_info
    from swin.weights import export

    print(describe(machine_info()))  # the machine every table names
    torch.manual_seed(0)
    ours = swin.create_model("swin_t").eval()
    peer = timm.create_model("swin_tiny_patch4_window7_224").eval()
    peer.load_state_dict(export(ours.state_dict(), target="timm"))
    for module in peer.modules():
        if hasattr(module, "fused_attn"):
            module.fused_attn = True
    cast = getattr(torch, dtype)
    runs = {
        "ours (swin.optimize)": swin.optimize(ours, dtype=dtype),
        "timm (fused, frozen)": FrozenCompiled(peer.to(cast)),
    }
    x = torch.randn(batch, 3, 224, 224)
    inputs = {"ours (swin.optimize)": x, "timm (fused, frozen)": x.to(cast)}
    with torch.no_grad(), inductor_config.patch({"cpp.enable_kernel_profile": True}):
        for name, run in runs.items():
            for _ in range(3):
                run(inputs[name])
        for name, run in runs.items():
            with profile() as prof:
                for _ in range(3):
                    run(inputs[name])
            events = prof.key_averages()
            total = sum(e.self_cpu_time_total for e in events) / 3e3
            print(f"{name}, batch {batch}, {dtype}: {total:.1f} ms per call")
            generated = [e for e in events if e.key.startswith("graph_")]  # one event per inductor kernel
            rows = {e.key: (e.self_cpu_time_total / 3e3, e.count // 3) for e in events if e not in generated}
            if generated:
                softmax = [e for e in generated if "softmax" in e.key]
                rows["inductor kernels (generated code)"] = (
                    sum(e.self_cpu_time_total for e in generated) / 3e3,
                    sum(e.count for e in generated) // 3,
                )
                rows["  of which softmax kernels"] = (
                    sum(e.self_cpu_time_total for e in softmax) / 3e3,
                    sum(e.count for e in softmax) // 3,
                )
            for key, (ms, count) in sorted(rows.items(), key=lambda kv: -kv[1][0])[:top]:
                print(f"  {key[:56]:56s} {ms:7.1f} ms  x{count}")


if __name__ == "__main__":
    args = parse_args()
    main(args.batch, args.dtype, args.top)
