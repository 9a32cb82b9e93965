"""Where compiled time goes: swin_t through ``swin.optimize`` against timm's (fused attention) compiled with
freezing, same weights, torch.profiler over 3 calls after warm-up, ops by self time per call.

    python docs/profile_compiled.py [BATCH]   # default 1; compiles both models first (a few minutes on 2 cores)
"""

from __future__ import annotations

import sys

import timm
import torch
from torch.profiler import profile

import swin
from swin.optimized import FrozenCompiled
from swin.weights import export


def main(batch: int = 1, top: int = 8) -> None:
    torch.manual_seed(0)
    ours = swin.create_model("swin_t").eval()
    peer = timm.create_model("swin_tiny_patch4_window7_224").eval()
    peer.load_state_dict(export(ours.state_dict(), target="timm"))
    for module in peer.modules():
        if hasattr(module, "fused_attn"):
            module.fused_attn = True
    runs = {"ours (swin.optimize)": swin.optimize(ours, dtype="float32"), "timm (fused, frozen)": FrozenCompiled(peer)}
    x = torch.randn(batch, 3, 224, 224)
    with torch.no_grad():
        for run in runs.values():
            for _ in range(3):
                run(x)
        for name, run in runs.items():
            with profile() as prof:
                for _ in range(3):
                    run(x)
            events = prof.key_averages()
            total = sum(e.self_cpu_time_total for e in events) / 3e3
            print(f"{name}, batch {batch}: {total:.1f} ms per call")
            for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:top]:
                print(f"  {e.key[:56]:56s} {e.self_cpu_time_total / 3e3:7.1f} ms  x{e.count // 3}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
