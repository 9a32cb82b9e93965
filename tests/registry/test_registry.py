"""Registry: bundled YAML, aliases, user registrations."""

from __future__ import annotations

import pytest

import swin
from swin.registry import UnknownModelError, resolve_name


def test_bundled_models():
    v1 = ["swin_b", "swin_b_384", "swin_l", "swin_l_384", "swin_s", "swin_t"]
    v2 = ["swinv2_b_w12_192", "swinv2_b_w12to16_256", "swinv2_b_w12to24_384", "swinv2_b_w16", "swinv2_b_w8"]
    v2 += ["swinv2_l_w12_192", "swinv2_l_w12to16_256", "swinv2_l_w12to24_384"]
    v2 += ["swinv2_s_w16", "swinv2_s_w8", "swinv2_t_w16", "swinv2_t_w8"]
    assert swin.list_models() == v1 + v2
    assert swin.list_models("swin_b*") == ["swin_b", "swin_b_384"]


def test_configs_match_the_paper():
    # Liu et al. 2021, section 3.3: T (96, [2,2,6,2]), S (96, [2,2,18,2]), B (128), L (192); heads C/32.
    for name, (dim, depths) in {
        "swin_t": (96, (2, 2, 6, 2)),
        "swin_s": (96, (2, 2, 18, 2)),
        "swin_b": (128, (2, 2, 18, 2)),
        "swin_l": (192, (2, 2, 18, 2)),
    }.items():
        config = swin.get_config(name)
        assert (config.embed_dim, config.depths) == (dim, depths)
        assert config.num_heads == tuple(dim * 2**i // 32 for i in range(4))
    assert swin.get_config("swin_b_384").window_size == 12


def test_aliases():
    assert resolve_name("swin_base_patch4_window12_384") == "swin_b_384"


def test_register_from_yaml(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(
        "swin_mini_test:\n  embed_dim: 32\n  depths: [1, 1, 2, 1]\n  num_heads: [1, 2, 4, 8]\n"
        "  aliases: [swin_mini_alias_test]\n"
    )
    assert swin.register_model(path) == ["swin_mini_test"]
    model = swin.create_model("swin_mini_alias_test", num_classes=3)
    assert model.config.embed_dim == 32 and model.num_features == 256
    with pytest.raises(ValueError, match="already registered"):
        swin.register_model(path)


def test_register_with_bad_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("swin_bad_test:\n  embed_dim: 32\n  window: 7\n")
    with pytest.raises(TypeError, match=r"bad.yaml: entry 'swin_bad_test'.*unknown config field.*window"):
        swin.register_model(path)


def test_unknown_name_is_a_key_error_with_suggestions():
    with pytest.raises(UnknownModelError) as info:
        resolve_name("swin_base_patch4_window7")
    assert isinstance(info.value, KeyError)
    assert "swin_base_patch4_window7_224" in str(info.value)
