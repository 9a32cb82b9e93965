"""Window partition and shift masks against timm's block (an independent implementation)."""

from __future__ import annotations

import pytest
import torch

from swin.layers import MASK_VALUE, shift_mask, window_partition, window_reverse


def test_partition_reverse_round_trip():
    x = torch.randn(2, 14, 21, 5)
    windows = window_partition(x, (7, 7))
    assert windows.shape == (2, 6, 49, 5)
    assert torch.equal(windows[0, 1], x[0, :7, 7:14].reshape(49, 5))  # row-major window order
    assert torch.equal(window_reverse(windows, (7, 7), 14, 21), x)


@pytest.mark.parametrize("resolution, window", [((56, 56), 7), ((28, 28), 7), ((24, 24), 12), ((14, 21), 7)])
def test_shift_mask_equals_timm(resolution, window):
    from timm.models.swin_transformer import SwinTransformerBlock

    block = SwinTransformerBlock(
        dim=8, input_resolution=resolution, num_heads=2, window_size=window, shift_size=window // 2
    )
    expected = block.attn_mask  # (nW, N, N), 0 / -100
    got = shift_mask(*resolution, (window, window), (window // 2, window // 2), torch.device("cpu"))
    assert torch.equal(got, expected)
    assert set(got.unique().tolist()) == {0.0, MASK_VALUE}
