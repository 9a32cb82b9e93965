"""Float32 linear layers on this CPU: ATen's ``F.linear`` (MKL's sgemm) against oneDNN's linear, at the shapes
swin_t runs (tokens x in -> out, per stage, at batch 1 and at the 8 images of a batch-8 call), in GFLOP/s
(medians of interleaved rounds), and whether ``swin.layers.linear_kernel`` chooses oneDNN here.

    python docs/linear_libraries.py [ROUNDS]   # default 7; about ten seconds
"""

from __future__ import annotations

import argparse
import statistics

from swin.tools.argtypes import whole_number

# swin_t: tokens per image 3136, 784, 196, 49 at C = 96, 192, 384, 768; per block qkv C->3C, proj C->C,
# fc1 C->4C, fc2 4C->C.
STAGES = ((3136, 96), (784, 192), (196, 384), (49, 768))


_positive = whole_number(1, says="expected a positive whole number")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """``[ROUNDS]``, checked before torch is imported."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "rounds", nargs="?", type=_positive, default=7, metavar="ROUNDS", help="timed rounds per shape (default 7)"
    )
    return p.parse_args(argv)


def main(rounds: int = 7) -> None:
    import torch

    from swin.layers import linear_kernel
    from swin.tools.machine import describe, machine_info

    print(describe(machine_info()))
    print(f"threads {torch.get_num_threads()}; oneDNN chosen by swin: {linear_kernel.onednn_pays()}\n")
    print("| images | stage | layer | tokens x in -> out | F.linear (ATen) GFLOP/s | oneDNN GFLOP/s | oneDNN / ATen |")
    print("|---|---|---|---|---|---|---|")
    torch.manual_seed(0)
    with torch.no_grad():
        for images in (1, 8):
            for stage, (tokens, c) in enumerate(STAGES, 1):
                for layer, (d_in, d_out) in {"qkv": (c, 3 * c), "fc1": (c, 4 * c), "fc2": (4 * c, c)}.items():
                    m = images * tokens
                    x, w, b = torch.randn(m, d_in), torch.randn(d_out, d_in), torch.randn(d_out)
                    times = linear_kernel.library_times(x, w, b, rounds)
                    rate = {k: 2 * m * d_in * d_out / statistics.median(v) / 1e9 for k, v in times.items()}
                    print(
                        f"| {images} | {stage} | {layer} | {m} x {d_in} -> {d_out} | {rate['aten']:.0f} | "
                        f"{rate['onednn']:.0f} | {rate['onednn'] / rate['aten']:.2f}x |"
                    )


if __name__ == "__main__":
    main(parse_args().rounds)
