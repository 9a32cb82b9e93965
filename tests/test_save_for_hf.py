"""``swin.save_for_hf`` writes the folder timm's ``save_for_hf`` writes, and ``local-dir:`` reads either.

The judge of the written folder is timm itself: ``timm.create_model("local-dir:FOLDER", pretrained=True)`` must
build the same network (its outputs equal ours) with the same preprocessing (``resolve_model_data_config``). A
folder timm wrote is read by ``swin.create_model("local-dir:FOLDER")`` into a model whose outputs equal timm's.
"""

from __future__ import annotations

import json

import pytest
import torch

import swin

timm = pytest.importorskip("timm")

SMALL = {"embed_dim": 32, "depths": (2, 2, 2, 2), "num_heads": (1, 2, 4, 8)}


def _plain(value):
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value


def _same_data_config(ours, theirs) -> None:
    a = timm.data.resolve_model_data_config(ours)
    b = timm.data.resolve_model_data_config(theirs)
    assert {k: _plain(v) for k, v in a.items()} == {k: _plain(v) for k, v in b.items()}


@pytest.mark.parametrize(
    ("name", "overrides"),
    [
        ("swin_t", {"num_classes": 7, "img_size": 256, "window_size": 8, **SMALL}),  # head, size and window
        ("swinv2_t_w8", {"num_classes": 5, "img_size": 192, **SMALL}),
        ("swin_t", {"num_classes": 3, "global_pool": "max", **SMALL}),
    ],
)
def test_timm_builds_the_saved_model(tmp_path, name, overrides):
    torch.manual_seed(0)
    model = swin.create_model(name, **overrides).eval()
    labels = [f"class {i}" for i in range(model.num_classes)]
    model.pretrained_cfg = {"crop_pct": 0.95, "mean": (0.5, 0.5, 0.5), "label_names": labels}
    assert swin.save_for_hf(model, tmp_path / "out") == tmp_path / "out"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["config.json", "model.safetensors"]
    theirs = timm.create_model(f"local-dir:{tmp_path / 'out'}", pretrained=True).eval()
    back = swin.create_model(f"local-dir:{tmp_path / 'out'}", pretrained=True).eval()
    x = torch.randn(2, 3, *model.config.img_size)
    with torch.no_grad():
        expected = model(x)
        torch.testing.assert_close(theirs(x), expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(back(x), expected, rtol=0, atol=0)
    _same_data_config(model, theirs)
    _same_data_config(back, theirs)
    assert theirs.pretrained_cfg["label_names"] == back.pretrained_cfg["label_names"] == labels
    assert back.pretrained_cfg["source"] == "local-dir" and back.pretrained_cfg["file"].endswith("model.safetensors")


@pytest.mark.parametrize("safe", [False, "both"])
def test_pickle_weights_as_timm_writes_them(tmp_path, safe):
    model = swin.create_model("swin_t", num_classes=4, **SMALL).eval()
    swin.save_for_hf(model, tmp_path, safe_serialization=safe)
    expected = {"config.json", "pytorch_model.bin"} | ({"model.safetensors"} if safe == "both" else set())
    assert {p.name for p in tmp_path.iterdir()} == expected
    theirs = timm.create_model(f"local-dir:{tmp_path}", pretrained=True).eval()
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(theirs(x), model(x), rtol=1e-5, atol=1e-5)


def test_a_folder_timm_wrote_is_read_as_timm_reads_it(tmp_path):
    from timm.models import save_for_hf

    torch.manual_seed(0)
    theirs = timm.create_model("swin_tiny_patch4_window7_224", num_classes=7, embed_dim=32, num_heads=(1, 2, 4, 8))
    theirs.eval()
    save_for_hf(theirs, tmp_path, safe_serialization=True)
    ours = swin.create_model(f"local-dir:{tmp_path}", pretrained=True).eval()
    described = swin.create_model(f"local-dir:{tmp_path}")  # the description alone: no weights read
    assert ours.num_classes == described.num_classes == 7 and ours.config.embed_dim == 32
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)
    _same_data_config(ours, theirs)


def test_what_timm_cannot_build_or_find_is_refused(tmp_path):
    with pytest.raises(TypeError, match="a backbone has no timm model"):
        swin.save_for_hf(swin.create_model("swin_t", features_only=True, **SMALL), tmp_path)
    with pytest.raises(ValueError, match="ape=True: timm's Swin has no argument for an absolute position embedding"):
        swin.save_for_hf(swin.create_model("swin_t", ape=True, **SMALL), tmp_path)
    with pytest.raises(ValueError, match="safe_serialization is 'yes'"):
        swin.save_for_hf(swin.create_model("swin_t", **SMALL), tmp_path, safe_serialization="yes")
    assert list(tmp_path.iterdir()) == []  # refused before anything was written
    with pytest.raises(FileNotFoundError, match="no such folder"):
        swin.create_model(f"local-dir:{tmp_path / 'missing'}")
    with pytest.raises(FileNotFoundError, match="holds no config.json"):
        swin.create_model(f"local-dir:{tmp_path}")
    (tmp_path / "config.json").write_text(json.dumps({"architecture": "swin_tiny_patch4_window7_224"}))
    assert swin.create_model(f"local-dir:{tmp_path}").num_classes == 1000  # timm's default head
    with pytest.raises(FileNotFoundError, match="no weights in the folder"):
        swin.create_model(f"local-dir:{tmp_path}", pretrained=True)


def test_one_channel_model_round_trips_with_one_mean(tmp_path):
    """A one-channel model reports ImageNet's three means, as timm's pretrained_cfg does (assigning back a copy
    of it works); the folder holds their average, as timm's save_for_hf writes it, and both libraries read it."""
    model = swin.create_model("swin_t", in_chans=1, num_classes=3, **SMALL).eval()
    model.pretrained_cfg = {**model.pretrained_cfg, "crop_pct": 1.0}
    swin.save_for_hf(model, tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())["pretrained_cfg"]
    assert written["mean"] == pytest.approx([0.449], abs=1e-6) and written["input_size"] == [1, 224, 224]
    theirs = timm.create_model(f"local-dir:{tmp_path}", pretrained=True).eval()
    back = swin.create_model(f"local-dir:{tmp_path}", pretrained=True).eval()
    x = torch.randn(1, 1, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(theirs(x), model(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(back(x), model(x), rtol=0, atol=0)


def test_a_later_save_in_another_format_leaves_no_stale_weights(tmp_path):
    first = swin.create_model("swin_t", num_classes=3, **SMALL).eval()
    second = swin.create_model("swin_t", num_classes=3, **SMALL).eval()
    swin.save_for_hf(first, tmp_path)
    swin.save_for_hf(second, tmp_path, safe_serialization=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "pytorch_model.bin"]
    theirs = timm.create_model(f"local-dir:{tmp_path}", pretrained=True).eval()
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(theirs(x), second(x), rtol=1e-5, atol=1e-5)


def test_per_stage_windows_and_class_names_as_timm_reads_them(tmp_path):
    if not hasattr(timm.models.swin_transformer, "resolve_stage_window_sizes"):
        pytest.skip("this timm builds one window for all stages")
    model = swin.create_model("swin_t", window_size=(7, 7, 14, 7), num_classes=4, **SMALL).eval()
    names = ["a", "b", "c", "d"]
    model.pretrained_cfg = {"label_names": names, "label_descriptions": {n: n.upper() for n in names}}
    swin.save_for_hf(model, tmp_path / "kept")
    theirs = timm.create_model(f"local-dir:{tmp_path / 'kept'}", pretrained=True).eval()
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(theirs(x), model(x), rtol=1e-5, atol=1e-5)
    assert theirs.pretrained_cfg["label_names"] == names
    assert theirs.pretrained_cfg["label_descriptions"] == {"a": "A", "b": "B", "c": "C", "d": "D"}
    back = swin.create_model(f"local-dir:{tmp_path / 'kept'}")
    assert back.pretrained_cfg["label_descriptions"] == theirs.pretrained_cfg["label_descriptions"]
    model.reset_classifier(2)  # the names were of the old head: not written for the new one (as timm)
    swin.save_for_hf(model, tmp_path / "reset")
    written = json.loads((tmp_path / "reset" / "config.json").read_text())
    assert written["num_classes"] == 2 and "label_names" not in written and "label_descriptions" not in written


def test_a_pretrained_cfg_beside_a_described_name_is_refused(tmp_path):
    swin.save_for_hf(swin.create_model("swin_t", num_classes=3, **SMALL), tmp_path)
    with pytest.raises(ValueError, match="the config.json it names is the pretrained config"):
        swin.create_model(f"local-dir:{tmp_path}", pretrained_cfg="ms_in22k")
    with pytest.raises(FileNotFoundError, match="is a file, not a folder"):
        swin.create_model(f"local-dir:{tmp_path / 'config.json'}")
