"""timm's ``hf-hub:`` names: a timm model repository (config.json and weights in timm's layout), served by a
loopback server standing in for the hub, read by create_model as timm's create_model reads it."""

from __future__ import annotations

import io
import json

import pytest
import torch

import swin
from swin.weights import export
from swin.weights.download import DownloadError
from tests.weights.conftest import safetensors_bytes, tiny_swin_state

REPO = "someone/tiny-swin"
# tiny_swin_state's architecture, as timm's push_to_hf_hub describes a model (architecture, head, preprocessing)
MODEL_ARGS = {"embed_dim": 8, "depths": [1, 1, 1, 1], "num_heads": [1, 1, 1, 1], "img_size": 32, "window_size": 2}
PRETRAINED_CFG = {"input_size": [3, 32, 32], "interpolation": "bilinear", "crop_pct": 0.875, "mean": [0.5] * 3}
CONFIG = {
    "architecture": "swin_tiny_patch4_window7_224",
    "num_classes": 10,
    "num_features": 64,
    "global_pool": "avg",
    "model_args": MODEL_ARGS,
    "pretrained_cfg": {**PRETRAINED_CFG, "std": [0.5] * 3, "num_classes": 10, "classifier": "head.fc"},
}


@pytest.fixture
def hub_repo(server, monkeypatch):
    server.serve(f"/{REPO}/resolve/main/config.json", json.dumps(CONFIG).encode())
    server.serve(f"/{REPO}/resolve/main/model.safetensors", safetensors_bytes(export(tiny_swin_state(), "timm")))
    monkeypatch.setenv("HF_ENDPOINT", server.base)
    return server


def test_a_timm_hub_repository_builds_and_loads_as_timm_reads_it(hub_repo, tmp_path):
    """The reference: timm building the config's architecture with its model_args and loading the same weights
    file from disk (timm's own hf-hub: reading would reach its import-time endpoint, not this server)."""
    timm = pytest.importorskip("timm")
    ours = swin.create_model(f"hf-hub:{REPO}", pretrained=True).eval()
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(safetensors_bytes(export(tiny_swin_state(), "timm")))
    theirs = timm.create_model(
        CONFIG["architecture"],
        pretrained=True,
        pretrained_cfg_overlay={"file": str(weights), "num_classes": 10},  # its head is the file's
        num_classes=10,
        **MODEL_ARGS,
    ).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=1e-5)
    assert ours.num_classes == 10
    cfg = ours.pretrained_cfg
    assert (tuple(cfg["input_size"]), cfg["interpolation"], cfg["crop_pct"]) == ((3, 32, 32), "bilinear", 0.875)
    assert tuple(cfg["mean"]) == tuple(cfg["std"]) == (0.5, 0.5, 0.5)
    assert [r.path for r in hub_repo.log if r.method == "GET"] == [
        f"/{REPO}/resolve/main/config.json",
        f"/{REPO}/resolve/main/model.safetensors",
    ]


def test_without_pretrained_only_the_description_is_read(hub_repo):
    model = swin.create_model(f"hf-hub:{REPO}", num_classes=3)  # the caller's overrides win
    assert model.num_classes == 3 and model.config.embed_dim == 8
    assert [r.path for r in hub_repo.log if r.method == "GET"] == [f"/{REPO}/resolve/main/config.json"]


def test_bad_hub_names_and_repositories_are_named(server, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", server.base)
    with pytest.raises(ValueError, match="hf-hub:tiny-swin is not a hub repository; write hf-hub:OWNER/NAME"):
        swin.create_model("hf-hub:tiny-swin")
    with pytest.raises(ValueError, match="names its own weights: pass pretrained=True"):
        swin.create_model(f"hf-hub:{REPO}", pretrained="ms_in1k")
    with pytest.raises(DownloadError, match="config.json"):
        swin.create_model(f"hf-hub:{REPO}")  # nothing served
    server.serve(f"/{REPO}/resolve/main/config.json", b'{"num_classes": 3}')
    with pytest.raises(ValueError, match="config.json names no architecture"):
        swin.create_model(f"hf-hub:{REPO}")


def test_an_older_config_and_what_the_model_records(server, monkeypatch):
    """timm's older config.json is the pretrained_cfg itself beside the architecture (timm builds at its
    input_size and takes its preprocessing); an architecture with a tag is read without it, as timm; the model
    says where it came from and keeps the repository's class names instead of claiming ImageNet's."""
    labels = [f"class {i}" for i in range(10)]
    older = {"architecture": "swin_tiny_patch4_window7_224.custom", "num_classes": 10, "label_names": labels}
    sized_by_input_size = {key: value for key, value in MODEL_ARGS.items() if key != "img_size"}
    older |= {**PRETRAINED_CFG, "std": [0.5] * 3, "model_args": sized_by_input_size}
    server.serve(f"/{REPO}/resolve/v1/config.json", json.dumps(older).encode())
    monkeypatch.setenv("HF_ENDPOINT", server.base)
    model = swin.create_model(f"hf-hub:{REPO}@v1")
    cfg = model.pretrained_cfg
    assert model.config.img_size == (32, 32) and tuple(cfg["input_size"]) == (3, 32, 32)
    assert (cfg["interpolation"], cfg["crop_pct"], tuple(cfg["mean"])) == ("bilinear", 0.875, (0.5, 0.5, 0.5))
    assert (cfg["hf_hub_id"], cfg["source"], cfg["labels"], cfg["label_names"]) == (
        f"{REPO}@v1",
        "hf-hub",
        None,
        labels,
    )


def test_a_head_that_is_not_the_weights_is_an_error(server, monkeypatch):
    """A config whose num_classes is not its weights' head: timm's strict load raises on the size mismatch; here
    it loaded with a random head and a warning. A head asked for by the caller is still adapted."""
    server.serve(f"/{REPO}/resolve/main/config.json", json.dumps({**CONFIG, "num_classes": 5}).encode())
    server.serve(f"/{REPO}/resolve/main/model.safetensors", safetensors_bytes(export(tiny_swin_state(), "timm")))
    monkeypatch.setenv("HF_ENDPOINT", server.base)
    with pytest.raises(ValueError, match="head"):
        swin.create_model(f"hf-hub:{REPO}", pretrained=True)
    with pytest.warns(UserWarning):
        assert swin.create_model(f"hf-hub:{REPO}", pretrained=True, num_classes=3).num_classes == 3


def _gets(server) -> list[str]:
    return [r.path.rsplit("/", 1)[-1] for r in server.log if r.method == "GET"]


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"pretrained_cfg": None}, "config.json's pretrained_cfg is not a mapping"),
        ({"model_args": None}, "config.json's model_args is not a mapping"),
        ({"num_classes": "10"}, "config.json's num_classes is '10'"),
        ({"pretrained_cfg": {**CONFIG["pretrained_cfg"], "input_size": 5}}, "config.json's input_size is 5"),
        ({"pretrained_cfg": {**CONFIG["pretrained_cfg"], "crop_pct": 0}}, "config.json's crop_pct is 0"),
        ({"pretrained_cfg": {**CONFIG["pretrained_cfg"], "std": [0.5, 0, 0.5]}}, "config.json's std is"),
        ({"architecture": "resnet50"}, "describes 'resnet50', which is not a Swin architecture"),
        ({"model_args": {**MODEL_ARGS, "embed_dim": "8"}}, "config.json describes .* cannot be built: .*embed_dim"),
        ({"model_args": {**MODEL_ARGS, "embed_dim": 1 << 16}}, "config.json describes takes .* more than the"),
        ({"model_args": {**MODEL_ARGS, "device": "meta"}}, "model_args name device: where and how the model runs"),
    ],
)
def test_a_bad_description_is_named_before_any_weights_are_fetched(hub_repo, change, named):
    """Each value no model or transform takes is an error naming the repository's config.json entry (before:
    AttributeError, ZeroDivisionError, 'unknown model' and the like, some only at preprocessing time), raised
    before the weights are downloaded into the cache."""
    hub_repo.serve(f"/{REPO}/resolve/main/config.json", json.dumps({**CONFIG, **change}).encode())
    with pytest.raises(ValueError, match=f"hf-hub:{REPO}.*{named}"):
        swin.create_model(f"hf-hub:{REPO}", pretrained=True)
    assert _gets(hub_repo) == ["config.json"]


def test_a_description_without_a_head_is_timms_1000_classes(hub_repo, tmp_path):
    """timm's default head (1000 classes) where config.json names none: weights of another head are an error, as
    timm's strict load of the same file (here: a random head with a warning)."""
    timm = pytest.importorskip("timm")
    described = {key: value for key, value in CONFIG.items() if key != "num_classes"}
    described["pretrained_cfg"] = {k: v for k, v in CONFIG["pretrained_cfg"].items() if k != "num_classes"}
    hub_repo.serve(f"/{REPO}/resolve/main/config.json", json.dumps(described).encode())
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(safetensors_bytes(export(tiny_swin_state(), "timm")))  # a 10-class head
    with pytest.raises(RuntimeError, match="size mismatch"):
        timm.create_model(
            described["architecture"], pretrained=True, pretrained_cfg_overlay={"file": str(weights)}, **MODEL_ARGS
        )
    with pytest.raises(ValueError, match="head"):
        swin.create_model(f"hf-hub:{REPO}", pretrained=True)
    assert swin.create_model(f"hf-hub:{REPO}").num_classes == 1000


def test_what_is_recorded_is_what_timm_records(hub_repo):
    """The reference: timm's own parsing of the same config.json (hf_hub_id as written, the repository's
    free-form entries kept); where the weights are is never taken from the repository's description."""
    hub_models = pytest.importorskip("timm.models._hub")
    extra = {"license": "mit", "fixed_input_size": True, "test_input_size": [3, 48, 48], "notes": ["n"]}
    described = {**CONFIG, "pretrained_cfg": {**CONFIG["pretrained_cfg"], **extra, "file": "/etc/passwd"}}
    hub_repo.serve(f"/{REPO}/resolve/main/config.json", json.dumps(described).encode())
    for spec in (REPO, f"{REPO}@main"):
        expected, _, _ = hub_models._parse_model_cfg(json.loads(json.dumps(described)), {"hf_hub_id": spec})
        cfg = swin.create_model(f"hf-hub:{spec}").pretrained_cfg
        for key in ("hf_hub_id", *extra):
            assert cfg[key] == expected[key], key
        assert cfg.get("file") is None


@pytest.mark.parametrize("revision", ["../../../outside", "refs/../..", "a//b", "x\\y", ""])
def test_a_revision_that_could_leave_the_cache_is_refused(server, monkeypatch, tmp_path, revision):
    """The hub cache writes a revision's commit under refs/<revision>: '..' there would write outside it."""
    server.serve(f"/{REPO}/resolve/{revision}/config.json", json.dumps(CONFIG).encode())
    monkeypatch.setenv("HF_ENDPOINT", server.base)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ValueError, match="hf-hub:someone/tiny-swin@"):
        swin.create_model(f"hf-hub:{REPO}@{revision}")
    assert not server.log and not (tmp_path / "outside").exists()


def test_the_pickle_is_loaded_only_where_the_repository_has_no_safetensors(server, monkeypatch):
    """timm's order: model.safetensors, else pytorch_model.bin. A safetensors file the hub has but that could not
    be had (here: a transfer cut off) is an error; the pickle (other weights, maybe) was loaded instead."""
    monkeypatch.setenv("HF_ENDPOINT", server.base)
    server.serve(f"/{REPO}/resolve/main/config.json", json.dumps(CONFIG).encode())
    pickled = io.BytesIO()
    torch.save(export(tiny_swin_state(), "timm"), pickled)
    server.serve(f"/{REPO}/resolve/main/pytorch_model.bin", pickled.getvalue())
    body = safetensors_bytes(export(tiny_swin_state(), "timm"))
    server.serve(f"/{REPO}/resolve/main/model.safetensors", body, declared_length=len(body) + 1000)
    with pytest.raises(
        DownloadError,
        match="pytorch_model.bin was not loaded instead: that is done only where the hub answers it has no",
    ):
        swin.create_model(f"hf-hub:{REPO}", pretrained=True)
    assert "pytorch_model.bin" not in _gets(server)
    server.serve(f"/{REPO}/resolve/main/model.safetensors", b"", status=404)
    model = swin.create_model(f"hf-hub:{REPO}", pretrained=True)
    assert _gets(server)[-1] == "pytorch_model.bin" and model.pretrained_cfg["file"].endswith("pytorch_model.bin")


def test_a_cached_pickle_loads_while_the_hub_is_unreachable(server, monkeypatch):
    """A repository without safetensors, loaded once: with the hub unreachable (not offline mode) its cached
    pickle loads again, with a warning saying so (the unreachable hub read as 'the safetensors exists')."""
    monkeypatch.setenv("HF_ENDPOINT", server.base)
    server.serve(f"/{REPO}/resolve/main/config.json", json.dumps(CONFIG).encode())
    pickled = io.BytesIO()
    torch.save(export(tiny_swin_state(), "timm"), pickled)
    server.serve(f"/{REPO}/resolve/main/pytorch_model.bin", pickled.getvalue())
    first = swin.create_model(f"hf-hub:{REPO}", pretrained=True)
    server.serve(f"/{REPO}/resolve/main/config.json", b"", status=500)
    server.serve(f"/{REPO}/resolve/main/pytorch_model.bin", b"", status=500)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    http = pytest.importorskip("huggingface_hub.utils._http")
    monkeypatch.setattr(http.time, "sleep", lambda seconds: None)  # its retries' back-off: 20 s of waiting
    with pytest.warns(UserWarning, match="loading the pytorch_model.bin cached from an earlier download"):
        again = swin.create_model(f"hf-hub:{REPO}", pretrained=True)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(again.eval()(x), first.eval()(x), rtol=0, atol=0)


def test_the_callers_own_bad_override_is_theirs(hub_repo):
    """An unknown or mistyped override of the caller's raises as it does for a registered name (TypeError), not
    as the repository's config.json's fault."""
    for override in ({"foo": 1}, {"drop_path_rate": "x"}):
        with pytest.raises(TypeError) as registered:
            swin.create_model("swin_t", **override)
        with pytest.raises(TypeError) as hub:
            swin.create_model(f"hf-hub:{REPO}", **override)
        assert str(hub.value) == str(registered.value)


def test_a_repository_without_url_or_license_names_none(hub_repo):
    """timm's parsing gives no url and the repository's own license (none here); the default swin_t tag's GitHub
    url and MIT license were reported for it."""
    hub_models = pytest.importorskip("timm.models._hub")
    expected, _, _ = hub_models._parse_model_cfg(json.loads(json.dumps(CONFIG)), {"hf_hub_id": REPO})
    for features_only in (False, True):
        cfg = swin.create_model(f"hf-hub:{REPO}", features_only=features_only).pretrained_cfg
        assert (cfg["hf_hub_id"], cfg["url"], cfg["license"]) == (REPO, expected.get("url"), expected.get("license"))


def test_head_dropout_in_a_repository_is_no_warning_for_a_backbone(hub_repo):
    """A classifier's drop_rate in the repository's model_args means nothing to a backbone the caller builds
    from it; the warning is for a caller who asks for it."""
    import warnings

    described = {**CONFIG, "model_args": {**MODEL_ARGS, "drop_rate": 0.1}}
    hub_repo.serve(f"/{REPO}/resolve/main/config.json", json.dumps(described).encode())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        swin.create_model(f"hf-hub:{REPO}", features_only=True)
    assert swin.create_model(f"hf-hub:{REPO}").head_drop.p == 0.1
