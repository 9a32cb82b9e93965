"""``model.pretrained_cfg``: sizes, classes and labels follow the model as it is now, the preprocessing is the
tag's, and values the user sets (by assignment or by editing the returned dict) are kept, as timm keeps them.

Expectations come from timm (its registered configs and its data helpers on its own models) and from the
manifest's published entries; the loopback tag is registered here with its own preprocessing.
"""

from __future__ import annotations

import math
import pickle

import pytest
import torch

import swin
from swin.weights import manifest
from swin.weights.data_config import create_transform

from .conftest import safetensors_bytes, tiny_swin_state

timm = pytest.importorskip("timm")
from timm.data import create_transform as timm_transform  # noqa: E402
from timm.data import resolve_data_config, resolve_model_data_config  # noqa: E402
from timm.models import get_pretrained_cfg  # noqa: E402

SMALL = {"depths": (1, 1, 1, 1)}  # the preprocessing does not depend on depth
TIMM_T = "swin_tiny_patch4_window7_224"
TINY = {"depths": (1, 1, 1, 1), "embed_dim": 8, "num_heads": (1, 1, 1, 1), "window_size": 2}  # tiny_swin_state's
LOOP = {  # a tag's published preprocessing, unlike ImageNet's so that a fallback would show
    "num_classes": 10,
    "labels": "imagenet-1k",
    "input_size": [3, 32, 32],
    "crop_pct": 1.0,
    "interpolation": "bilinear",
    "mean": [0.5, 0.5, 0.5],
    "std": [0.25, 0.25, 0.25],
}


def _image():
    from PIL import Image

    pixels = torch.randint(0, 256, (300, 400, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    return Image.fromarray(pixels.numpy())


def _same_transform(ours_model, timm_config) -> None:
    """Our evaluation transform for the model gives timm's for ``timm_config`` (resize, crop, normalisation)."""
    image = _image()
    ours = create_transform(swin.data_config(ours_model))
    torch.testing.assert_close(ours(image), timm_transform(**timm_config)(image))


# -- defect 1: what the model is now, not what the tag was ------------------------------------------------------


def test_tag_in_the_name_describes_the_model_as_built():
    model = swin.create_model("swin_t.ms_in22k", img_size=384, num_classes=10, in_chans=1, **SMALL)
    tag_cfg = get_pretrained_cfg(f"{TIMM_T}.ms_in22k").to_dict()
    expected = resolve_data_config(args={"in_chans": 1, "img_size": 384}, pretrained_cfg=tag_cfg)
    assert expected["input_size"] == (1, 384, 384)
    assert resolve_model_data_config(model) == expected
    cfg = model.pretrained_cfg
    assert cfg["input_size"] == (1, 384, 384) and cfg["num_classes"] == 10 and cfg["labels"] is None
    assert cfg["tag"] == "ms_in22k" and cfg["pool_size"] == (12, 12)
    # one channel: timm's resize and crop of the grey image, normalised by the average of the three values
    # (timm's own transform applies the three to a grey image and fails, or gives a colour image three planes)
    grey = {**expected, "mean": (sum(expected["mean"]) / 3,), "std": (sum(expected["std"]) / 3,)}
    image = _image()
    reference = timm_transform(**grey)(image.convert("L"))
    torch.testing.assert_close(create_transform(swin.data_config(model))(image), reference)


def test_reset_classifier_updates_classes_and_labels():
    entry = manifest.get_entry("swin_t.ms_in22k")
    model = swin.create_model("swin_t.ms_in22k", **SMALL)
    tag_cfg = get_pretrained_cfg(f"{TIMM_T}.ms_in22k").to_dict()
    assert model.pretrained_cfg["num_classes"] == tag_cfg["num_classes"] == entry.num_classes
    assert model.pretrained_cfg["labels"] == entry.labels == "imagenet-22k"

    model.reset_classifier(10)
    assert model.pretrained_cfg["num_classes"] == 10 and model.pretrained_cfg["labels"] is None
    assert swin.data_config(model)["num_classes"] == 10
    assert resolve_model_data_config(model) == resolve_data_config(pretrained_cfg=tag_cfg)  # preprocessing kept
    model.reset_classifier(entry.num_classes)
    assert model.pretrained_cfg["labels"] == entry.labels


@pytest.fixture
def tiny_arch(monkeypatch):
    """tiny_swin_state's architecture, registered for the test only (the registry is restored afterwards)."""
    from swin.registry import lookup

    swin.list_models()  # load the bundled entries before taking the copy
    monkeypatch.setattr(lookup, "_configs", dict(lookup._configs))
    swin.register_model(name="cfg_tiny", img_size=32, **TINY)
    return "cfg_tiny"


def test_a_downloaded_tag_and_a_local_file_describe_the_same_model(server, entries, tmp_path, tiny_arch):
    """The loader's record gives the tag's preprocessing only: at another size and head, the model's own."""
    body = safetensors_bytes(tiny_swin_state())
    source = {"url": server.serve("/loop/model.safetensors", body)}
    manifest.register_pretrained({f"{tiny_arch}.loop": {"sources": [source], **LOOP}})  # (entries: restored)
    tagged = swin.create_model(tiny_arch, pretrained="loop", img_size=64)
    path = tmp_path / "model.safetensors"
    path.write_bytes(body)
    local = swin.create_model(tiny_arch, pretrained=path, img_size=64, num_classes=10)

    for model in (tagged, local):
        assert model.pretrained_cfg["input_size"] == (3, 64, 64)
        assert model.pretrained_cfg["num_classes"] == 10
    assert local.pretrained_cfg["file"] == str(path)  # (its class names: the default tag's, whose head it has)
    assert tagged.pretrained_cfg["labels"] == "imagenet-1k"  # the head still has the tag's classes
    assert tagged.pretrained_cfg["tag"] == "loop" and tagged.pretrained_cfg["file"] is not None

    published = {k: tuple(v) if isinstance(v, list) else v for k, v in LOOP.items()}  # as YAML gives them
    expected = resolve_data_config(args={"img_size": 64}, pretrained_cfg=published)
    assert resolve_model_data_config(tagged) == expected
    assert swin.data_config(tagged)["resize_size"] == math.floor(64 / LOOP["crop_pct"])
    _same_transform(tagged, expected)

    tagged.reset_classifier(5)
    assert tagged.pretrained_cfg["num_classes"] == 5 and tagged.pretrained_cfg["labels"] is None
    assert resolve_model_data_config(tagged) == expected


# -- defect 2: the user's values are kept ------------------------------------------------------------------------


def test_assigned_values_are_kept_as_timm_keeps_them():
    ours = swin.create_model("swin_t", **SMALL)
    theirs = timm.create_model(TIMM_T, **SMALL)
    for model in (ours, theirs):
        model.pretrained_cfg = {"mean": (0.5, 0.5, 0.5), "crop_pct": 1.0}
    assert ours.pretrained_cfg["mean"] == (0.5, 0.5, 0.5) and ours.pretrained_cfg["crop_pct"] == 1.0
    expected = resolve_model_data_config(theirs)
    assert resolve_model_data_config(ours) == expected
    _same_transform(ours, expected)  # the resize follows the new crop_pct

    ours.pretrained_cfg = None  # back to what the model derives
    assert ours.pretrained_cfg["crop_pct"] == get_pretrained_cfg(TIMM_T).crop_pct


def test_edits_of_the_returned_dict_are_kept_as_timm_keeps_them():
    ours = swin.create_model("swin_t", **SMALL)
    theirs = timm.create_model(TIMM_T, **SMALL)
    ours_cfg = ours.pretrained_cfg
    for cfg in (ours_cfg, theirs.pretrained_cfg):
        cfg["crop_pct"] = 1.0
        cfg.update(std=(0.5, 0.5, 0.5), interpolation="bilinear")
    assert ours.pretrained_cfg["crop_pct"] == 1.0 and ours.pretrained_cfg["std"] == (0.5, 0.5, 0.5)
    expected = resolve_model_data_config(theirs)
    assert resolve_model_data_config(ours) == expected
    _same_transform(ours, expected)
    assert ours_cfg["resize_size"] == ours.pretrained_cfg["resize_size"] == 224  # the edited dict follows

    del ours.pretrained_cfg["crop_pct"]  # drops the user's value: the tag's returns
    assert ours.pretrained_cfg["crop_pct"] == get_pretrained_cfg(TIMM_T).crop_pct
    assert ours.pretrained_cfg["std"] == (0.5, 0.5, 0.5)
    copied = pickle.loads(pickle.dumps(ours.pretrained_cfg))
    assert type(copied) is dict and copied == ours.pretrained_cfg


def test_user_values_do_not_freeze_what_the_model_derives():
    """Assigning back a copy of the whole dict pins only what the user changed."""
    model = swin.create_model("swin_t.ms_in22k", **SMALL)
    model.pretrained_cfg = {**model.pretrained_cfg, "mean": (0.5, 0.5, 0.5)}
    model.reset_classifier(10)
    cfg = model.pretrained_cfg
    assert cfg["mean"] == (0.5, 0.5, 0.5)
    assert cfg["num_classes"] == 10 and cfg["labels"] is None

    edited = swin.create_model("swin_t.ms_in22k", **SMALL)
    edited.pretrained_cfg["crop_pct"] = 1.0
    edited.reset_classifier(10)
    assert edited.pretrained_cfg["crop_pct"] == 1.0 and edited.pretrained_cfg["num_classes"] == 10

    chosen = swin.create_model("swin_t", **SMALL)
    chosen.pretrained_cfg = {"input_size": (3, 256, 256)}  # a value the user sets wins, sizes included
    assert chosen.pretrained_cfg["input_size"] == (3, 256, 256)
    assert chosen.pretrained_cfg["resize_size"] == math.floor(256 / get_pretrained_cfg(TIMM_T).crop_pct)


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"crop_pct": 0}, "crop_pct is 0"),
        ({"crop_pct": float("nan")}, "crop_pct is nan"),
        ({"input_size": 224}, "input_size is 224"),
        ({"mean": "0.5"}, "mean is '0.5'"),
        ({"std": (0.5, 0.0, 0.5)}, r"std is \(0.5, 0.0, 0.5\)"),
        ({"interpolation": "cubic"}, "interpolation is 'cubic'"),
        # timm's transforms know no nearest-exact (KeyError inside create_transform)
        ({"interpolation": "nearest-exact"}, "interpolation is 'nearest-exact'"),
        ({"mean": (0.5, 0.5)}, r"mean is \(0.5, 0.5\); expected 3 numbers"),  # two means for three channels
        # timm reads crop_pct alone: a resize it would not make (timm's for 0.9 is 248) is refused, not ignored
        ({"resize_size": 300}, "resize_size 300 and crop_pct 0.9 disagree"),
    ],
)
def test_preprocessing_no_transform_takes_is_refused_when_set(values, named):
    """Refused where it is set (the model's pretrained_cfg, an edit of it, create_model's overlay), naming the
    entry; before, it was kept and failed later inside the transform (ZeroDivisionError, an image of inf from a
    zero std, ...)."""
    model = swin.create_model("swin_t", embed_dim=8, depths=(1, 1, 1, 1), num_heads=(1, 1, 1, 1))
    with pytest.raises(ValueError, match=f"pretrained_cfg {named}"):
        model.pretrained_cfg = values
    with pytest.raises(ValueError, match=f"pretrained_cfg {named}"):
        model.pretrained_cfg.update(values)
    with pytest.raises(ValueError, match=named):
        swin.create_model(
            "swin_t", embed_dim=8, depths=(1, 1, 1, 1), num_heads=(1, 1, 1, 1), pretrained_cfg_overlay=values
        )
    assert model.pretrained_cfg["crop_pct"] == 0.9 and model.pretrained_cfg["resize_size"] == 248  # unchanged


def test_the_resize_follows_an_edited_crop_as_timms_transform_does():
    """timm's create_transform resizes to floor(size / crop_pct) and reads no resize_size; a data_config whose
    crop was edited is refused rather than resized by the stale resize_size (it resized to 248 for crop 1.0),
    and without resize_size (timm's own config dicts, which raised KeyError) it is timm's transform."""
    model = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False)
    config = swin.data_config("swin_t")
    config["crop_pct"] = 1.0
    with pytest.raises(ValueError, match="resize_size 248 and crop_pct 1.0 disagree: crop_pct resizes to 224"):
        create_transform(config)
    del config["resize_size"]
    theirs = resolve_data_config({"crop_pct": 1.0}, model=model)
    image = _noise_image(300, 260)
    torch.testing.assert_close(create_transform(config)(image), timm_transform(**theirs)(image), rtol=0, atol=0)
    torch.testing.assert_close(create_transform(theirs)(image), timm_transform(**theirs)(image), rtol=0, atol=0)
    # a name or a model stands for its data_config
    default = timm_transform(**resolve_data_config({}, model=model))
    torch.testing.assert_close(create_transform("swin_t")(image), default(image), rtol=0, atol=0)
    with pytest.raises(TypeError, match="takes a data_config dict, a model or a name, got int"):
        create_transform(3)
    # the crop the error suggests makes the resize asked for, in timm's transform too
    ours = swin.create_model("swin_t", embed_dim=8, depths=(1, 1, 1, 1), num_heads=(1, 1, 1, 1))
    with pytest.raises(ValueError, match="together with crop_pct=([0-9.]+), which resizes to 300") as refused:
        ours.pretrained_cfg = {"resize_size": 300}
    crop = float(refused.value.args[0].rsplit("together with crop_pct=", 1)[1].split(",")[0])
    ours.pretrained_cfg = {"resize_size": 300, "crop_pct": crop}
    assert timm_transform(**resolve_model_data_config(ours)).transforms[0].size == 300


def _noise_image(height: int, width: int):
    from PIL import Image

    generator = torch.Generator().manual_seed(height * width)
    pixels = torch.randint(0, 256, (height, width, 3), dtype=torch.uint8, generator=generator)
    return Image.fromarray(pixels.numpy())


def test_numpy_numbers_are_numbers():
    """Preprocessing computed with numpy (a dataset's mean as float32) is taken as timm takes it."""
    np = pytest.importorskip("numpy")
    model = swin.create_model("swin_t", embed_dim=8, depths=(1, 1, 1, 1), num_heads=(1, 1, 1, 1))
    model.pretrained_cfg = {"mean": tuple(np.float32([0.5, 0.25, 0.5])), "crop_pct": np.float64(0.95)}
    assert model.pretrained_cfg["crop_pct"] == 0.95 and model.pretrained_cfg["resize_size"] == math.floor(224 / 0.95)


def test_numpy_numbers_are_kept_as_python_numbers():
    """What is kept is written as JSON (an ONNX file's metadata): numpy's float32 failed there after export."""
    import json

    np = pytest.importorskip("numpy")
    model = swin.create_model("swin_t", embed_dim=8, depths=(1, 1, 1, 1), num_heads=(1, 1, 1, 1))
    model.pretrained_cfg = {"mean": tuple(np.float32([0.5, 0.25, 0.5])), "input_size": (3, np.int64(224), 224)}
    assert json.loads(json.dumps(swin.data_config(model)["mean"])) == [0.5, 0.25, 0.5]


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [("swin_t", "swin_tiny_patch4_window7_224"), ("swin_t.ms_in22k", "swin_tiny_patch4_window7_224.ms_in22k")],
)
def test_pretrained_cfg_says_where_the_weights_come_from_as_timms(ours, theirs):
    """hf_hub_id, url and license, as timm's pretrained_cfg carries them (they were missing)."""
    import timm

    cfg, reference = swin.create_model(ours).pretrained_cfg, timm.create_model(theirs).pretrained_cfg
    assert {k: cfg[k] for k in ("hf_hub_id", "url", "license")} == {
        k: reference[k] for k in ("hf_hub_id", "url", "license")
    }


def test_torchvision_tag_names_torchvisions_file_and_weights_from_elsewhere_name_none():
    import torchvision

    cfg = swin.create_model("swin_t.tv_in1k").pretrained_cfg
    assert cfg["url"] == torchvision.models.Swin_T_Weights.IMAGENET1K_V1.url and cfg["hf_hub_id"] is None
    loaded = swin.create_model("swin_t", pretrained=swin.create_model("swin_t").state_dict()).pretrained_cfg
    assert (loaded["hf_hub_id"], loaded["url"], loaded["license"]) == (None, None, None)


def test_a_file_loaded_into_a_tagged_model_keeps_the_tags_preprocessing(tmp_path):
    """create_model("swin_t.tv_in1k", checkpoint_path=FILE), as timm's: the tag's pretrained_cfg, the file's
    weights. The default tag's preprocessing (resize 248, not torchvision's 232) was reported, and a plain file
    load named the default tag as if its weights were that tag's."""
    import torchvision

    path = tmp_path / "finetuned.pth"
    torch.save(swin.create_model("swin_t").state_dict(), path)
    cfg = swin.create_model("swin_t.tv_in1k", checkpoint_path=path).pretrained_cfg
    transforms = torchvision.models.Swin_T_Weights.IMAGENET1K_V1.transforms()
    assert (cfg["tag"], cfg["file"], cfg["url"]) == ("tv_in1k", str(path), None)
    assert cfg["resize_size"] == transforms.resize_size[0] and cfg["input_size"][1:] == tuple(transforms.crop_size * 2)
    assert swin.create_model("swin_t", pretrained=path).pretrained_cfg["tag"] is None


def test_deleting_the_crop_a_resize_was_pinned_to_drops_that_resize():
    """A resize pinned together with a crop goes when the crop is deleted (it left the model refusing every
    later edit and its transform: resize 280 against crop 0.9)."""
    model = swin.create_model("swin_t", embed_dim=8, depths=(1, 1, 1, 1), num_heads=(1, 1, 1, 1))
    cfg = model.pretrained_cfg
    cfg.update(crop_pct=0.8, resize_size=280)
    del cfg["crop_pct"]
    assert model.pretrained_cfg["crop_pct"] == 0.9 and model.pretrained_cfg["resize_size"] == 248
    create_transform(swin.data_config(model))
    model.pretrained_cfg["mean"] = (0.5, 0.5, 0.5)
