"""Parameter counts from the configuration alone: arithmetic, no model built and no torch imported (so
``swin list`` is quick). Tests hold it to the built models and to timm's."""

from __future__ import annotations

from .config import SwinConfig

__all__ = ["count_parameters"]

# Swin V2's continuous position bias MLP: Linear(2, 512) with bias, ReLU, Linear(512, heads) without.
_CPB_HIDDEN = 512


def _linear(inputs: int, outputs: int, bias: bool = True) -> int:
    return inputs * outputs + (outputs if bias else 0)


def _block(config: SwinConfig, dim: int, heads: int, window: tuple[int, int]) -> int:
    hidden = int(dim * config.mlp_ratio)
    norms = 2 * 2 * dim
    mlp = _linear(dim, hidden) + _linear(hidden, dim)
    proj = _linear(dim, dim)
    if config.version == 1:
        table = (2 * window[0] - 1) * (2 * window[1] - 1) * heads
        attention = _linear(dim, 3 * dim, config.qkv_bias) + table + proj
    else:  # qkv without bias, separate q and v biases, a temperature per head, the position bias MLP
        biases = 2 * dim if config.qkv_bias else 0
        cpb = _linear(2, _CPB_HIDDEN) + _linear(_CPB_HIDDEN, heads, bias=False)
        attention = _linear(dim, 3 * dim, bias=False) + biases + heads + cpb + proj
    return norms + attention + mlp


def _merging(config: SwinConfig, dim: int) -> int:
    norm = 2 * (4 * dim if config.version == 1 else 2 * dim)  # V1 norms the 4C input, V2 the 2C output
    return _linear(4 * dim, 2 * dim, bias=False) + norm


def count_parameters(
    config: SwinConfig,
    semantics: str = "classification",
    features_only: bool = False,
    out_indices: tuple[int, ...] = (0, 1, 2, 3),
) -> int:
    """Parameters of the classifier ``create_model`` builds from ``config`` (head of ``num_classes``), or with
    ``features_only`` of the backbone (stages up to the last of ``out_indices``, a norm per output)."""
    c = config.embed_dim
    stages = max(out_indices) + 1 if features_only else len(config.depths)
    grid_h, grid_w = config.stage_sizes()[0]
    total = config.in_chans * c * config.patch_size**2 + c + (2 * c if config.patch_norm else 0)
    total += grid_h * grid_w * c if config.ape else 0
    windows = config.stage_windows(semantics)
    for i in range(stages):
        dim = c * 2**i
        total += config.depths[i] * _block(config, dim, config.num_heads[i], windows[i])
        total += _merging(config, dim) if i < stages - 1 else 0
    if features_only:
        return total + sum(2 * c * 2**i for i in out_indices)
    features = c * 2 ** (len(config.depths) - 1)
    head = _linear(features, config.num_classes) if config.num_classes > 0 else 0
    return total + 2 * features + head
