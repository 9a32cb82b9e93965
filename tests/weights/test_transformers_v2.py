"""Hugging Face transformers' Swin V2 (``Swinv2ForImageClassification``) checkpoints load into our swinv2 models.

The reference is transformers' own model, randomly initialised and moved off its initial values (a fresh V2
model has zero q/v biases and equal logit scales, which would hide a bias loaded into the wrong place); its
``save_pretrained`` file and its in-memory ``state_dict`` are loaded through ``pretrained=`` and the logits
compared with transformers' on the same image.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import swin
from swin.weights import convert, detect_layout
from tests.weights.conftest import torch_bytes

TOL = 1e-4

# (transformers Swinv2Config fields, our create_model overrides of swinv2_t_w8), the same architecture.
CASES = {
    "w4": (
        {"image_size": 64, "window_size": 4, "depths": [2, 2], "num_heads": [2, 4], "embed_dim": 32},
        {"img_size": 64, "window_size": 4, "depths": (2, 2), "num_heads": (2, 4), "embed_dim": 32},
    ),
    "pretrained_w2": (  # position bias coordinates scaled as for weights trained at window 2
        {
            "image_size": 64,
            "window_size": 4,
            "depths": [2, 2],
            "num_heads": [2, 4],
            "embed_dim": 32,
            "pretrained_window_sizes": [2, 2],
        },
        {
            "img_size": 64,
            "window_size": 4,
            "depths": (2, 2),
            "num_heads": (2, 4),
            "embed_dim": 32,
            "pretrained_window_sizes": (2, 2),
        },
    ),
    "w8_clipped": (  # the last stage's 4x4 map is smaller than the window: one unshifted window
        {"image_size": 64, "window_size": 8, "depths": [2, 2, 2], "num_heads": [2, 4, 8], "embed_dim": 32},
        {"img_size": 64, "window_size": 8, "depths": (2, 2, 2), "num_heads": (2, 4, 8), "embed_dim": 32},
    ),
}
NUM_CLASSES = 10


def _reference(fields: dict):
    from transformers import Swinv2Config, Swinv2ForImageClassification

    torch.manual_seed(0)
    model = Swinv2ForImageClassification(Swinv2Config(**fields, num_labels=NUM_CLASSES)).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.02 * torch.randn(param.shape, generator=generator))
    return model


def _load(pretrained, overrides: dict) -> torch.nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a complete checkpoint of the same architecture loads silently
        model = swin.create_model("swinv2_t_w8", num_classes=NUM_CLASSES, pretrained=pretrained, **overrides)
    return model.eval()


@pytest.mark.parametrize("case", CASES)
def test_save_pretrained_file_gives_transformers_logits(server, tmp_path, case):
    fields, overrides = CASES[case]
    reference = _reference(fields)
    reference.save_pretrained(tmp_path / "hf")
    body = (tmp_path / "hf" / "model.safetensors").read_bytes()
    model = _load(server.serve("/microsoft/swinv2/resolve/main/model.safetensors", body), overrides)
    assert model.pretrained_cfg["layout"] == "transformers"
    image = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = reference(pixel_values=image).logits
        assert (model(image) - expected).abs().max().item() <= TOL


def test_in_memory_state_dict_with_saved_buffers(server):
    """The in-memory ``state_dict``, served as a torch.save file, with the derived buffers older transformers
    versions saved (``relative_coords_table``, ``relative_position_index``): those are rebuilt, not loaded."""
    fields, overrides = CASES["w4"]
    reference = _reference(fields)
    sd = dict(reference.state_dict())
    for name, buffer in reference.named_buffers():
        if name.endswith(("relative_coords_table", "relative_position_index")):
            sd[name] = buffer
    assert any(k.endswith("relative_coords_table") for k in sd)
    model = _load(server.serve("/hf/pytorch_model.bin", torch_bytes(sd)), overrides)
    image = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert (model(image) - reference(pixel_values=image).logits).abs().max().item() <= TOL


def test_converted_keys_are_ours_and_v1_keeps_its_biases():
    """Every key converts to one of our V2 model's (q_bias and v_bias from transformers' query / value biases,
    no k bias); a V1 checkpoint of transformers still fuses all three biases."""
    from transformers import SwinConfig, SwinModel

    fields, overrides = CASES["w4"]
    reference = _reference(fields)
    assert detect_layout(reference.state_dict()) == "transformers"
    ours = swin.create_model("swinv2_t_w8", num_classes=NUM_CLASSES, **overrides)
    converted = convert(reference.state_dict())
    assert set(converted) == set(ours.state_dict())
    theirs = reference.state_dict()
    prefix = "swinv2.encoder.layers.1.blocks.1.attention.self."
    torch.testing.assert_close(converted["layers.1.blocks.1.attn.q_bias"], theirs[prefix + "query.bias"])
    torch.testing.assert_close(converted["layers.1.blocks.1.attn.v_bias"], theirs[prefix + "value.bias"])

    v1 = SwinModel(SwinConfig(image_size=64, window_size=4, depths=[2, 2], num_heads=[2, 4], embed_dim=32))
    v1_converted = convert(v1.state_dict())
    assert v1_converted["layers.0.blocks.0.attn.qkv.bias"].shape == (96,)
    assert not any(k.endswith(("q_bias", "v_bias")) for k in v1_converted)
