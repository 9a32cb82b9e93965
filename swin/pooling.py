"""Global pooling before the classifier, with timm's ``global_pool`` names.

"avg" is Swin's (the official head averages the last map); "max", "avgmax" (the mean of both) and
"catavgmax" (both side by side, doubling the features) are timm's; "" keeps the map, so the classifier
scores every position. timm's "fast" spellings ("fast" and "fastavg" for "avg", "fastmax", "fastavgmax",
"fastcatavgmax") compute the same here and are kept as given.
"""

from __future__ import annotations

import torch

__all__ = ["POOLS", "check_pool", "pool", "pooled_features"]

POOLS = ("avg", "max", "avgmax", "catavgmax", "")
# timm's names for the same poolings by its flattening kernels: the same values here.
FAST = {"fast": "avg", "fastavg": "avg", "fastmax": "max", "fastavgmax": "avgmax", "fastcatavgmax": "catavgmax"}


def check_pool(global_pool: str | None) -> str:
    """``global_pool`` as one of :data:`POOLS` or timm's "fast" names (:data:`FAST`) ("avg" for None), or a
    ValueError listing them."""
    global_pool = "avg" if global_pool is None else global_pool
    if global_pool not in POOLS and global_pool not in FAST:
        raise ValueError(
            f"global_pool={global_pool!r} is not a pooling; use one of {', '.join(map(repr, POOLS))} (or timm's "
            f"{', '.join(map(repr, FAST))})"
        )
    return global_pool


def pooled_features(num_features: int, global_pool: str) -> int:
    """Width of the pooled vector: doubled by "catavgmax"."""
    return 2 * num_features if FAST.get(global_pool, global_pool) == "catavgmax" else num_features


def pool(x: torch.Tensor, global_pool: str) -> torch.Tensor:
    """(B, C, h, w) -> (B, C) (or (B, 2C) for "catavgmax"); "" returns the map unchanged."""
    global_pool = FAST.get(global_pool, global_pool)
    if global_pool == "":
        return x
    if global_pool == "avg":
        return x.mean(dim=(2, 3))
    peak = x.amax(dim=(2, 3))
    if global_pool == "max":
        return peak
    mean = x.mean(dim=(2, 3))
    return 0.5 * (mean + peak) if global_pool == "avgmax" else torch.cat((mean, peak), dim=1)
