"""Inference on CPU in chunks (swin.layers.chunking) gives the independent implementations' outputs.

The default chunk budget (8 MiB) splits only large inputs (a stage-1 MLP at batch 8 and up), so these tests
shrink it to 64 KiB: then windows of one image are split across chunks, shifted blocks slice the merged
bias, and the MLP runs in row pieces, at sizes that are cheap to compare against timm and transformers.
"""

from __future__ import annotations

import pytest
import torch

import swin
import swin.layers.block as block_module
from swin.layers import chunking
from swin.weights import convert

from .conftest import timm_pair
from .test_backbone import _transformers_backbone
from .test_parity_v2 import _timm_pair as timm_v2_pair

TOLERANCE = 1e-5


@pytest.fixture
def small_chunks(monkeypatch):
    """A 64 KiB budget, and a record of every split the blocks asked for: (items, items per chunk)."""
    monkeypatch.setattr(chunking, "CHUNK_BYTES", 64 * 2**10)
    splits = []
    original = block_module.chunk_length

    def spy(total, bytes_per_item, budget=None):
        step = original(total, bytes_per_item, budget)
        splits.append((total, step))
        return step

    monkeypatch.setattr(block_module, "chunk_length", spy)
    return splits


def _split(splits) -> bool:
    return any(step < total for total, step in splits)


def test_classifier_with_padding_and_shift_matches_timm(small_chunks):
    # 224x320: stage maps are not window multiples (the zero token is gathered) and shifted blocks mask.
    reference, ours = timm_pair("swin_t", img_size=(224, 320))
    x = torch.randn(2, 3, 224, 320, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected, got = reference(x), ours(x)
    assert _split(small_chunks)
    assert (got - expected).abs().max().item() <= TOLERANCE


def test_chunks_give_the_unchunked_values(small_chunks):
    _, ours = timm_pair("swin_t")
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        chunked = ours(x)
    assert _split(small_chunks)
    small_chunks.clear()
    with torch.enable_grad():  # autograd on: the plain path
        plain = ours(x).detach()
    assert not small_chunks
    assert (chunked - plain).abs().max().item() <= 1e-6


def test_backbone_detection_semantics_match_transformers(small_chunks):
    reference = _transformers_backbone()
    ours = swin.create_model("swin_t", features_only=True).eval()
    weights = convert(reference.state_dict())
    del weights["norm.weight"], weights["norm.bias"]
    ours.load_state_dict(weights)
    x = torch.randn(2, 3, 97, 131, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = reference(x).feature_maps
        got = ours(x)
    assert _split(small_chunks)
    for e, g in zip(expected, got, strict=True):
        assert (e - g).abs().max().item() <= TOLERANCE


def test_swin_v2_matches_timm(small_chunks):
    reference, ours = timm_v2_pair("swinv2_t_w8")
    x = torch.randn(2, 3, 256, 256, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected, got = reference(x), ours(x)
    assert _split(small_chunks)
    assert (got - expected).abs().max().item() <= TOLERANCE


def test_inputs_handed_between_modules_are_not_modified(small_chunks):
    """The chunked blocks add residuals in place, but only into tensors they made themselves: what a
    forward hook was given must still hold the same values after the forward."""
    model = swin.create_model("swin_t", num_classes=10).eval()
    seen = []
    for module in model.modules():
        if isinstance(module, (swin.layers.SwinBlock, swin.layers.PatchMerging)):
            module.register_forward_pre_hook(lambda _, args: seen.append((args[0], args[0].clone())))
    with torch.no_grad():
        model(torch.randn(2, 3, 224, 224))
    assert _split(small_chunks) and len(seen) == 15
    for given, copy in seen:
        assert torch.equal(given, copy)


@pytest.mark.parametrize("setting", ["grad", "train", "autocast", "hook", "global hook"])
def test_not_used_where_it_would_be_wrong(small_chunks, setting):
    """Under autograd (pieces would be saved for backward), in training (DropPath is per sample), under
    autocast (in-place residuals would round to bfloat16) and with forward hooks inside a block (they must
    see whole tensors) blocks compute in one piece."""
    model = swin.create_model("swin_t", num_classes=10, depths=(2, 2, 2, 2)).eval()
    x = torch.randn(1, 3, 224, 224)
    seen = []
    if setting == "grad":
        model(x)
    elif setting == "train":
        with torch.no_grad():
            model.train()(x)
    elif setting == "autocast":
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            model(x)
    elif setting == "hook":
        model.layers[0].blocks[1].mlp.register_forward_hook(lambda m, args, out: seen.append(out.shape))
        with torch.no_grad():
            model(x)
        assert seen == [(1, 56, 56, 96)]  # once, whole (the other blocks may still chunk)
        return
    else:
        handle = torch.nn.modules.module.register_module_forward_hook(lambda m, args, out: seen.append(m))
        try:
            with torch.no_grad():
                model(x)
        finally:
            handle.remove()
    assert not any(step < total for total, step in small_chunks)


@pytest.mark.parametrize("total,bytes_per_item,budget", [(25088, 1536, 8 * 2**20), (64, 56448, 2**20), (7, 10, 1)])
def test_chunk_length_covers_everything_within_budget(total, bytes_per_item, budget):
    step = chunking.chunk_length(total, bytes_per_item, budget)
    pieces = -(-total // step)
    assert 1 <= step <= total
    assert step * bytes_per_item <= budget or step == 1
    assert (pieces - 1) * step < total  # no empty last chunk
