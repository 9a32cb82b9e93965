"""Space-to-depth merging in the official channel order, checked against timm's PatchMerging."""

from __future__ import annotations

import pytest
import torch

from swin.layers import PatchMerging


@pytest.mark.parametrize("size", [(8, 8), (7, 9)])
def test_matches_timm(size):
    from timm.models.swin_transformer import PatchMerging as TimmPatchMerging

    torch.manual_seed(0)
    reference = TimmPatchMerging(dim=6)
    ours = PatchMerging(6)
    ours.load_state_dict(reference.state_dict())
    x = torch.randn(2, *size, 6)
    out = ours(x)
    assert out.shape == (2, (size[0] + 1) // 2, (size[1] + 1) // 2, 12)
    assert torch.allclose(out, reference(x), atol=1e-6)


def test_official_quadrant_order():
    # Official: cat([x[0::2,0::2], x[1::2,0::2], x[0::2,1::2], x[1::2,1::2]], channels).
    merging = PatchMerging(1)
    merging.norm = torch.nn.Identity()
    merging.reduction = torch.nn.Identity()
    x = torch.arange(4.0).view(1, 2, 2, 1)  # [[0, 1], [2, 3]]
    assert merging(x).flatten().tolist() == [0.0, 2.0, 1.0, 3.0]
