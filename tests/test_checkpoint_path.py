"""``create_model(checkpoint_path=...)`` loads a checkpoint whole, head included, as timm's ``checkpoint_path``.

timm's ``load_checkpoint`` is strict: a head of another size, a missing head or a surplus head is an error
(``size mismatch``, ``Missing key(s)``, ``Unexpected key(s)``). Loading a fine-tuned checkpoint into a model with
another head must not give logits from an untrained head; ``pretrained=PATH`` is the way to ask for a new one.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import swin

timm = pytest.importorskip("timm")

SMALL = {"depths": (1, 1, 1, 1)}  # the head is what is tested; the trunk's depth changes nothing
TIMM_T = "swin_tiny_patch4_window7_224"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """timm checkpoints (``torch.save(model.state_dict())``) with 10, 1000 and no classes, by head size."""
    folder = tmp_path_factory.mktemp("checkpoints")
    paths = {}
    for num_classes in (10, 1000, 0):
        torch.manual_seed(num_classes)
        path = folder / f"timm_{num_classes}.pth"
        torch.save(timm.create_model(TIMM_T, num_classes=num_classes, **SMALL).state_dict(), path)
        paths[num_classes] = path
    return paths


def _timm_refuses(path, **kwargs) -> str:
    with pytest.raises(RuntimeError) as error:
        timm.create_model(TIMM_T, checkpoint_path=str(path), **SMALL, **kwargs)
    return str(error.value)


def test_a_head_of_another_size_is_an_error(saved):
    assert "size mismatch for head.fc.weight" in _timm_refuses(saved[10])
    with pytest.raises(ValueError, match=r"10 classes.*model.* 1000.*num_classes=10.*pretrained=") as error:
        swin.create_model("swin_t", checkpoint_path=saved[10], **SMALL)
    assert str(saved[10]) in str(error.value)


def test_the_head_size_of_a_tag_in_the_name_is_checked_too(saved):
    """``swin_t.ms_in22k`` has 21841 classes: an in1k fine-tuned checkpoint does not fit it."""
    with pytest.raises(ValueError, match=r"1000 classes.*21841.*num_classes=1000"):
        swin.create_model("swin_t.ms_in22k", checkpoint_path=saved[1000], **SMALL)
    model = swin.create_model("swin_t.ms_in22k", num_classes=1000, checkpoint_path=saved[1000], **SMALL)
    assert model.head.weight.shape == (1000, 768)


def test_a_head_that_fits_loads_like_timm(saved):
    theirs = timm.create_model(TIMM_T, num_classes=10, checkpoint_path=str(saved[10]), **SMALL).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours = swin.create_model("swin_t", num_classes=10, checkpoint_path=saved[10], **SMALL).eval()
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-4, rtol=1e-4)


def test_a_checkpoint_without_a_head_into_a_model_with_one_is_an_error(saved):
    assert "Missing key(s)" in _timm_refuses(saved[0]) and "head.fc.weight" in _timm_refuses(saved[0])
    with pytest.raises(ValueError, match=r"no classifier.*1000.*num_classes=0.*pretrained="):
        swin.create_model("swin_t", checkpoint_path=saved[0], **SMALL)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = swin.create_model("swin_t", num_classes=0, checkpoint_path=saved[0], **SMALL)
    assert isinstance(model.head, torch.nn.Identity)


def test_a_head_into_a_model_without_one_is_an_error(saved):
    assert "Unexpected key(s)" in _timm_refuses(saved[1000], num_classes=0)
    with pytest.raises(ValueError, match=r"1000 classes.*no classifier.*num_classes=1000"):
        swin.create_model("swin_t", num_classes=0, checkpoint_path=saved[1000], **SMALL)


def test_a_head_that_takes_other_features_is_an_error(saved):
    """catavgmax pooling doubles what the head takes: the checkpoint's 768-feature head does not fit."""
    assert "size mismatch for head.fc.weight" in _timm_refuses(saved[1000], global_pool="catavgmax")
    with pytest.raises(ValueError, match=r"768 features.*1536.*global_pool"):
        swin.create_model("swin_t", global_pool="catavgmax", checkpoint_path=saved[1000], **SMALL)


def test_pretrained_still_gives_a_new_head_with_a_warning(saved):
    """``pretrained=PATH`` with another ``num_classes`` asks for a new head: the trunk loads, the head is new."""
    with pytest.warns(UserWarning, match=r"classifier has 10 classes and the model 1000"):
        model = swin.create_model("swin_t", pretrained=saved[10], **SMALL)
    assert model.head.weight.shape == (1000, 768)
    with pytest.warns(UserWarning, match="head.weight"):
        swin.create_model("swin_t", pretrained=saved[0], **SMALL)


def test_a_backbone_takes_a_classifier_checkpoint(saved):
    """A features_only backbone has no head to fit: the checkpoint's is not used."""
    with pytest.warns(UserWarning, match="head.weight"):  # what a backbone leaves out is said, as before
        backbone = swin.create_model("swin_t", features_only=True, checkpoint_path=saved[10], **SMALL)
    reference = torch.load(saved[10], weights_only=True)
    key = "layers.3.blocks.0.mlp.fc2.weight"
    torch.testing.assert_close(backbone.state_dict()[key], reference[key])


def test_a_checkpoint_missing_the_final_norm_is_an_error(saved, tmp_path):
    """timm's strict load refuses a checkpoint without ``norm.*`` (a backbone's, say); ours left the final norm
    at its initial values with a warning."""
    state = torch.load(saved[0])
    del state["norm.weight"], state["norm.bias"]
    path = tmp_path / "no_norm.pth"
    torch.save(state, path)
    assert "Missing key(s)" in _timm_refuses(path, num_classes=0)
    with pytest.raises(ValueError, match=r"not this model's whole checkpoint: the model's norm\.bias.*pretrained="):
        swin.create_model("swin_t", num_classes=0, checkpoint_path=path, **SMALL)


def test_a_checkpoint_with_keys_the_model_lacks_is_an_error(saved, tmp_path):
    state = torch.load(saved[0])
    state["neck.weight"] = torch.zeros(3)
    path = tmp_path / "with_neck.pth"
    torch.save(state, path)
    assert "Unexpected key(s)" in _timm_refuses(path, num_classes=0)
    with pytest.raises(ValueError, match=r"its neck\.weight not in the model"):
        swin.create_model("swin_t", num_classes=0, checkpoint_path=path, **SMALL)
