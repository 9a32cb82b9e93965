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


def test_register_from_yaml(registry, tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(
        "swin_mini_test:\n  embed_dim: 32\n  depths: [1, 1, 2, 1]\n  num_heads: [1, 2, 4, 8]\n"
        "  aliases: [swin_mini_alias_test]\n"
    )
    assert swin.register_model(path) == ["swin_mini_test"]
    model = swin.create_model("swin_mini_alias_test", num_classes=3)
    assert model.config.embed_dim == 32 and model.num_features == 256
    with pytest.raises(ValueError, match="'swin_mini_test' is already a registered name; pass overwrite=True"):
        swin.register_model(path)


def test_register_per_stage_windows_from_yaml(registry, tmp_path):
    """timm's per-stage windows, written as YAML lists: the stages get them, and the table rows follow."""
    path = tmp_path / "windows.yaml"
    path.write_text("swin_windows_test:\n  depths: [1, 1, 2, 1]\n  window_size: [7, [8, 6], 14, 7]\n")
    swin.register_model(path)
    model = swin.create_model("swin_windows_test")
    assert [stage.window for stage in model.layers] == [(7, 7), (8, 6), (14, 14), (7, 7)]
    assert model.layers[1].blocks[0].attn.relative_position_bias_table.shape == (15 * 11, 6)


def test_register_with_bad_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("swin_bad_test:\n  embed_dim: 32\n  window: 7\n")
    with pytest.raises(TypeError, match=r"bad.yaml: entry 'swin_bad_test'.*unknown config field.*window"):
        swin.register_model(path)


@pytest.mark.parametrize("option", ["frozen_stages", "norm_eval"])
def test_backbone_options_name_the_features_only_call(option):
    with pytest.raises(TypeError, match=rf"unknown config.*features_only backbone.*features_only=True, {option}="):
        swin.create_model("swin_t", **{option: 2})
    with pytest.raises(TypeError, match=r"\['out_indices'\] are options of the features_only backbone"):
        swin.get_config("swin_t").replace(out_indices=(1, 2))


def test_unknown_name_is_a_key_error_with_suggestions():
    with pytest.raises(UnknownModelError) as info:
        resolve_name("swin_base_patch4_window7")
    assert isinstance(info.value, KeyError)
    assert "swin_base_patch4_window7_224" in str(info.value)


@pytest.fixture
def registry(monkeypatch):
    """The registry as it is, put back after the test."""
    from swin.registry import lookup

    swin.list_models()
    monkeypatch.setattr(lookup, "_configs", dict(lookup._configs))
    monkeypatch.setattr(lookup, "_aliases", dict(lookup._aliases))
    return lookup


TINY = {"embed_dim": 16, "depths": (1, 1), "num_heads": (1, 2)}


def test_names_and_aliases_are_never_taken_over(registry):
    """An alias may not take a registered name or another model's alias (timm's name would build another
    architecture); replacing an entry drops its old aliases."""
    with pytest.raises(ValueError, match="'swin_tiny_patch4_window7_224' is already a registered alias of 'swin_t'"):
        swin.register_model(name="mine", aliases=("swin_tiny_patch4_window7_224",), **TINY)
    with pytest.raises(ValueError, match="'swin_t' is already a registered name"):
        swin.register_model(name="mine", aliases=("swin_t",), **TINY)
    assert resolve_name("swin_tiny_patch4_window7_224") == "swin_t" and "mine" not in swin.list_models()
    swin.register_model(name="mine", aliases=("mine_alias",), **TINY)
    swin.register_model(name="mine", overwrite=True, **TINY)
    with pytest.raises(UnknownModelError):
        resolve_name("mine_alias")


def test_an_entry_may_list_its_own_name_among_its_aliases(registry, tmp_path):
    path = tmp_path / "self.yaml"
    path.write_text(
        "my_swin:\n  embed_dim: 16\n  depths: [1, 1]\n  num_heads: [1, 2]\n  aliases: [my_swin, my_alias]\n"
    )
    assert swin.register_model(path) == ["my_swin"]
    assert resolve_name("my_alias") == "my_swin" == resolve_name("my_swin")


def test_a_file_with_a_bad_entry_registers_nothing(registry, tmp_path):
    path = tmp_path / "two.yaml"
    path.write_text(
        "good_one:\n  embed_dim: 16\n  depths: [1, 1]\n  num_heads: [1, 2]\n"
        "bad_one:\n  embed_dim: 16\n  depths: [1, 1]\n  num_heads: [3, 2]\n"
    )
    with pytest.raises(ValueError, match="bad_one.*not divisible by num_heads=3"):
        swin.register_model(path)
    assert "good_one" not in swin.list_models()


@pytest.mark.parametrize(
    "fields,message",
    [
        ({"name": "my.model"}, "without '.'"),
        ({"name": ""}, "must be non-empty"),
        ({"num_heads": (0, 2)}, "num_heads must be positive"),
        ({"depths": (0, 1)}, "at least one block"),
        ({"depths": (), "num_heads": ()}, "at least one block"),
        ({"mlp_ratio": 0}, "mlp_ratio must be positive"),
        ({"drop_rate": 2.0}, r"drop_rate is a probability in \[0, 1\)"),
        ({"drop_path_rate": -0.5}, "drop_path_rate is a probability"),
        ({"img_size": (-5, 224)}, "img_size must be"),
    ],
)
def test_bad_fields_are_refused_when_registered(registry, fields, message):
    with pytest.raises(ValueError, match=message):
        swin.register_model(**{"name": "mine", **TINY, **fields})
    assert "mine" not in swin.list_models()


def test_fields_beside_a_config_are_an_error(registry):
    with pytest.raises(TypeError, match="give the fields in it"):
        swin.register_model(swin.get_config("swin_t").replace(name="mine"), embed_dim=16)


def test_a_models_file_that_is_not_text_is_named(registry, tmp_path):
    """A binary file given as the models file: the error names the file (it said only the codec's complaint)."""
    path = tmp_path / "models.yaml"
    path.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ValueError, match=r"models\.yaml: not a YAML text file"):
        swin.register_model(path)


def test_a_name_given_twice_in_one_file_is_refused(registry, tmp_path):
    """PyYAML keeps the last of two equal keys without a word: the first definition was lost silently."""
    path = tmp_path / "models.yaml"
    path.write_text("my_a:\n  embed_dim: 96\nmy_a:\n  embed_dim: 128\n  num_heads: [4, 8, 16, 32]\n")
    with pytest.raises(Exception, match=r"'my_a' given twice") as caught:
        swin.register_model(path)
    assert "line 3" in str(caught.value)
    assert "my_a" not in swin.list_models()


@pytest.mark.parametrize("alias", ["", "swin_t.ms_in1k", "my.model"])
def test_aliases_follow_the_name_rules(registry, alias):
    """An alias '' answered resolve_name(''), and 'swin_t.ms_in1k' made get_config disagree with create_model."""
    with pytest.raises(ValueError, match=rf"alias {alias!r} must be non-empty and without '\.'"):
        swin.register_model(name="mine", aliases=(alias,), **TINY)
    with pytest.raises(TypeError, match="expects a list of names"):
        swin.register_model(name="mine", aliases="mine_alias", **TINY)


def test_replacing_an_entry_never_hides_its_aliases_from_readers(registry):
    """Readers take no lock: an overwrite used to delete the old aliases before adding them back. Threads switch
    every 0.1 ms here (not the default 5 ms), so that readers land inside an overwrite often: the old code failed
    in 300 overwrites where 1000 at the default interval could pass (and took 30 s)."""
    import sys
    import threading

    swin.register_model(name="mine", aliases=("mine_alias",), **TINY)
    failures, done = [], threading.Event()
    interval = sys.getswitchinterval()

    def read():
        while not done.is_set():
            try:
                resolve_name("mine_alias")
            except KeyError as error:
                failures.append(error)

    readers = [threading.Thread(target=read) for _ in range(2)]
    sys.setswitchinterval(1e-4)
    try:
        for thread in readers:
            thread.start()
        for _ in range(300):
            swin.register_model(name="mine", aliases=("mine_alias",), overwrite=True, **TINY)
    finally:
        done.set()
        for thread in readers:
            thread.join()
        sys.setswitchinterval(interval)
    assert failures == []


def test_list_models_takes_timms_filters():
    """A list of patterns matches any of them and "" filters nothing, as timm.list_models's filter."""
    import timm

    patterns = ["swin_tiny*", "swinv2_small*"]
    expected = {swin.resolve_name(name) for name in timm.list_models(patterns)}
    assert set(swin.list_models(patterns)) == expected and len(expected) == 3
    assert swin.list_models("") == swin.list_models()
    assert swin.list_models(["swin_t"], pretrained=True) == swin.list_models("swin_t", pretrained=True)
    with pytest.raises(TypeError, match="a pattern or a list of patterns"):
        swin.list_models(5)


@pytest.mark.parametrize("call", ["get_config('swin_t')", "resolve_name('swin_t')", "list_models('swin_t')"])
def test_the_first_lookup_in_a_fresh_process_finds_the_bundled_models(call):
    """Loading the registry replaces its tables: a lookup that read them before loading found nothing."""
    import subprocess
    import sys

    code = f"from swin.registry import get_config, list_models, resolve_name; print({call})"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-500:]
    assert "swin_t" in result.stdout


def test_a_models_file_error_names_the_file_from_python_too(registry, tmp_path):
    """The command line said which file and line; register_model(path) said '<unicode string>'."""
    path = tmp_path / "broken.yaml"
    path.write_text("my_a:\n  embed_dim: [1,\n")
    with pytest.raises(Exception, match=rf'in "{path}", line 3'):
        swin.register_model(path)


def test_an_infinite_mlp_ratio_is_refused_when_registered(registry):
    with pytest.raises(ValueError, match="mlp_ratio must be positive and finite"):
        swin.register_model(name="mine", mlp_ratio=float("inf"), **TINY)
