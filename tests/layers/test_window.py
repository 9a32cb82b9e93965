"""Shift masks against timm's block (an independent implementation)."""

from __future__ import annotations

import pytest
import torch

from swin.layers import MASK_VALUE, shift_mask


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
