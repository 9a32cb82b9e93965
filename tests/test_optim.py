"""swin.param_groups: weight-decay split and layer-wise learning-rate decay, checked against the model's structure
(which module a parameter belongs to), not against the names the code under test parses."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from torch import nn

import swin
from swin.optim import layer_ids

TINY = dict(depths=(2, 1, 3, 1), embed_dim=16, num_heads=(1, 2, 4, 8), img_size=64, num_classes=10)


def tiny_classifier(**overrides) -> swin.SwinTransformer:
    torch.manual_seed(0)
    return swin.create_model("swin_t", **{**TINY, **overrides})


def tiny_backbone(**overrides) -> swin.SwinBackbone:
    torch.manual_seed(0)
    return swin.create_model("swin_t", features_only=True, **{**TINY, **overrides})


def expected_decay(model: nn.Module) -> dict[int, bool]:
    """Per parameter (by id): trained with weight decay? The official rule, by module type: Linear and Conv
    weights decay; norms, biases, the bias tables and the absolute position embedding do not."""
    decay = {}
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            weight_of_projection = isinstance(module, (nn.Linear, nn.Conv2d)) and name == "weight"
            decay[id(param)] = weight_of_projection
    return decay


def expected_layer(model: nn.Module) -> tuple[dict[int, int], int]:
    """Per parameter (by id): layer id from the module tree, and the top id (num_blocks + 1)."""
    trunk = next(m for m in model.modules() if isinstance(m, swin.SwinTransformer | swin.SwinBackbone))
    num_blocks = sum(len(stage.blocks) for stage in trunk.layers)
    layer = {id(p): num_blocks + 1 for p in model.parameters()}  # head, final norm, anything outside the trunk
    for p in trunk.patch_embed.parameters():
        layer[id(p)] = 0
    if trunk.absolute_pos_embed is not None:
        layer[id(trunk.absolute_pos_embed)] = 0
    block = 0
    for i, stage in enumerate(trunk.layers):
        for b in stage.blocks:
            block += 1
            for p in b.parameters():
                layer[id(p)] = block
        ends = [stage.downsample] if stage.downsample is not None else []
        ends += [getattr(trunk, f"norm{i}")] if hasattr(trunk, f"norm{i}") else []
        for module in ends:
            for p in module.parameters():
                layer[id(p)] = block
    return layer, num_blocks + 1


def group_of(groups: list[dict]) -> dict[int, dict]:
    found: dict[int, dict] = {}
    for group in groups:
        for p in group["params"]:
            assert id(p) not in found, "a parameter is in two groups"
            found[id(p)] = group
    return found


@pytest.mark.parametrize("build", [tiny_classifier, tiny_backbone], ids=["classifier", "backbone"])
@pytest.mark.parametrize("layer_decay", [None, 0.75])
def test_every_parameter_in_exactly_one_group_with_the_right_decay(build, layer_decay):
    model = build(ape=True)
    groups = swin.param_groups(model, weight_decay=0.05, layer_decay=layer_decay, lr=1e-3)
    found = group_of(groups)
    params = list(model.parameters())
    assert len(found) == len(params) and all(id(p) in found for p in params)
    decay = expected_decay(model)
    assert sum(decay.values()) > 0 and sum(not d for d in decay.values()) > 0
    for p in params:
        assert found[id(p)]["weight_decay"] == (0.05 if decay[id(p)] else 0.0)
    if layer_decay is None:
        assert len(groups) == 2
        assert all(g["lr"] == 1e-3 and "lr_scale" not in g for g in groups)


def test_named_no_weight_decay_parameters_get_zero():
    model = tiny_classifier(ape=True)
    found = group_of(swin.param_groups(model, weight_decay=0.1))
    tables = [m.relative_position_bias_table for m in model.modules() if hasattr(m, "relative_position_bias_table")]
    assert len(tables) == sum(TINY["depths"])
    for p in [*tables, model.absolute_pos_embed]:
        assert p.ndim > 1 and found[id(p)]["weight_decay"] == 0.0
    assert found[id(model.head.weight)]["weight_decay"] == 0.1
    assert found[id(model.layers[0].blocks[0].attn.qkv.weight)]["weight_decay"] == 0.1


def test_no_weight_decay_names_tables_and_v2_parameters():
    """The official no_weight_decay() and keywords (absolute_pos_embed, tables, V2's logit_scale and cpb_mlp), as
    timm's Swin names them; 1-D parameters are the optimizer's rule (they were named too, so timm's
    filter_bias_and_bn=False left norms and biases undecayed where timm's own model decays them)."""
    model = tiny_classifier(ape=True)
    attn = model.layers[1].blocks[0].attn
    # Swin-V2's names, attached to a V1 model: the continuous position bias MLP and the attention scale.
    attn.cpb_mlp = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, attn.num_heads, bias=False))
    attn.logit_scale = nn.Parameter(torch.zeros(attn.num_heads, 1, 1))
    names = model.no_weight_decay()
    params = dict(model.named_parameters())
    expected = {n for n in params if n.endswith(("relative_position_bias_table", "logit_scale")) or ".cpb_mlp." in n}
    assert names == expected | {"absolute_pos_embed"}
    assert "layers.1.blocks.0.attn.logit_scale" in names and "layers.1.blocks.0.attn.cpb_mlp.2.weight" in names
    assert "head.weight" not in names and "norm.weight" not in names
    found = group_of(swin.param_groups(model, weight_decay=0.05))
    assert found[id(attn.cpb_mlp[0].weight)]["weight_decay"] == 0.0
    assert found[id(attn.logit_scale)]["weight_decay"] == 0.0


def test_explicit_no_weight_decay_matches_whole_name_parts():
    model = tiny_classifier()
    found = group_of(swin.param_groups(model, weight_decay=0.05, no_weight_decay=["qkv"]))
    block = model.layers[0].blocks[0]
    assert found[id(block.attn.qkv.weight)]["weight_decay"] == 0.0
    assert found[id(block.attn.proj.weight)]["weight_decay"] == 0.05
    # An explicit list replaces the model's names, so the bias tables decay now; 1-D parameters never do.
    assert found[id(block.attn.relative_position_bias_table)]["weight_decay"] == 0.05
    assert found[id(block.norm1.weight)]["weight_decay"] == 0.0
    found = group_of(swin.param_groups(model, weight_decay=0.05, no_weight_decay="head"))
    assert found[id(model.head.weight)]["weight_decay"] == 0.0


@pytest.mark.parametrize("build", [tiny_classifier, tiny_backbone], ids=["classifier", "backbone"])
def test_layer_decay_follows_block_depth(build):
    model = build(ape=True)
    lr, decay_rate = 0.1, 0.7
    groups = swin.param_groups(model, weight_decay=0.05, layer_decay=decay_rate, lr=lr)
    found = group_of(groups)
    layer, top = expected_layer(model)
    assert top == sum(TINY["depths"]) + 1
    for name, p in model.named_parameters():
        assert found[id(p)]["layer_id"] == layer[id(p)], name
        assert found[id(p)]["lr"] == pytest.approx(lr * decay_rate ** (top - layer[id(p)]), rel=1e-12), name
        assert "lr_scale" not in found[id(p)]  # in lr already: timm's schedulers would apply it again
    scaled = group_of(swin.param_groups(model, weight_decay=0.05, layer_decay=decay_rate))  # for timm's schedulers
    for p in model.parameters():
        assert scaled[id(p)]["lr_scale"] == pytest.approx(decay_rate ** (top - layer[id(p)]), rel=1e-12)
    rates = [g["lr"] for g in groups]
    patch = found[id(model.patch_embed.proj.weight)]["lr"]
    assert patch == min(rates) == pytest.approx(lr * decay_rate**top)
    last_block = model.layers[-1].blocks[-1]
    assert found[id(last_block.mlp.fc1.weight)]["lr"] == pytest.approx(lr * decay_rate)
    if isinstance(model, swin.SwinTransformer):
        assert found[id(model.head.weight)]["lr"] == lr == max(rates)
    else:
        assert found[id(model.norm3.weight)]["lr"] == pytest.approx(lr * decay_rate)  # with its stage
        assert max(rates) == pytest.approx(lr * decay_rate)  # no head: the deepest block is the top


def test_layer_ids_of_patch_merging_go_with_the_stage_they_end():
    model = tiny_classifier()
    ids = layer_ids(model)
    # depths (2, 1, 3, 1): blocks 1-2 | 3 | 4-6 | 7; head 8.
    assert ids["layers.0.downsample.reduction.weight"] == ids["layers.0.blocks.1.attn.qkv.weight"] == 2
    assert ids["layers.1.downsample.norm.weight"] == ids["layers.1.blocks.0.norm1.weight"] == 3
    assert ids["layers.2.blocks.0.mlp.fc2.bias"] == 4
    assert ids["layers.3.blocks.0.mlp.fc2.bias"] == 7
    assert ids["norm.weight"] == ids["head.bias"] == 8
    assert ids["patch_embed.proj.weight"] == 0


def test_wrapped_model_and_new_modules_outside_the_trunk():
    backbone = tiny_backbone(out_indices=(1, 3))
    model = nn.ModuleDict({"backbone": backbone, "neck": nn.Linear(128, 4)})
    groups = swin.param_groups(model, weight_decay=0.05, layer_decay=0.5, lr=1.0)
    found = group_of(groups)
    assert len(found) == len(list(model.parameters()))
    top = sum(TINY["depths"]) + 1
    assert found[id(model["neck"].weight)]["lr"] == 1.0 and found[id(model["neck"].weight)]["layer_id"] == top
    assert found[id(backbone.patch_embed.proj.weight)]["lr"] == 0.5**top
    # The trunk's names still reach it under the "backbone." prefix.
    table = backbone.layers[0].blocks[0].attn.relative_position_bias_table
    assert found[id(table)]["weight_decay"] == 0.0
    assert found[id(model["neck"].weight)]["weight_decay"] == 0.05


def test_frozen_parameters_are_left_out():
    model = tiny_backbone(frozen_stages=2)
    groups = swin.param_groups(model, layer_decay=0.9, lr=1e-3)
    found = group_of(groups)
    trainable = [p for p in model.parameters() if p.requires_grad]
    frozen = [p for p in model.parameters() if not p.requires_grad]
    assert frozen and trainable
    assert len(found) == len(trainable) and not any(id(p) in found for p in frozen)


def test_adamw_applies_each_groups_rate_and_decay():
    """With zero gradients an AdamW step only decays: p <- p * (1 - lr_group * weight_decay_group)."""
    model = tiny_classifier()
    lr, wd, decay_rate = 0.01, 0.5, 0.6
    groups = swin.param_groups(model, weight_decay=wd, layer_decay=decay_rate, lr=lr)
    optimizer = torch.optim.AdamW(groups, lr=123.0)  # the groups' own rates win over this default
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    layer, top = expected_layer(model)
    decays = expected_decay(model)
    for name, p in model.named_parameters():
        factor = 1 - lr * decay_rate ** (top - layer[id(p)]) * wd if decays[id(p)] else 1.0
        torch.testing.assert_close(p.detach(), before[name] * factor, rtol=1e-6, atol=0, msg=name)


def test_errors():
    model = tiny_classifier()
    with pytest.raises(ValueError, match="layer_decay must be in"):
        swin.param_groups(model, layer_decay=0.0)
    with pytest.raises(ValueError, match="weight_decay must be"):
        swin.param_groups(model, weight_decay=-1)
    with pytest.raises(ValueError, match="Swin model"):
        swin.param_groups(nn.Linear(3, 3), layer_decay=0.9)
    groups = swin.param_groups(nn.Linear(3, 3), weight_decay=0.1)  # without layer decay any module works
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]


def test_no_weight_decay_patterns_match_full_names_as_timm():
    """Entries with * ? [ are fnmatch patterns over the full parameter name, as timm's no_weight_decay_list."""
    from timm.optim import param_groups_weight_decay

    model = tiny_classifier()
    patterns = ["*relative_position_bias_table", "head.*"]
    ours = group_of(swin.param_groups(model, weight_decay=0.05, no_weight_decay=patterns))
    theirs = group_of(param_groups_weight_decay(model, weight_decay=0.05, no_weight_decay_list=patterns))
    for name, p in model.named_parameters():
        assert ours[id(p)]["weight_decay"] == theirs[id(p)]["weight_decay"], name
    assert ours[id(model.layers[0].blocks[0].attn.relative_position_bias_table)]["weight_decay"] == 0.0
    assert ours[id(model.head.weight)]["weight_decay"] == 0.0


@pytest.mark.parametrize("entries", [["relative_position_bias"], ["qkv", "head.weigth*"]])
def test_no_weight_decay_entries_matching_nothing_are_named_in_a_warning(entries):
    """A warning, not an error: the official code's list names absolute_pos_embed, which swin_t does not have."""
    model = tiny_classifier()
    expected = f"{re.escape(repr(entries[-1]))}.*match no parameter.*'patch_embed.proj.weight'"
    with pytest.warns(UserWarning, match=expected):
        swin.param_groups(model, no_weight_decay=entries)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        swin.param_groups(model, no_weight_decay=["relative_position_bias_table", "head.*"])


def test_timm_group_matcher_puts_backbone_norms_with_their_stage():
    """Through timm's create_optimizer_v2, a backbone's norm{i} gets the rate of stage i's last block."""
    from timm.optim import create_optimizer_v2

    model = tiny_backbone()
    found = group_of(create_optimizer_v2(model, "adamw", lr=1.0, layer_decay=0.5).param_groups)
    for i, stage in enumerate(model.layers):
        norm = getattr(model, f"norm{i}")
        last = stage.blocks[-1].mlp.fc1.weight
        assert found[id(norm.weight)]["lr_scale"] == found[id(last)]["lr_scale"], i


def test_every_swin_in_the_model_gets_its_no_weight_decay_names():
    model = nn.ModuleDict({"student": tiny_classifier(), "teacher": tiny_classifier()})
    found = group_of(swin.param_groups(model, weight_decay=0.05))
    for part in ("student", "teacher"):
        table = model[part].layers[0].blocks[0].attn.relative_position_bias_table
        assert found[id(table)]["weight_decay"] == 0.0, part
        assert found[id(model[part].head.weight)]["weight_decay"] == 0.05, part
    with pytest.raises(ValueError, match="one Swin per param_groups call"):
        swin.param_groups(model, layer_decay=0.9)
    with pytest.raises(ValueError, match="one Swin"):
        layer_ids(model)


def test_layer_decay_of_a_timm_swin_points_to_timm():
    import timm

    model = timm.create_model("swin_tiny_patch4_window7_224", depths=(1, 1, 1, 1), embed_dim=16, num_heads=(1, 2, 4, 8))
    with pytest.raises(ValueError, match=r"timm\.models\.swin_transformer\.SwinTransformer.*create_optimizer_v2"):
        swin.param_groups(model, layer_decay=0.9)


def test_timms_scheduler_on_groups_with_lr_applies_the_layer_scale_once():
    """Groups made with lr= under timm's cosine scheduler: each group's rate is timm's own optimizer's for that
    parameter (create_optimizer_v2 with the same layer decay; its groups follow timm's layer numbering, so the
    comparison is at the patch embedding and the head, which both number alike). The scale was applied twice
    (the patch embedding at 3.2e-5 against timm's 1.8e-4)."""
    from timm.optim import create_optimizer_v2
    from timm.scheduler import CosineLRScheduler

    model = tiny_classifier()
    ours = torch.optim.AdamW(swin.param_groups(model, weight_decay=0.05, layer_decay=0.75, lr=1e-3))
    theirs = create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05, layer_decay=0.75)
    for optimizer in (ours, theirs):
        CosineLRScheduler(optimizer, t_initial=10).step(3)
    for p in (model.patch_embed.proj.weight, model.head.weight):
        assert group_of(ours.param_groups)[id(p)]["lr"] == pytest.approx(group_of(theirs.param_groups)[id(p)]["lr"])


def test_timms_optimizer_without_its_1d_filter_decays_norms_as_on_timms_model():
    """create_optimizer_v2(filter_bias_and_bn=False) decays norms and biases on timm's Swin; on ours too (our
    no_weight_decay() named every 1-D parameter, so they stayed undecayed)."""
    import timm
    from timm.optim import create_optimizer_v2

    ours = tiny_classifier()
    theirs = timm.create_model(
        "swin_tiny_patch4_window7_224", embed_dim=TINY["embed_dim"], depths=TINY["depths"], num_heads=TINY["num_heads"]
    )
    for model, norm in ((ours, ours.norm.weight), (theirs, theirs.norm.weight)):
        groups = group_of(
            create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05, filter_bias_and_bn=False).param_groups
        )
        assert groups[id(norm)]["weight_decay"] == 0.05, type(model).__module__
