"""CPU inference in pieces of a few images (swin.layers.execution) gives the independent implementations'
outputs, and is used only where it cannot be wrong.

The default budget (24 MiB for the largest intermediate) splits only large batches, so these tests shrink
it to 64 KiB: then every image runs alone, at sizes that are cheap to compare against timm and transformers.
"""

from __future__ import annotations

import pytest
import torch

import swin
import swin.trunk
from swin.layers import execution
from swin.weights import convert

from ..conftest import timm_pair
from ..test_backbone import _transformers_backbone
from ..test_parity_v2 import _timm_pair as timm_v2_pair

TOLERANCE = 1e-5


@pytest.fixture
def small_chunks(monkeypatch):
    """A 64 KiB budget, and a record of every decision the trunk took: (batch, images per piece)."""
    monkeypatch.setattr(execution, "CHUNK_BYTES", 64 * 2**10)
    decisions = []
    original = execution.image_chunks

    def spy(model, x, bytes_per_image):
        images = original(model, x, bytes_per_image)
        decisions.append((x.shape[0], x.shape[0] if images is None else images))
        return images

    monkeypatch.setattr(swin.trunk, "image_chunks", spy)
    return decisions


def _split(decisions) -> bool:
    return any(images < batch for batch, images in decisions)


def test_classifier_with_padding_and_shift_matches_timm(small_chunks):
    # 224x320: stage maps are not window multiples (the zero token is gathered) and shifted blocks mask.
    reference, ours = timm_pair("swin_t", img_size=(224, 320))
    x = torch.randn(3, 3, 224, 320, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected, got = reference(x), ours(x)
    assert small_chunks == [(3, 1)]
    assert (got - expected).abs().max().item() <= TOLERANCE


def test_pieces_give_the_whole_batch_values(small_chunks):
    _, ours = timm_pair("swin_t")
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        pieces = ours(x)
    assert _split(small_chunks)
    small_chunks.clear()
    with torch.enable_grad():  # autograd on: the whole batch at once
        whole = ours(x).detach()
    assert not _split(small_chunks)
    assert (pieces - whole).abs().max().item() <= 1e-5


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
        assert e.shape == g.shape
        assert (e - g).abs().max().item() <= TOLERANCE


def test_swin_v2_matches_timm(small_chunks):
    reference, ours = timm_v2_pair("swinv2_t_w8")
    x = torch.randn(2, 3, 256, 256, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected, got = reference(x), ours(x)
    assert _split(small_chunks)
    assert (got - expected).abs().max().item() <= TOLERANCE


@pytest.mark.parametrize("setting", ["grad", "train", "submodule train", "autocast", "hook", "global hook", "jit"])
def test_not_used_where_it_would_be_wrong(small_chunks, setting):
    """Under autograd, in training (DropPath is per sample; a submodule left in training mode, as in BatchNorm
    recalibration, may use batch statistics), under autocast, with forward hooks (they must see the whole batch
    once; FLOP counters attribute work through hooks) and under ``torch.jit.trace`` (which would record one
    batch size's pieces for every batch) the batch runs at once."""
    model = swin.create_model("swin_t", num_classes=10, depths=(2, 2, 2, 2)).eval()
    x = torch.randn(2, 3, 224, 224)
    seen = []
    if setting == "grad":
        model(x)
    elif setting == "train":
        with torch.no_grad():
            model.train()(x)
    elif setting == "submodule train":
        model.layers[1].blocks[0].mlp.train()
        with torch.no_grad():
            model(x)
    elif setting == "jit":
        with torch.no_grad():
            torch.jit.trace(model, x, check_trace=False)
    elif setting == "autocast":
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            model(x)
    elif setting == "hook":
        model.layers[0].blocks[1].mlp.register_forward_hook(lambda m, args, out: seen.append(out.shape))
        with torch.no_grad():
            model(x)
        assert seen == [(2, 56, 56, 96)]  # once, the whole batch
    else:
        handle = torch.nn.modules.module.register_module_forward_hook(lambda m, args, out: seen.append(m))
        try:
            with torch.no_grad():
                model(x)
        finally:
            handle.remove()
    assert small_chunks and not _split(small_chunks)


@pytest.mark.parametrize("batch,per_image,budget", [(8, 5 << 20, 24 << 20), (64, 1 << 20, 8 << 20), (7, 10, 1)])
def test_pieces_cover_the_batch_within_budget(monkeypatch, batch, per_image, budget):
    monkeypatch.setattr(execution, "CHUNK_BYTES", budget)
    model = torch.nn.Linear(1, 1).eval()
    with torch.no_grad():
        images = execution.image_chunks(model, torch.zeros(batch, 1), lambda: per_image) or batch
    pieces = -(-batch // images)
    assert 1 <= images <= batch
    assert images * per_image <= budget or images == 1
    assert (pieces - 1) * images < batch  # no empty last piece


@pytest.mark.parametrize("traced_batch,batch", [(3, 2), (1, 3)])
def test_a_jit_trace_serves_other_batch_sizes(small_chunks, traced_batch, batch):
    """``torch.jit.trace`` records the ops of one call: traced on a batch that eager would cut in pieces, or on
    one image (where attention views the shift mask per window), it must still compute any batch size, as
    timm's model does (the same weights; 224x224 with shifted, masked blocks)."""
    reference, ours = timm_pair("swin_t", shape={"depths": (2, 2), "num_heads": (3, 6)})
    with torch.no_grad():
        traced = torch.jit.trace(ours, torch.randn(traced_batch, 3, 224, 224), check_trace=False)
        x = torch.randn(batch, 3, 224, 224, generator=torch.Generator().manual_seed(6))
        assert (traced(x) - reference(x)).abs().max().item() <= TOLERANCE
