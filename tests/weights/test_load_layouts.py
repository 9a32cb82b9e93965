"""Every layout, as the independent implementation itself writes it, loads through ``pretrained=URL``.

Each checkpoint is made by timm, torchvision or transformers from a randomly initialised model of their own
(``state_dict`` / ``save_pretrained``), served from a loopback HTTP server, and loaded with
``swin.create_model("swin_t", pretrained=URL)``; the expected outputs are that reference model's.
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch

import swin
from swin.weights import convert, detect_layout, export, unwrap
from tests.weights.conftest import safetensors_bytes, torch_bytes

TOL = 1e-5


@pytest.fixture(scope="module")
def image():
    return torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def timm_model():
    import timm

    torch.manual_seed(0)
    return timm.create_model("swin_tiny_patch4_window7_224").eval()


@pytest.fixture(scope="module")
def timm_logits(timm_model, image):
    with torch.no_grad():
        return timm_model(image)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def _load(url: str, **kwargs) -> torch.nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a complete checkpoint of the same architecture loads silently
        return swin.create_model("swin_t", pretrained=url, **kwargs).eval()


@pytest.fixture(scope="module")
def official_from_timm(timm_model):
    """timm's random weights in the official layout (read back by timm's own filter in the test below)."""
    ours = swin.create_model("swin_t")
    ours.load_state_dict(convert(timm_model.state_dict(), source="timm"))
    return export(ours.state_dict(), target="official")


@pytest.mark.parametrize("fmt", ["safetensors", "pth"])
def test_timm(server, image, timm_model, timm_logits, fmt):
    """timm's state dict, as its Hugging Face hub copies hold it (safetensors) and as a torch.save file."""
    sd = timm_model.state_dict()
    body = safetensors_bytes(sd) if fmt == "safetensors" else torch_bytes(sd)
    model = _load(server.serve(f"/timm/model.{fmt}", body))
    assert model.pretrained_cfg["layout"] == "timm"
    with torch.no_grad():
        assert _max_diff(model(image), timm_logits) <= TOL


def test_official_export_through_timm_filter(server, image, official_from_timm):
    """Our official export, wrapped as the Microsoft release files are ({"model": ...}); the reference is
    timm's model loaded from the same checkpoint with timm's own ``checkpoint_filter_fn``."""
    import timm
    from timm.models.swin_transformer import checkpoint_filter_fn

    checkpoint = {"model": official_from_timm}
    reference = timm.create_model("swin_tiny_patch4_window7_224").eval()
    reference.load_state_dict(checkpoint_filter_fn(checkpoint, reference))
    model = _load(server.serve("/official/swin_tiny_patch4_window7_224.pth", torch_bytes(checkpoint)))
    assert model.pretrained_cfg["layout"] == "official"
    with torch.no_grad():
        assert _max_diff(model(image), reference(image)) <= TOL


def test_torchvision(server, image):
    import torchvision

    torch.manual_seed(0)
    reference = torchvision.models.swin_t().eval()
    model = _load(server.serve("/tv/swin_t.pth", torch_bytes(reference.state_dict())))
    assert model.pretrained_cfg["layout"] == "torchvision"
    with torch.no_grad():
        assert _max_diff(model(image), reference(image)) <= TOL


@pytest.fixture(scope="module")
def hf_model():
    from transformers import SwinConfig, SwinForImageClassification

    config = SwinConfig(
        image_size=224,
        patch_size=4,
        embed_dim=96,
        depths=[2, 2, 6, 2],
        num_heads=[3, 6, 12, 24],
        window_size=7,
        num_labels=1000,
    )
    torch.manual_seed(0)
    return SwinForImageClassification(config).eval()


@pytest.fixture(scope="module")
def hf_logits(hf_model, image):
    with torch.no_grad():
        return hf_model(pixel_values=image).logits


def test_transformers_save_pretrained(server, image, tmp_path, hf_model, hf_logits):
    """``save_pretrained`` writes the 4.x key names (attention.self.query, ...), even in transformers 5."""
    hf_model.save_pretrained(tmp_path / "hf")
    body = (tmp_path / "hf" / "model.safetensors").read_bytes()
    from safetensors.torch import load

    assert any(".attention.self.query." in k for k in load(body))
    model = _load(server.serve("/microsoft/swin/resolve/main/model.safetensors", body))
    assert model.pretrained_cfg["layout"] == "transformers"
    with torch.no_grad():
        assert _max_diff(model(image), hf_logits) <= TOL


def test_transformers_in_memory_keys(server, image, hf_model, hf_logits):
    """The in-memory ``state_dict()`` of transformers 5 (q_proj/k_proj/v_proj/o_proj, relative_position_bias.*);
    4.x's in-memory names are those save_pretrained writes."""
    sd = hf_model.state_dict()
    model = _load(server.serve("/hf/pytorch_model.bin", torch_bytes(sd)))
    with torch.no_grad():
        assert _max_diff(model(image), hf_logits) <= TOL


def test_transformers_backbone_norms_become_norm0_to_3():
    from transformers import SwinBackbone, SwinConfig

    config = SwinConfig(embed_dim=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24], window_size=7)
    config.out_features = ["stage1", "stage2", "stage3", "stage4"]
    torch.manual_seed(0)
    hf = SwinBackbone(config)
    converted = convert(hf.state_dict())
    backbone = swin.create_model("swin_t", features_only=True)
    # transformers' SwinBackbone also carries the classifier's final layernorm, unused by its forward
    assert set(converted) - {"norm.weight", "norm.bias"} == set(backbone.state_dict())
    torch.testing.assert_close(converted["norm2.weight"], hf.state_dict()["hidden_states_norms.stage3.weight"])


# -- mmdetection / mmsegmentation -----------------------------------------------------------------------


def mmdet_swin_converter(official: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An independent re-implementation of mmdetection's ``swin_converter`` (official -> mmdet keys), written
    from its published source (mmdet/models/backbones/swin.py; also tools/model_converters/swin2mmdet.py):
    heads skipped; ``attn.`` -> ``attn.w_msa.``; ``mlp.fc1.`` -> ``ffn.layers.0.0.``, ``mlp.fc2.`` ->
    ``ffn.layers.1.``; patch merging weights permuted into ``nn.Unfold``'s channel order; ``layers`` ->
    ``stages``; ``patch_embed.proj`` -> ``patch_embed.projection``. (mmdetection is not installed here.)"""

    def correct_unfold_reduction_order(x):
        out_channel, in_channel = x.shape
        x = x.reshape(out_channel, 4, in_channel // 4)
        return x[:, [0, 2, 1, 3], :].transpose(1, 2).reshape(out_channel, in_channel)

    def correct_unfold_norm_order(x):
        in_channel = x.shape[0]
        x = x.reshape(4, in_channel // 4)
        return x[[0, 2, 1, 3], :].transpose(0, 1).reshape(in_channel)

    new = {}
    for k, v in official.items():
        if k.startswith("head"):
            continue
        new_v, new_k = v, k
        if k.startswith("layers"):
            if "attn." in k:
                new_k = k.replace("attn.", "attn.w_msa.")
            elif "mlp.fc1." in k:
                new_k = k.replace("mlp.fc1.", "ffn.layers.0.0.")
            elif "mlp.fc2." in k:
                new_k = k.replace("mlp.fc2.", "ffn.layers.1.")
            elif "downsample" in k:
                if "reduction." in k:
                    new_v = correct_unfold_reduction_order(v)
                elif "norm." in k:
                    new_v = correct_unfold_norm_order(v)
            new_k = new_k.replace("layers", "stages", 1)
        elif k.startswith("patch_embed") and "proj" in k:
            new_k = k.replace("proj", "projection")
        new["backbone." + new_k] = new_v
    return new


def test_mmdet_round_trip(official_from_timm):
    mmdet = mmdet_swin_converter(official_from_timm)
    assert detect_layout(k.removeprefix("backbone.") for k in mmdet) == "mmdet"
    back = convert({"state_dict": mmdet})
    expected = {k: v for k, v in official_from_timm.items() if not k.startswith("head")}
    assert set(back) == set(expected)
    for key, value in expected.items():
        assert torch.equal(back[key], value), key


def test_mmdet_detector_checkpoint(server, image, timm_model, official_from_timm):
    """A detector checkpoint: ``backbone.`` with norm0..3 beside neck and head keys; the classifier loads the
    trunk (same features as timm's), the detection backbone also its per-level norms; the rest is reported."""
    torch.manual_seed(3)
    state = mmdet_swin_converter(official_from_timm)
    norms = {f"backbone.norm{i}.{p}": torch.randn(96 * 2**i) for i in range(4) for p in ("weight", "bias")}
    detector = {"neck.lateral_convs.0.conv.weight": torch.randn(256, 96, 1, 1), "rpn_head.rpn_cls.bias": torch.zeros(3)}
    checkpoint = {"meta": {"mmdet_version": "3.3.0", "CLASSES": ("person", "car")}, "state_dict": state}
    checkpoint["state_dict"].update(norms | detector)
    url = server.serve("/mmdet/mask_rcnn_swin-t.pth", torch_bytes(checkpoint))

    with pytest.warns(UserWarning, match=r"neck\.lateral_convs\.0\.conv\.weight.*rpn_head") as record:
        classifier = swin.create_model("swin_t", pretrained=url).eval()
    message = str(record[0].message)
    assert "norm0.weight" in message and "head.weight" in message  # dropped, and kept at its initial value
    with torch.no_grad():
        expected = timm_model.forward_features(image).permute(0, 3, 1, 2)  # timm's features are NHWC
        assert _max_diff(classifier.forward_features(image), expected) <= TOL

    with pytest.warns(UserWarning, match=r"neck\.") as record:
        backbone = swin.create_model("swin_t", features_only=True, pretrained=url)
    assert "not in the checkpoint" not in str(record[0].message)
    torch.testing.assert_close(backbone.norm3.weight.detach(), norms["backbone.norm3.weight"], rtol=0, atol=0)
    reduction = official_from_timm["layers.1.downsample.reduction.weight"]
    assert torch.equal(backbone.layers[1].downsample.reduction.weight.detach(), reduction)


def test_backbone_with_fewer_stages_drops_the_rest(server, official_from_timm):
    url = server.serve("/official/t.pth", torch_bytes({"model": official_from_timm}))
    with pytest.warns(UserWarning, match=r"layers\.3\.\*|layers\.2\.downsample"):
        backbone = swin.create_model("swin_t", features_only=True, out_indices=(0, 1, 2), pretrained=url)
    assert len(backbone.layers) == 3


def test_local_path_and_os_pathlike(tmp_path, image, timm_model, timm_logits):
    path = tmp_path / "timm.safetensors"
    path.write_bytes(safetensors_bytes(timm_model.state_dict()))
    model = _load(path)
    with torch.no_grad():
        assert _max_diff(model(image), timm_logits) <= TOL
    assert model.pretrained_cfg["file"] == os.fspath(path)


# DINO / Deformable-DETR as mmdetection saves them: the Swin trunk under backbone., beside a detection
# transformer whose keys (encoder.layers.*, decoder.layers.*, ffn.layers.*) look like a Swin trunk's.
DETR_KEYS = {
    "encoder.layers.0.self_attn.sampling_offsets.weight": (256, 256),
    "encoder.layers.0.self_attn.attention_weights.weight": (128, 256),
    "encoder.layers.0.self_attn.value_proj.weight": (256, 256),
    "encoder.layers.0.self_attn.output_proj.weight": (256, 256),
    "encoder.layers.0.ffn.layers.0.0.weight": (2048, 256),
    "encoder.layers.0.ffn.layers.1.weight": (256, 2048),
    "encoder.layers.0.norms.0.weight": (256,),
    "decoder.layers.0.self_attn.attn.in_proj_weight": (768, 256),
    "decoder.layers.0.cross_attn.sampling_offsets.weight": (256, 256),
    "decoder.layers.0.ffn.layers.0.0.weight": (2048, 256),
    "decoder.ref_point_head.layers.0.weight": (256, 512),
    "decoder.norm.weight": (256,),
    "level_embed": (5, 256),
    "memory_trans_fc.weight": (256, 256),
    "query_embedding.weight": (900, 256),
    "neck.convs.0.conv.weight": (256, 192, 1, 1),
    "bbox_head.cls_branches.0.weight": (80, 256),
}


def _detr_keys() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(4)
    return {k: torch.randn(shape, generator=generator) for k, shape in DETR_KEYS.items()}


def test_mmdet_dino_checkpoint(server, image, timm_model, official_from_timm):
    """mmdetection's DINO: its trunk loads (timm's features), the transformer is reported as dropped."""
    state = mmdet_swin_converter(official_from_timm) | _detr_keys()
    checkpoint = {"meta": {"mmdet_version": "3.3.0"}, "state_dict": state}
    url = server.serve("/mmdet/dino-4scale_swin-t.pth", torch_bytes(checkpoint))

    with pytest.warns(UserWarning, match=r"dropped \d+ key\(s\) the model does not use: .*decoder\..*encoder\.") as rec:
        classifier = swin.create_model("swin_t", pretrained=url).eval()
    message = " ".join(str(r.message) for r in rec)
    assert "head.weight" in message and "neck." in message
    assert classifier.pretrained_cfg["layout"] == "mmdet"
    with torch.no_grad():
        expected = timm_model.forward_features(image).permute(0, 3, 1, 2)  # timm's features are NHWC
        assert _max_diff(classifier.forward_features(image), expected) <= TOL


def test_detr_keys_beside_an_official_backbone(official_from_timm):
    """Official keys under backbone. beside a DETR transformer: the trunk is exactly the official one (its
    layout read from the trunk alone: the transformer's ffn.layers are no sign of mmdetection's layout), the
    transformer's keys pass through unrenamed."""
    from swin.weights import unwrap

    detr = _detr_keys()
    checkpoint = {"model": {f"backbone.{k}": v for k, v in official_from_timm.items()} | detr}
    state = unwrap(checkpoint)
    assert detect_layout(state) == "official"
    assert state.passthrough == set(detr)
    converted = convert(checkpoint)
    assert set(converted) == set(official_from_timm) | set(detr)
    for key, value in official_from_timm.items():
        assert torch.equal(converted[key], value), key
    for key, value in detr.items():
        assert converted[key] is value
    # converted once, the file is read again (swin convert's output, a state dict passed on): still official,
    # the transformer's ffn.layers keys beside it no sign of mmdetection's trunk
    assert detect_layout(converted) == "official"
    again = convert(converted)
    for key, value in official_from_timm.items():
        assert torch.equal(again[key], value), key


def test_backbone_that_is_no_swin_beside_encoder_keys_is_left_alone():
    """A ``backbone.`` that is not a whole Swin trunk is not unwrapped when other keys look like a trunk."""
    from swin.weights import unwrap

    checkpoint = {"backbone.conv1.weight": torch.zeros(1), "encoder.layers.0.linear1.weight": torch.zeros(1)}
    assert set(unwrap(checkpoint)) == set(checkpoint)


def test_timm_features_only_state_dict():
    """timm's features_only Swin (FeatureListNet) names its stages layers_0 .. layers_3: its state dict was not
    recognised. Built from the same seed it holds the trunk of timm's classifier, so both load to one trunk."""
    import timm

    torch.manual_seed(0)
    classifier = timm.create_model("swin_tiny_patch4_window7_224", depths=(1, 1, 1, 1))
    torch.manual_seed(0)
    features = timm.create_model("swin_tiny_patch4_window7_224", depths=(1, 1, 1, 1), features_only=True)
    state = features.state_dict()
    assert "layers_1.downsample.reduction.weight" in state  # timm's own naming, and the same weights
    assert torch.equal(state["layers_1.downsample.reduction.weight"], classifier.layers[1].downsample.reduction.weight)
    assert detect_layout(state) == "timm"
    ours = convert(state, source="auto")
    expected = {
        k: v for k, v in convert(classifier.state_dict(), source="timm").items() if not k.startswith(("head.", "norm."))
    }
    assert ours.keys() == expected.keys()
    assert all(torch.equal(ours[k], expected[k]) for k in expected)


def test_transformers_absolute_position_embedding_loads():
    """transformers' use_absolute_embeddings=True keeps its embedding in embeddings.position_embeddings: it is
    our absolute_pos_embed (it was left behind, the model keeping a random one: logits 0.075 off)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.SwinConfig(
        embed_dim=16, depths=[1, 1, 1, 1], num_heads=[1, 2, 4, 8], use_absolute_embeddings=True, num_labels=10
    )
    torch.manual_seed(0)
    reference = transformers.SwinForImageClassification(config).eval()
    with torch.no_grad():
        for param in reference.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    small = {"embed_dim": 16, "depths": (1, 1, 1, 1), "num_heads": (1, 2, 4, 8), "num_classes": 10, "ape": True}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every key loads
        ours = swin.create_model("swin_t", pretrained=reference.state_dict(), **small).eval()
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), reference(pixel_values=x).logits, atol=1e-5, rtol=1e-5)


def test_an_ape_model_is_not_exported_to_timms_layout():
    """timm's Swin has no absolute position embedding: its strict load refused the key, a lenient one dropped it."""
    state = swin.create_model("swin_t", depths=(1, 1, 1, 1), ape=True).state_dict()
    with pytest.raises(ValueError, match="timm's Swin has no absolute position embedding"):
        export(state, "timm")
    assert "absolute_pos_embed" in export(state, "official")


def test_training_checkpoints_of_torchvision_and_pytorch_examples(server, image):
    """torchvision's classification recipe (which trained its Swin weights) saves {"model", "model_ema" (an
    AveragedModel: module.* keys and n_averaged), "optimizer", "epoch", "args"}; PyTorch's ImageNet example
    saves {"state_dict" (DDP: module.*), "best_acc1" (a tensor), ...}. Each loads the weights the reference
    reads: the EMA by default and the trained ones with use_ema=False, as timm's load_state_dict."""
    import torchvision
    from torch.optim.swa_utils import AveragedModel

    torch.manual_seed(0)
    trained = torchvision.models.swin_t().eval()
    ema = AveragedModel(torchvision.models.swin_t()).eval()
    recipe = {"model": trained.state_dict(), "model_ema": ema.state_dict(), "epoch": 3, "args": {"lr": 0.5}}
    recipe["optimizer"] = {"state": {}, "param_groups": [{"lr": 0.5, "params": [0, 1]}]}
    example = {"epoch": 3, "arch": "swin_t", "best_acc1": torch.tensor(71.3), "optimizer": recipe["optimizer"]}
    example["state_dict"] = {f"module.{k}": v for k, v in trained.state_dict().items()}
    with torch.no_grad():
        assert (
            _max_diff(_load(server.serve("/tv/checkpoint.pth", torch_bytes(recipe)))(image), ema.module(image)) <= TOL
        )
        assert _max_diff(_load(unwrap(recipe, use_ema=False))(image), trained(image)) <= TOL
        assert (
            _max_diff(_load(server.serve("/pt/checkpoint.pth.tar", torch_bytes(example)))(image), trained(image)) <= TOL
        )
