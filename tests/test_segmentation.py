"""Swin inside the segmentation models users run: transformers' UperNet on our backbone gives transformers' own
Swin UperNet's logits, torchvision's Mask R-CNN trains and predicts on ``swin.detection_backbone``, and
examples/segmentation.py learns."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

import swin

transformers = pytest.importorskip("transformers")
from swin.segmentation import TransformersBackbone, convert_upernet, from_transformers, upernet  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "segmentation.py"
SMALL = {"embed_dim": 32, "depths": (2, 2, 2, 2), "num_heads": (1, 2, 4, 8)}
TINY = {"embed_dim": 16, "depths": (1, 1, 1, 1), "num_heads": (1, 2, 4, 8)}
HEAD = {"hidden_size": 64, "auxiliary_channels": 32}


@pytest.fixture(scope="module")
def reference():
    """transformers' own UperNet on its own SwinBackbone, every weight and BatchNorm statistic random."""
    config = transformers.UperNetConfig(
        backbone_config=transformers.SwinConfig(
            **{k: list(v) if isinstance(v, tuple) else v for k, v in SMALL.items()},
            window_size=7,
            out_features=["stage1", "stage2", "stage3", "stage4"],
        ),
        num_labels=5,
        **HEAD,
    )
    torch.manual_seed(0)
    model = transformers.UperNetForSemanticSegmentation(config).eval()
    with torch.no_grad():  # transformers initialises norms to 1/0 and position tables to 0: exercise them all
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
        for name, buffer in model.named_buffers():
            if name.endswith("running_mean"):
                buffer.normal_(0, 0.1)
            elif name.endswith("running_var"):
                buffer.uniform_(0.5, 1.5)
    return model


@pytest.fixture(scope="module")
def ours(reference):
    return from_transformers(reference)


def assert_same_logits(expected_model, got_model, x, tolerance=1e-4):
    with torch.no_grad():
        expected, got = expected_model(pixel_values=x).logits, got_model(pixel_values=x).logits
    assert expected.shape == got.shape == (x.shape[0], 5, *x.shape[-2:])
    assert expected.abs().max() > 0.5  # random weights still give logits far from 0
    diff = (expected - got).abs().max().item()
    assert diff <= tolerance, diff
    return diff


@pytest.mark.parametrize("shape", [(1, 3, 200, 264), (2, 3, 224, 224)])
def test_logits_match_transformers_swin_upernet(reference, ours, shape):
    """200x264 is no multiple of 32 (stage maps 50x66 ... 7x9, padded to windows); 224 is."""
    assert isinstance(ours, transformers.UperNetForSemanticSegmentation)
    assert isinstance(ours.backbone, TransformersBackbone) and isinstance(ours.backbone.body, swin.SwinBackbone)
    assert ours.backbone.channels == reference.backbone.channels == [32, 64, 128, 256]
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    assert_same_logits(reference, ours, x)


def test_saved_checkpoints_load(reference, ours, tmp_path):
    """transformers' save_pretrained writes its 4.x key names (attention.self.query, ...): a directory, the
    weights file alone (``upernet(checkpoint=...)``), and a save of ours all load to the same logits."""
    from safetensors.torch import load_file

    reference.save_pretrained(tmp_path / "theirs")
    saved = load_file(tmp_path / "theirs" / "model.safetensors")
    assert any(".attention.self.query." in key for key in saved)
    x = torch.randn(1, 3, 97, 131, generator=torch.Generator().manual_seed(2))
    assert_same_logits(reference, from_transformers(tmp_path / "theirs"), x)

    from_file = upernet("swin_t", 5, checkpoint=tmp_path / "theirs" / "model.safetensors", **SMALL, **HEAD).eval()
    assert_same_logits(reference, from_file, x)

    ours.save_pretrained(tmp_path / "ours")
    assert all(not key.startswith("backbone.swin.") for key in load_file(tmp_path / "ours" / "model.safetensors"))
    assert_same_logits(reference, from_transformers(tmp_path / "ours"), x)


def test_convert_upernet_keys(reference):
    converted = convert_upernet(reference.state_dict())
    assert "backbone.body.layers.0.blocks.0.attn.qkv.weight" in converted
    assert "backbone.body.norm3.weight" in converted and "backbone.body.norm.weight" not in converted
    assert not any(key.startswith("backbone.swin") or "hidden_states_norms" in key for key in converted)
    head = {k for k in reference.state_dict() if not k.startswith("backbone.")}
    assert head <= set(converted)
    assert convert_upernet(converted).keys() == converted.keys()  # ours passes through


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return upernet("swin_t", id2label={0: "bg", 1: "thing", 2: "stuff"}, hidden_size=32, auxiliary_channels=16, **TINY)


def test_upernet_trains_at_any_size(tiny):
    """transformers' loss (with the auxiliary head's) at a size that is no multiple of 32 reaches every part."""
    tiny.train()
    x = torch.randn(2, 3, 70, 90)
    labels = torch.randint(0, 3, (2, 70, 90))
    labels[:, :5] = 255  # transformers' ignore index
    output = tiny(pixel_values=x, labels=labels)
    assert output.logits.shape == (2, 3, 70, 90) and torch.isfinite(output.loss)
    tiny.zero_grad()
    output.loss.backward()
    for name in (
        "backbone.body.patch_embed.proj.weight",
        "decode_head.classifier.weight",
        "auxiliary_head.classifier.weight",
    ):
        grad = tiny.get_parameter(name).grad
        assert grad is not None and grad.abs().sum() > 0, name
    config = tiny.config
    assert config.num_labels == 3 and config.id2label[2] == "stuff" and config.backbone_config.depths == [1, 1, 1, 1]


def test_backbone_options_pass_through():
    model = upernet(
        "swin_t", 2, hidden_size=16, use_auxiliary_head=False, frozen_stages=4, out_indices=(1, 2, 3), **TINY
    ).eval()  # (in training, BatchNorm after the 1x1 pooling needs more than one image)
    assert model.auxiliary_head is None and model.backbone.out_features == ["stage2", "stage3", "stage4"]
    assert not any(p.requires_grad for p in model.backbone.parameters())
    with torch.no_grad():
        assert model(torch.randn(1, 3, 64, 64)).logits.shape == (1, 2, 64, 64)
    body = swin.create_model("swin_t", features_only=True, **TINY)
    assert upernet(body, 2, hidden_size=16).backbone.body is body


@pytest.mark.parametrize("out_indices", [(0, 1, 2, 3), (1, 2, 3), (2, 3)])
def test_auxiliary_head_reads_stage_2(out_indices):
    """Wherever stage 2 sits among the outputs; its channels are set in the config, as transformers 4.x
    (default 384) and 5.x (channels of map 2) would otherwise build different heads."""
    model = upernet("swin_t", 2, hidden_size=16, auxiliary_channels=8, out_indices=out_indices, **TINY).eval()
    assert model.config.auxiliary_in_channels == TINY["embed_dim"] * 4 == 64
    first = model.auxiliary_head.convs[0].conv
    assert first.in_channels == 64
    seen = []
    first.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0].shape))
    with torch.no_grad():
        model(torch.randn(1, 3, 64, 64))
    assert seen == [(1, 64, 4, 4)]  # stride 16


def test_auxiliary_head_without_stage_2_says_what_to_do():
    with pytest.raises(ValueError, match=r"include 2 in out_indices or pass use_auxiliary_head=False"):
        upernet("swin_t", 2, out_indices=(0, 1, 3), **TINY)
    assert upernet("swin_t", 2, hidden_size=16, use_auxiliary_head=False, out_indices=(0, 1, 3), **TINY)


@pytest.mark.parametrize(
    "name, options",
    [("swin_t", {"semantics": "classification", "ape": True, "patch_norm": False}), ("swinv2_t_w8", {})],
)
def test_ours_reload_from_save_pretrained(tmp_path, name, options):
    """What transformers' SwinConfig cannot say (V2, semantics, ape, patch_norm, ...) comes back too."""
    torch.manual_seed(0)
    model = upernet(name, 3, hidden_size=16, auxiliary_channels=8, frozen_stages=1, **TINY, **options).eval()
    model.save_pretrained(tmp_path)
    again = from_transformers(tmp_path)
    body, before = again.backbone.body, model.backbone.body
    assert body.config == before.config and body.semantics == before.semantics and body.frozen_stages == 1
    x = torch.randn(1, 3, 70, 90, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected, got = model(pixel_values=x).logits, again(pixel_values=x).logits
    assert expected.abs().max() > 0 and (expected - got).abs().max().item() <= 1e-6


def test_errors_say_what_to_do(tiny):
    with pytest.raises(ValueError, match="num_labels"):
        upernet("swin_t", **TINY)
    with pytest.raises(ValueError, match="id2label names 3"):
        upernet("swin_t", 2, id2label={0: "a", 1: "b", 2: "c"}, **TINY)
    with pytest.raises(TypeError, match="create_model"):
        upernet(swin.create_model("swin_t", features_only=True, **TINY), 2, drop_path_rate=0.2)
    with pytest.raises(ValueError, match=r"6 of another shape \(checkpoint vs model\) \['auxiliary_head"):
        upernet("swin_t", 3, checkpoint=tiny.state_dict(), hidden_size=32, **TINY)  # no auxiliary_channels=16
    with pytest.raises(ValueError, match="model_type 'swin'"):
        from_transformers(transformers.UperNetConfig())  # its default backbone is a ResNet
    with pytest.raises(FileNotFoundError, match=r"'path/to/upernet'\): no such folder \(a hub id is OWNER/NAME\)"):
        from_transformers("path/to/upernet")  # huggingface_hub said 'Repo id must be in the form ...'
    with pytest.raises(FileNotFoundError, match="no such folder"):
        from_transformers(Path("missing"))
    with pytest.raises(ValueError, match="output_attentions"), torch.no_grad():
        tiny(torch.randn(1, 3, 64, 64), output_attentions=True)


def test_mask_rcnn_trains_and_predicts():
    torchvision = pytest.importorskip("torchvision")
    from torchvision.models.detection import MaskRCNN

    torch.manual_seed(0)
    backbone = swin.detection_backbone("swin_t", out_channels=32, drop_path_rate=0.0, **TINY)
    detector = MaskRCNN(backbone, num_classes=3, min_size=128, max_size=160)
    assert isinstance(detector, torchvision.models.detection.MaskRCNN)
    images = [torch.rand(3, 128, 150), torch.rand(3, 120, 160)]
    targets = []
    for (x0, y0, x1, y1), label, (height, width) in [
        ((10, 12, 60, 70), 1, (128, 150)),
        ((30, 20, 100, 90), 2, (120, 160)),
    ]:
        mask = torch.zeros(1, height, width, dtype=torch.uint8)
        mask[:, y0:y1, x0:x1] = 1
        targets.append(
            {
                "boxes": torch.tensor([[x0, y0, x1, y1]], dtype=torch.float),
                "labels": torch.tensor([label]),
                "masks": mask,
            }
        )

    detector.train()
    losses = detector(images, targets)
    assert {"loss_classifier", "loss_box_reg", "loss_mask", "loss_objectness", "loss_rpn_box_reg"} <= set(losses)
    assert all(torch.isfinite(value) for value in losses.values()), losses
    optimizer = torch.optim.SGD(detector.parameters(), lr=0.01)
    watched = {
        name: detector.get_parameter(name).detach().clone()
        for name in (
            "backbone.body.layers.0.blocks.0.attn.qkv.weight",
            "roi_heads.mask_predictor.mask_fcn_logits.weight",
        )
    }
    optimizer.zero_grad()
    sum(losses.values()).backward()
    optimizer.step()
    for name, before in watched.items():
        assert not torch.equal(detector.get_parameter(name), before), name

    detector.eval()
    detector.roi_heads.score_thresh = 0.0  # random weights: keep every detection so that masks come out
    with torch.no_grad():
        predictions = detector(images)
    assert len(predictions) == 2
    for prediction, image in zip(predictions, images, strict=True):
        n = len(prediction["boxes"])
        assert n > 0 and prediction["boxes"].shape == (n, 4)
        assert prediction["labels"].shape == prediction["scores"].shape == (n,)
        assert prediction["masks"].shape == (n, 1, *image.shape[-2:])


def load_example():
    spec = importlib.util.spec_from_file_location("segmentation_example", SCRIPT)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


def test_example_loss_falls(one_thread, capsys):
    args = ["--model-kwargs", json.dumps(TINY), "--size", "64", "--hidden-size", "32", "--images", "16"]
    metrics = load_example().main([*args, "--steps", "16", "--lr", "1e-3", "--seed", "0"])
    losses = torch.tensor(metrics["losses"])
    assert len(losses) == 16 and torch.isfinite(losses).all()
    assert losses[-4:].mean() < 0.9 * losses[:4].mean(), losses
    printed = capsys.readouterr().out
    assert "step   15  loss" in printed and "pixel accuracy" in printed


@pytest.mark.parametrize(
    ("option", "value", "least"),
    [
        ("--batch-size", "0", 2),  # printed loss nan
        ("--batch-size", "1", 2),  # UperNet's BatchNorm on 1x1 pooled maps: a ValueError mid-training
        ("--images", "0", 1),  # a raw RuntimeError from torch.randint
        ("--threads", "0", 1),  # silently ignored
        ("--steps", "-1", 1),
        ("--size", "4", 8),
        ("--hidden-size", "x", 1),
    ],
)
def test_example_bad_numbers_are_argparse_errors(capsys, option, value, least):
    with pytest.raises(SystemExit) as exit_:
        load_example().parse_args([option, value])
    message = f"argument {option}: expected a whole number of at least {least}, got {value!r}"
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_example_freezes_a_tagged_backbone(one_thread):
    """--model swin_t.ms_in1k --freeze-backbone raised UnknownModelError: the stages were counted from the name."""
    example = load_example()
    argv = ["--model", "swin_t.ms_in1k", "--freeze-backbone", "--model-kwargs", json.dumps(TINY)]
    argv += ["--size", "32", "--hidden-size", "16", "--images", "4", "--batch-size", "2", "--steps", "2"]
    model = example.build_model(example.parse_args(argv))
    assert not any(p.requires_grad for p in model.backbone.parameters())
    assert all(p.requires_grad for name, p in model.named_parameters() if not name.startswith("backbone."))
    example.train_mode(model, freeze_backbone=True)
    assert model.decode_head.training and not any(m.training for m in model.backbone.modules())
    metrics = example.main(argv)
    assert len(metrics["losses"]) == 2 and torch.isfinite(torch.tensor(metrics["losses"])).all()


def test_a_rectangular_window_is_refused_naming_it():
    """transformers' Swin config, which describes the backbone, holds one window side: a (8, 6) window failed
    inside transformers with a dataclass type error."""
    with pytest.raises(ValueError, match=r"window is 8x6: build it with one square window_size"):
        upernet("swin_t", 3, hidden_size=16, window_size=(8, 6), **TINY)
    with pytest.raises(ValueError, match=r"window is 7, 7, 14, 7 per stage: build it with one square window_size"):
        upernet("swin_t", 3, hidden_size=16, window_size=(7, 7, 14, 7), **TINY)


def test_a_transformers_upernet_on_three_stages_converts():
    """transformers' Swin UperNet with out_features ending at stage3 keeps stage 4's weights in its backbone; ours
    does not build that stage, so its keys are dropped with a warning (the conversion failed, blaming the sizes)."""
    config = transformers.UperNetConfig(
        backbone_config=transformers.SwinConfig(
            **{k: list(v) if isinstance(v, tuple) else v for k, v in TINY.items()},
            window_size=7,
            out_features=["stage1", "stage2", "stage3"],
        ),
        num_labels=5,
        auxiliary_in_channels=64,
        **HEAD,
    )
    torch.manual_seed(0)
    reference = transformers.UperNetForSemanticSegmentation(config).eval()
    with torch.no_grad():
        for param in reference.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    with pytest.warns(UserWarning, match="backbone stages this model does not build"):
        ours = from_transformers(reference)
    assert_same_logits(reference, ours, torch.randn(1, 3, 97, 131))


@pytest.mark.parametrize(
    "wrap",
    [
        lambda sd: {"state_dict": sd, "meta": {"epoch": 3}},  # mmsegmentation's / Lightning's training checkpoint
        lambda sd: {"model": sd, "optimizer": {}},
        lambda sd: {f"module.{k}": v for k, v in sd.items()},  # saved from DistributedDataParallel
        lambda sd: {"state_dict": {k: v * 0 for k, v in sd.items()}, "state_dict_ema": sd},  # EMA first, as timm
    ],
    ids=["state_dict", "model", "module.", "ema"],
)
def test_a_training_checkpoint_loads_whole(tiny, wrap, tmp_path):
    """upernet(checkpoint=...) reads a training checkpoint as create_model's checkpoint_path= does (it reported
    every key missing and the wrapper's keys unexpected)."""
    torch.manual_seed(1)
    source = upernet("swin_t", 3, hidden_size=32, auxiliary_channels=16, **TINY).eval()
    torch.save(wrap(source.state_dict()), tmp_path / "checkpoint.pth")
    loaded = upernet("swin_t", 3, hidden_size=32, auxiliary_channels=16, checkpoint=tmp_path / "checkpoint.pth", **TINY)
    x = torch.randn(1, 3, 64, 96, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected, got = source(pixel_values=x).logits, loaded.eval()(pixel_values=x).logits
    assert expected.abs().max() > 0 and torch.equal(expected, got)


def test_a_stem_output_is_refused_naming_it():
    """transformers' out_features may name 'stem' (the patch embedding); its index -1 was read as the last stage
    and the error named out_features the config never asked for."""
    config = transformers.UperNetConfig(
        backbone_config=transformers.SwinConfig(
            **{k: list(v) if isinstance(v, tuple) else v for k, v in TINY.items()},
            out_features=["stem", "stage1", "stage2"],
        ),
        num_labels=3,
        **HEAD,
    )
    with pytest.raises(ValueError, match=r"includes 'stem' \(the patch embedding's output\)"):
        from_transformers(config)
