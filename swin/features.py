"""Which stage outputs a model offers, described the way timm describes them.

timm's detection and segmentation integrations read ``model.feature_info`` through ``channels()``,
``reduction()`` and ``module_name()``, and pick stages with ``feature_take_indices``' conventions (an int is
"the last n", negative indices count from the end). Both are small enough to keep here rather than import
timm (3.5 s) into every model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["FeatureInfo", "stage_info", "take_indices"]


class FeatureInfo(list):
    """One dict per stage (``num_chs``, ``reduction``, ``module``, ``index``), with timm's accessors.

    As timm's ``FeatureInfo``: indexing and ``len`` cover every stage; ``channels()``, ``reduction()``,
    ``module_name()``, ``get()`` and ``get_dicts()`` without ``idx`` answer for ``out_indices``, with an int
    ``idx`` for that stage, with a list for those stages.
    """

    def __init__(self, info: Sequence[dict[str, Any]], out_indices: Sequence[int]):
        super().__init__({**entry, "index": i} for i, entry in enumerate(info))
        self.out_indices = tuple(out_indices)

    def from_other(self, out_indices: Sequence[int]) -> FeatureInfo:
        return FeatureInfo([dict(entry) for entry in self], out_indices)

    def _select(self, idx: int | Sequence[int] | None) -> list[dict[str, Any]] | dict[str, Any]:
        if idx is None:
            return [self[i] for i in self.out_indices]
        if isinstance(idx, (list, tuple)):
            return [self[i] for i in idx]
        return self[idx]

    def get(self, key: str, idx: int | Sequence[int] | None = None) -> Any:
        chosen = self._select(idx)
        return [entry[key] for entry in chosen] if isinstance(chosen, list) else chosen[key]

    def get_dicts(self, keys: Sequence[str] | None = None, idx: int | Sequence[int] | None = None) -> Any:
        chosen = self._select(idx)
        pick = (lambda entry: entry) if keys is None else (lambda entry: {k: entry[k] for k in keys})
        return [pick(entry) for entry in chosen] if isinstance(chosen, list) else pick(chosen)

    def channels(self, idx: int | Sequence[int] | None = None) -> Any:
        return self.get("num_chs", idx)

    def reduction(self, idx: int | Sequence[int] | None = None) -> Any:
        return self.get("reduction", idx)

    def module_name(self, idx: int | Sequence[int] | None = None) -> Any:
        return self.get("module", idx)


def stage_info(embed_dim: int, patch_size: int, num_stages: int) -> list[dict[str, Any]]:
    """Channels, stride and module of each stage's output: C * 2^i at stride patch * 2^i, ``layers.i``."""
    return [
        {"num_chs": embed_dim * 2**i, "reduction": patch_size * 2**i, "module": f"layers.{i}"}
        for i in range(num_stages)
    ]


def take_indices(num_stages: int, indices: int | Sequence[int] | None) -> list[int]:
    """Stage indices to return: all for None, the last ``n`` for an int, else the given ones (negative from
    the end), as timm's ``feature_take_indices``."""
    if indices is None:
        indices = num_stages
    if isinstance(indices, int):
        if not 0 < indices <= num_stages:
            raise ValueError(f"indices={indices} asks for the last {indices} stages; the model has {num_stages}")
        return list(range(num_stages - indices, num_stages))
    chosen = []
    for i in indices:
        index = num_stages + i if i < 0 else i
        if not 0 <= index < num_stages:
            raise ValueError(f"stage index {i} is out of range for a model of {num_stages} stages")
        chosen.append(index)
    if not chosen:
        raise ValueError("indices is empty; pass None (all stages), an int n (the last n) or stage indices")
    return chosen
