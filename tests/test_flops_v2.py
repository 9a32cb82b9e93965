"""Swin V2 MACs against the official SwinV2 table (MODELHUB.md, "FLOPs" there are multiply-adds)."""

from __future__ import annotations

import pytest
import torch

import swin
from swin.layers import PatchMerging, PatchMergingV2

# name: (GMACs, params in millions) as published for the 1000-class models.
PUBLISHED = {
    "swinv2_t_w8": (5.9, 28),
    "swinv2_t_w16": (6.6, 28),
    "swinv2_s_w8": (11.5, 50),
    "swinv2_s_w16": (12.6, 50),
    "swinv2_b_w8": (20.3, 88),
    "swinv2_b_w16": (21.8, 88),
    "swinv2_b_w12to16_256": (21.8, 88),
    "swinv2_b_w12to24_384": (54.7, 88),
    "swinv2_l_w12to16_256": (47.5, 197),
    "swinv2_l_w12to24_384": (115.4, 197),
}


@pytest.mark.parametrize("name, published", PUBLISHED.items())
def test_analytic_macs_match_the_official_table(name, published):
    gmacs, params_m = published
    r = swin.flops(name)
    # The official flops() formulas (V2 patch merging norms 2C), added up and rounded as the table prints them.
    assert round(r["macs"]["analytic"] / 1e9, 1) == gmacs
    assert r["macs"]["ideal"] == r["macs"]["analytic"]  # native sizes are window multiples
    assert round(r["params"] / 1e6) == params_m
    assert r["check"]["ok"] is True  # a counter watching the forward agrees within 1%


def test_v2_patch_merging_norms_the_2c_outputs():
    # Official V2: (H/2)(W/2) 4C 2C for the reduction + H W C / 2 for LayerNorm(2C); V1 norms the 4C inputs.
    h, w, c = 64, 64, 96
    assert PatchMergingV2(c).macs(h, w) == (h // 2) * (w // 2) * 4 * c * 2 * c + h * w * c // 2
    assert PatchMerging(c).macs(h, w) - PatchMergingV2(c).macs(h, w) == h * w * c // 2
    x = torch.randn(1, 7, 9, c)
    assert PatchMergingV2(c)(x).shape == (1, 4, 5, 2 * c)


def test_stage_rows_leave_the_position_mlp_out_as_the_total_does():
    """Measured per stage as in total: without V2's position bias MLP (once per window size; the official
    formulas leave it out), so each stage's measured attention is the official W-MSA count exactly and the MLP
    is reported on its own (225 table entries x (2x512 + 512 x heads) MACs per block, for window 8)."""
    report = swin.flops("swinv2_t_w8")
    stages = report["stages"]
    assert [s["wmsa_macs_measured"] for s in stages] == [s["wmsa_macs_padded"] for s in stages]
    config = swin.get_config("swinv2_t_w8")
    expected = sum(d * 15 * 15 * (2 * 512 + 512 * h) for d, h in zip(config.depths, config.num_heads, strict=True))
    assert report["check"]["position_bias_mlp_macs"] == expected
