"""The backbone plugged into real heads: torchvision's Faster R-CNN and an FPN segmentation head."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import swin

torchvision = pytest.importorskip("torchvision")


def test_faster_rcnn_trains_and_predicts():
    from torchvision.models.detection import FasterRCNN

    torch.manual_seed(0)
    backbone = swin.detection_backbone("swin_t", out_channels=64, depths=(2, 2, 2, 2))
    detector = FasterRCNN(backbone, num_classes=3, min_size=128, max_size=160)
    images = [torch.rand(3, 128, 150), torch.rand(3, 120, 160)]
    targets = [
        {"boxes": torch.tensor([[10.0, 12.0, 60.0, 70.0]]), "labels": torch.tensor([1])},
        {"boxes": torch.tensor([[30.0, 20.0, 100.0, 90.0], [5.0, 5.0, 40.0, 30.0]]), "labels": torch.tensor([2, 1])},
    ]
    detector.train()
    losses = detector(images, targets)
    loss = sum(losses.values())
    assert torch.isfinite(loss)
    loss.backward()
    grad = backbone.body.layers[0].blocks[0].attn.qkv.weight.grad
    assert grad is not None and grad.abs().sum() > 0
    detector.eval()
    with torch.no_grad():
        predictions = detector(images)
    assert len(predictions) == 2 and predictions[0]["boxes"].shape[-1] == 4


@pytest.mark.parametrize("part", ["detector", "backbone_with_fpn"])
def test_a_torchvision_detector_checkpoint_gives_its_trunk(part):
    """A torchvision detector around swin.detection_backbone keeps the trunk under backbone.body. (its
    BackboneWithFPN alone: body.): pretrained= takes the trunk from there, as it takes mmdetection's from under
    backbone. (every trunk key was reported missing), and says which keys it left."""
    from torchvision.models.detection import FasterRCNN

    tiny = {"embed_dim": 16, "depths": (1, 1, 1, 1), "num_heads": (1, 2, 4, 8)}
    torch.manual_seed(0)
    detector = FasterRCNN(swin.detection_backbone("swin_t", **tiny), num_classes=3)
    state = detector.state_dict() if part == "detector" else detector.backbone.state_dict()
    left = "fpn.*" if part == "backbone_with_fpn" else "roi_heads.*"
    with pytest.warns(UserWarning, match=rf"dropped \d+ key\(s\) the model does not use: .*{re.escape(left)}"):
        again = swin.detection_backbone("swin_t", pretrained=state, **tiny)
    expected = detector.backbone.body.state_dict()
    got = again.body.state_dict()
    assert expected.keys() == got.keys()
    assert all(torch.equal(expected[k], got[k]) for k in expected)


def test_retinanet_with_p6_p7_as_torchvision_builds_it():
    """RetinaNet's pyramid as torchvision builds it for a ResNet (stages 2-4, LastLevelP6P7 extra levels): the
    FPN takes torchvision's extra_blocks (only a max-pooled level or none could be had). Expected: the levels of
    torchvision's own FeaturePyramidNetwork on the body's maps, with the same weights."""
    from torchvision.models.detection import RetinaNet
    from torchvision.ops import FeaturePyramidNetwork
    from torchvision.ops.feature_pyramid_network import LastLevelP6P7

    torch.manual_seed(0)
    backbone = swin.detection_backbone(
        "swin_t", out_channels=64, depths=(1, 1, 1, 1), out_indices=(1, 2, 3), extra_blocks=LastLevelP6P7(64, 64)
    ).eval()
    x = torch.rand(1, 3, 128, 160)
    reference = FeaturePyramidNetwork(backbone.body.out_channels, 64, extra_blocks=LastLevelP6P7(64, 64)).eval()
    reference.load_state_dict(backbone.fpn.state_dict())
    with torch.no_grad():
        levels = backbone(x)
        expected = reference(dict(zip("012", backbone.body(x), strict=True)))
    assert list(levels) == list(expected) == ["0", "1", "2", "p6", "p7"]
    for got, want in zip(levels.values(), expected.values(), strict=True):
        torch.testing.assert_close(got, want)
    detector = RetinaNet(backbone, num_classes=3, min_size=128, max_size=160).train()
    target = {"boxes": torch.tensor([[10.0, 12.0, 60.0, 70.0]]), "labels": torch.tensor([1])}
    losses = detector([torch.rand(3, 128, 150)], [target])
    assert all(torch.isfinite(loss) for loss in losses.values())


class FPNSegmentationHead(nn.Module):
    """Lateral 1x1 convs, top-down sum to stride 4, a 3x3 conv and a classifier, upsampled to the image."""

    def __init__(self, in_channels, classes, width=32):
        super().__init__()
        self.lateral = nn.ModuleList(nn.Conv2d(c, width, 1) for c in in_channels)
        self.fuse = nn.Sequential(nn.Conv2d(width, width, 3, padding=1), nn.ReLU())
        self.classifier = nn.Conv2d(width, classes, 1)

    def forward(self, levels, size):
        x = self.lateral[-1](levels[-1])
        for lateral, level in zip(reversed(self.lateral[:-1]), reversed(levels[:-1]), strict=True):
            x = lateral(level) + F.interpolate(x, size=level.shape[-2:], mode="bilinear", align_corners=False)
        return F.interpolate(self.classifier(self.fuse(x)), size=size, mode="bilinear", align_corners=False)


def test_segmentation_head_learns():
    torch.manual_seed(0)
    backbone = swin.create_model(
        "swin_t", features_only=True, depths=(1, 1, 1, 1), embed_dim=48, num_heads=(3, 6, 12, 24), drop_path_rate=0.0
    )
    head = FPNSegmentationHead(backbone.out_channels, classes=2)
    # Synthetic task: segment the bright square.
    images = torch.rand(4, 3, 64, 96) * 0.2
    masks = torch.zeros(4, 64, 96, dtype=torch.long)
    for i, (top, left) in enumerate([(5, 10), (20, 40), (30, 5), (10, 60)]):
        images[i, :, top : top + 24, left : left + 24] += 0.8
        masks[i, top : top + 24, left : left + 24] = 1
    optimizer = torch.optim.AdamW([*backbone.parameters(), *head.parameters()], lr=1e-3)
    losses = []
    for _ in range(8):
        loss = F.cross_entropy(head(backbone(images), images.shape[-2:]), masks)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0], losses
