"""Shared helpers: reference models from timm / torchvision with the same random weights as ours; and isolation:
no test reads or writes the user's caches or configuration, nor inherits their network settings."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

# Before anything imports matplotlib or writes hypothesis's storage: a private directory per test process (each
# xdist worker makes its own, replacing the one its environment inherited from the controller) for
# matplotlib's configuration and font cache (else ~/.config/matplotlib and ~/.cache/matplotlib) and for
# hypothesis's storage (else .hypothesis/ in the checkout). Removed when the process ends (pytest_unconfigure).
_CREATED: list[str] = []  # temporary directories this process made, removed by this process at the end


def _make_dir(prefix: str) -> str:
    path = tempfile.mkdtemp(prefix=prefix)
    _CREATED.append(path)
    return path


def _remove_created() -> None:
    while _CREATED:
        shutil.rmtree(_CREATED.pop(), ignore_errors=True)


atexit.register(_remove_created)  # in case pytest_unconfigure never runs (an interrupted start-up)

_PROCESS_DIR = _make_dir("swin-tests-process-")
os.environ["MPLCONFIGDIR"] = os.path.join(_PROCESS_DIR, "matplotlib")
os.environ["HYPOTHESIS_STORAGE_DIRECTORY"] = os.path.join(_PROCESS_DIR, "hypothesis")

# The fused attention kernel (swin.layers.window_kernel) builds into torch's extension cache on first use: here
# a temporary one, never the user's. The first process to load this file makes it: under pytest-xdist that is
# the controller, before it starts the workers, so every worker inherits it and they share one cache (the
# kernel is built about once, and concurrent builds are safe: the loader renames finished builds into place).
# The process that made it removes it when it ends, after its workers.
if "TORCH_EXTENSIONS_DIR" not in os.environ:
    os.environ["TORCH_EXTENSIONS_DIR"] = _make_dir("swin-tests-extensions-")

import pytest  # noqa: E402
import torch  # noqa: E402

import swin  # noqa: E402
from swin.weights import convert  # noqa: E402

try:
    from hypothesis import settings
except ImportError:  # a test extra: the files that use it say so when they are collected
    pass
else:  # the same examples on every run: no random seed, no example database replaying earlier failures
    settings.register_profile("swin-tests", derandomize=True, database=None)
    settings.load_profile("swin-tests")


def pytest_unconfigure(config):
    _remove_created()


# Under pytest-xdist (the README's test command runs one worker per core) each worker gets its share of the
# cores, so that workers do not oversubscribe the machine with torch's intra-op threads.
if os.environ.get("PYTEST_XDIST_WORKER"):
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))

# Settings that would send a test elsewhere than its own caches and the loopback address, or offline.
NETWORK_ENV = (
    "SWIN_OFFLINE",
    "SWIN_DOWNLOAD_TIMEOUT",
    "SWIN_MAX_DOWNLOAD_BYTES",
    "HF_HUB_OFFLINE",
    "HF_ENDPOINT",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
)


def isolate_caches(monkeypatch, root) -> Path:
    """Empty caches under ``root`` (``SWIN_HOME``, ``HF_HOME``, ``HF_HUB_CACHE``) and no offline / mirror / token
    / proxy / limit settings from outside; returns the ``SWIN_HOME``. A test may still set its own."""
    for name in NETWORK_ENV:
        monkeypatch.delenv(name, raising=False)
    home = Path(root) / "swin_home"
    monkeypatch.setenv("SWIN_HOME", str(home))
    monkeypatch.setenv("HF_HOME", str(Path(root) / "hf_home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(Path(root) / "hf_hub"))
    return home


@pytest.fixture(autouse=True)
def swin_home(tmp_path_factory, monkeypatch):
    """Every test gets caches of its own (:func:`isolate_caches`), outside its tmp_path, which some tests list;
    tests/weights/conftest.py puts them in tmp_path."""
    return isolate_caches(monkeypatch, tmp_path_factory.mktemp("caches"))


@pytest.fixture(autouse=True)
def glibc_default_thresholds(monkeypatch):
    """Chunked inference as under glibc's defaults, whatever MALLOC_* the suite was started with (raised, the
    batch would run whole and the tests of pieces would test nothing); tests of the rule patch it themselves."""
    from swin.layers import allocator

    monkeypatch.setattr(allocator, "heap_keeps_blocks_up_to", lambda: 0)


@pytest.fixture(autouse=True)
def no_hub_registry_fetch(monkeypatch):
    """huggingface_hub 2.x fetches an "agent harness" registry from its import-time endpoint (huggingface.co)
    the first time it builds request headers; tests contact loopback only, so it gets an empty registry."""
    try:
        from huggingface_hub.utils import _detect_agent
    except ImportError:
        return
    if hasattr(_detect_agent, "_registry") and hasattr(_detect_agent, "_EMPTY_REGISTRY"):
        monkeypatch.setattr(_detect_agent, "_registry", _detect_agent._EMPTY_REGISTRY)


# Our registered name -> timm's name (timm is an independent implementation of the same architectures).
TIMM_NAMES = {name: swin.get_config(name).aliases[0] for name in swin.list_models()}


# SWIN_FULL_PARITY=1: parity tests build every model at its full depth (else the expensive ones at two blocks
# per stage, a regular and a shifted one: more blocks of the same stage prove nothing more).
FULL_PARITY = os.environ.get("SWIN_FULL_PARITY") == "1"


def parity_depths(name: str) -> dict:
    """Depth override for the S/B/L models unless SWIN_FULL_PARITY=1 (the T models run at full depth)."""
    return {} if FULL_PARITY or "_t" in name else {"depths": (2, 2, 2, 2)}


def timm_pair(
    name: str,
    depths: tuple[int, ...] | None = None,
    shape: dict | None = None,
    position_bias_std: float | None = None,
    **timm_kwargs,
):
    """A randomly initialised timm model and ours carrying its weights, both in eval mode (both built with
    ``depths`` and the arguments in ``shape`` when given; ``timm_kwargs`` for timm's alone).
    ``position_bias_std``: the position-bias tables drawn with this std instead (at their initial 0.02 the
    bias hardly changes the logits, so a test that must notice it being wrong draws them larger)."""
    import timm

    torch.manual_seed(0)
    shape = {**(shape or {}), **({} if depths is None else {"depths": depths})}
    reference = timm.create_model(TIMM_NAMES[name], **shape, **timm_kwargs).eval()
    if position_bias_std is not None:
        with torch.no_grad():
            for parameter_name, table in reference.named_parameters():
                if parameter_name.endswith("relative_position_bias_table"):
                    table.normal_(0, position_bias_std)
    ours = swin.create_model(name, **shape).eval()
    ours.load_state_dict(convert(reference.state_dict(), source="timm"))
    return reference, ours


@pytest.fixture
def seeded():
    torch.manual_seed(0)


@pytest.fixture
def one_thread():
    """Small models train several times faster on one thread than on a contended pool (the examples' tests)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def transformers_classifier_folder(folder: Path, names: list[str]):
    """A small transformers ``SwinForImageClassification`` (weights away from their initial values, classes
    ``names``) saved by its own ``save_pretrained`` in ``folder``, beside the ViT processor file microsoft's
    repositories carry (bicubic, a resize to 224, transformers' default 0.5 mean and std); returns the model."""
    import json

    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.SwinConfig(
        embed_dim=32,
        depths=[2, 2, 2, 2],
        num_heads=[1, 2, 4, 8],
        num_labels=len(names),
        id2label=dict(enumerate(names)),
    )
    model = transformers.SwinForImageClassification(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter), alpha=0.05)
    model.save_pretrained(folder)
    processor = {"image_processor_type": "ViTImageProcessor", "resample": 3, "size": 224}
    (Path(folder) / "preprocessor_config.json").write_text(json.dumps(processor))
    return model
