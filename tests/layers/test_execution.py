"""CPU inference in pieces of a few images (swin.layers.execution) gives the independent implementations'
outputs, and is used only where it cannot be wrong.

The default budget (24 MiB for the largest intermediate) splits only large batches, so these tests shrink
it to 64 KiB: then every image runs alone, at sizes that are cheap to compare against timm and transformers.
"""

from __future__ import annotations

import os

import pytest
import torch

import swin
import swin.trunk
from swin.layers import execution
from swin.layers.allocator import heap_keeps_blocks_up_to as _heap_keeps_blocks_up_to
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


@pytest.mark.parametrize(
    ("environment", "tunables", "keeps"),
    [
        ({}, "", 0),
        ({"MALLOC_MMAP_THRESHOLD_": "1000000000"}, "", 0),  # freed blocks still trimmed back to the kernel
        ({"MALLOC_MMAP_THRESHOLD_": "1000000000", "MALLOC_TRIM_THRESHOLD_": "1000000000"}, "", 10**9),
        ({"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "1000000000"}, "", 32 << 20),
        ({}, "glibc.malloc.mmap_threshold=0x4000000:glibc.malloc.trim_threshold=0x8000000", 64 << 20),
        ({"MALLOC_MMAP_THRESHOLD_": "lots", "MALLOC_TRIM_THRESHOLD_": "1000000000"}, "", 0),
        # a tunable of 0 is glibc's setting (every block mapped), not a missing one
        (
            {"MALLOC_MMAP_THRESHOLD_": "1000000000", "MALLOC_TRIM_THRESHOLD_": "1000000000"},
            "glibc.malloc.mmap_threshold=0:glibc.malloc.trim_threshold=1000000000",
            0,
        ),
    ],
)
def test_the_heap_keeps_blocks_up_to_both_glibc_thresholds(monkeypatch, environment, tunables, keeps):
    from swin.layers import allocator

    monkeypatch.setattr(allocator, "startup_environment", lambda: environment)
    monkeypatch.setenv("GLIBC_TUNABLES", tunables)
    assert allocator.read_heap_threshold() == keeps


@pytest.mark.parametrize(("keeps", "images"), [(0, 4), (32 << 20, 4), (48 << 20, None), (10**9, None)])
def test_a_heap_that_keeps_the_batchs_blocks_runs_it_whole(monkeypatch, keeps, images):
    """swin_t's batch of 8 at 224: 8 x 4.6 MiB MLP hidden tensors. Pieces of 4 images keep them under glibc's
    default mmap threshold; a heap that keeps 37 MiB blocks between calls gains nothing from them (measured on the
    AVX2 machine: pieces cost 5-9% at batch 8 there, docs/PERFORMANCE.md)."""
    from swin.layers import allocator

    monkeypatch.setattr(allocator, "heap_keeps_blocks_up_to", lambda: keeps)
    model = torch.nn.Linear(1, 1).eval()
    with torch.no_grad():
        assert execution.image_chunks(model, torch.zeros(8, 1), lambda: 3136 * 384 * 4) == images


def test_the_thresholds_are_read_as_the_process_started_and_trusted_where_glibc_took_them():
    """glibc reads them at start-up; the process's own /proc/self/environ is where they are read back, and a value
    above glibc's default cap counts only where a block of that size then stayed in the heap (older glibc
    releases ignore such a value). With glibc's defaults a 64 MiB block is always mapped."""
    import subprocess
    import sys

    code = (
        "from swin.layers import allocator; "
        "print(allocator.heap_keeps_blocks_up_to(), allocator._glibc_kept(64 << 20), allocator.read_heap_threshold())"
    )
    raised = {"MALLOC_MMAP_THRESHOLD_": "1000000000", "MALLOC_TRIM_THRESHOLD_": "900000000"}
    plain = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    for env in (plain, {**plain, **raised}):
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        keeps, kept, threshold = done.stdout.split()
        if env is plain:
            assert (keeps, kept, threshold) == ("0", "False", "0")
        else:
            assert threshold == "900000000" and keeps == ("900000000" if kept == "True" else "0")


def test_only_the_main_thread_keeps_large_blocks(monkeypatch):
    """glibc gives other threads heaps of their own, of at most 64 MiB: blocks above that are mapped fresh there
    whatever the thresholds, so a worker thread's batch keeps its pieces (a review measured 25,601 faults per call
    of a 100 MiB block in a thread, 0 in the main thread)."""
    import threading

    from swin.layers import allocator

    monkeypatch.setattr(allocator, "_main_heap_keeps", lambda: 10**9)
    seen = []
    worker = threading.Thread(target=lambda: seen.append(_heap_keeps_blocks_up_to()))  # not conftest's pin
    worker.start()
    worker.join()
    assert _heap_keeps_blocks_up_to() == 10**9 and seen == [0]
