"""torch.fx symbolic tracing: what torchvision's create_feature_extractor and timm's AttentionExtract(method="fx")
build on. The traced graph computes what eager computes, at any size, and shows each attention's softmax.
Expected values: the eager model, and the maps a forward hook on attn.softmax receives."""

from __future__ import annotations

import pytest
import torch

import swin


@pytest.mark.parametrize(
    ("name", "options"), [("swin_t", {}), ("swinv2_t_w8", {}), ("swin_t", {"ape": True})], ids=["v1", "v2", "ape"]
)
def test_a_symbolic_trace_computes_as_eager_at_any_size(name, options):
    """The absolute position embedding (ape) is resized to each input's grid inside the graph too."""
    torch.manual_seed(0)
    model = swin.create_model(name, depths=(2, 2, 2, 2), num_classes=10, **options).eval()
    graph = torch.fx.symbolic_trace(model)
    with torch.no_grad():
        for size in ((64, 64), (96, 128), (61, 75)):  # one graph; padding and shifts decided per call
            x = torch.randn(2, 3, *size)
            torch.testing.assert_close(graph(x), model(x), atol=1e-5, rtol=1e-5)


def test_feature_extractors_on_the_trace():
    """torchvision's create_feature_extractor takes any node; timm's AttentionExtract(method="fx") finds every
    '*attn.softmax' node, with the maps a hook on the module receives (it found no node: tracing failed)."""
    from timm.utils import AttentionExtract
    from torchvision.models.feature_extraction import create_feature_extractor

    torch.manual_seed(0)
    model = swin.create_model("swin_t", depths=(2, 2, 2, 2), num_classes=10).eval()
    x = torch.randn(2, 3, 64, 64)
    hooked = {}
    handles = [
        module.register_forward_hook(lambda m, args, out, name=name: hooked.__setitem__(name, out))
        for name, module in model.named_modules()
        if name.endswith("attn.softmax")
    ]
    with torch.no_grad():
        model(x)
    for handle in handles:
        handle.remove()
    with torch.no_grad():
        maps = AttentionExtract(model, method="fx")(x)
        features = create_feature_extractor(model, return_nodes={"norm": "final"})(x)["final"]
        expected_features = model.forward_features(x).permute(0, 2, 3, 1)  # the normed map, NHWC in the trunk
    assert len(maps) == len(hooked) == 8
    for probs, expected in zip(maps.values(), hooked.values(), strict=True):  # both in block order
        torch.testing.assert_close(probs, expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(features, expected_features, atol=1e-5, rtol=1e-5)
