"""What makes the command line feel finished: patterns over timm's names, aligned columns, `swin info`'s tags and
cost, user YAML models for every command, `python -m swin`, `--version`, one `--weights`, help everywhere."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from importlib.metadata import version

import pytest

from swin.tools.cli import COMMANDS, build_parser, main

USER_MODELS = """
my_swin:
  embed_dim: 32
  depths: [1, 1, 1, 1]
  num_heads: [1, 2, 4, 8]
  window_size: 7
  img_size: 224
"""


def test_patterns_match_timm_aliases_as_timm_does(capsys):
    timm = pytest.importorskip("timm")
    assert main(["list", "*tiny*", "--format", "json"]) == 0
    import json

    rows = json.loads(capsys.readouterr().out)
    ours = {alias for row in rows for alias in row["aliases"]}
    registered = {alias for row in _all_rows(capsys) for alias in row["aliases"]}
    assert ours and ours == set(timm.list_models("*tiny*")) & registered


def _all_rows(capsys):
    import json

    assert main(["list", "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_tag_patterns_select_by_pretrained_tag(capsys):
    assert main(["list", "swin_t.ms_in22k"]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[0] == "swin_t"
    assert main(["list", "swin_t.no_such_tag"]) == 1


def test_no_match_is_exit_1_with_a_message(capsys):
    assert main(["list", "resnet*"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "no model matches 'resnet*'" in captured.err


ROW = re.compile(r"(?P<model>\S+) +(?P<input>\d+x\d+) +(?P<window>\d+) +(?P<params>[\d.]+M) +(?P<timm>\S.*)")


def test_columns_are_aligned(capsys):
    """Every row's cells line up with the header's: the text columns (model, input, timm name) start where their
    heading starts, the number columns (window, params) end where theirs ends, for the long V2 names and the
    short V1 names alike."""
    assert main(["list"]) == 0
    header, *lines = capsys.readouterr().out.splitlines()
    rows = [ROW.fullmatch(line) for line in lines]
    assert all(rows), lines
    v1 = [row for row in rows if not row["model"].startswith("swinv2_")]
    v2 = [row for row in rows if row["model"].startswith("swinv2_")]
    assert v1 and v2 and max(len(r["model"]) for r in v1) < max(len(r["model"]) for r in v2)
    starts = {"model": 0, "input": header.index("input"), "timm": header.index("timm name")}
    ends = {name: header.index(name) + len(name) for name in ("window", "params")}
    for group in (v1, v2):
        assert {column: {row.start(column) for row in group} for column in starts} == {
            column: {start} for column, start in starts.items()
        }
        assert {column: {row.end(column) for row in group} for column in ends} == {
            column: {end} for column, end in ends.items()
        }


def test_info_shows_tags_accuracy_params_and_gmacs(capsys):
    assert main(["info", "swin_t", "--format", "json"]) == 0
    import json

    info = json.loads(capsys.readouterr().out)
    assert abs(info["gmacs"] - 4.5) < 0.05  # Swin paper, table 1: Swin-T 4.5G FLOPs (multiply-adds)
    timm = pytest.importorskip("timm")
    published = {name.split(".", 1)[1] for name in timm.list_pretrained("swin_tiny_patch4_window7_224.*")}
    assert published <= {t["tag"] for t in info["tags"]}
    by_tag = {t["tag"]: t for t in info["tags"]}
    assert by_tag["ms_in1k"]["top1"] == 81.2 and by_tag["ms_in22k"]["num_classes"] == 21841  # MODELHUB.md
    assert main(["info", "swin_t"]) == 0
    out = capsys.readouterr().out
    assert "GMACs" in out and "GFLOPs = 2 x GMACs" in out and "ms_in22k_ft_in1k" in out and "top-1 81.20" in out
    assert "version" not in out and "stage 1: 56x56 tokens, 96 channels, 2 blocks" in out


def test_info_of_a_swin_v2_model_says_so(capsys):
    """The table gave a V2 model's fields as a V1's (version and pretrained windows in the JSON only)."""
    assert main(["info", "swinv2_b_w12to16_256"]) == 0
    out = capsys.readouterr().out
    assert "version         2 (Swin V2: pretrained_window_sizes [12, 12, 12, 6])" in out


@pytest.fixture(autouse=True)
def restore_registry():
    """main() registers user models in this process's registry: put it back for the other tests."""
    from swin.registry import lookup

    lookup._ensure_loaded()
    configs, aliases = dict(lookup._configs), dict(lookup._aliases)
    yield
    lookup._configs.clear()
    lookup._configs.update(configs)
    lookup._aliases.clear()
    lookup._aliases.update(aliases)


@pytest.fixture
def models_file(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(USER_MODELS)
    return path


def test_models_file_makes_yaml_models_visible(models_file, capsys):
    assert main(["--models-file", str(models_file), "list", "my_*"]) == 0
    assert "my_swin" in capsys.readouterr().out
    assert main([f"--models-file={models_file}", "info", "my_swin", "--format", "json"]) == 0
    assert '"embed_dim": 32' in capsys.readouterr().out


def test_models_file_may_follow_the_command(models_file, capsys):
    assert main(["list", "my_*", "--models-file", str(models_file)]) == 0
    assert "my_swin" in capsys.readouterr().out
    assert main(["flops", "my_swin", f"--models-file={models_file}", "--format", "json"]) == 0
    assert '"my_swin"' in capsys.readouterr().out


def test_swin_models_env_reaches_every_command(models_file, monkeypatch, capsys):
    monkeypatch.setenv("SWIN_MODELS", str(models_file))
    assert main(["flops", "my_swin", "--format", "json"]) == 0
    assert "my_swin" in capsys.readouterr().out


def test_per_stage_windows_are_shown_as_such(tmp_path, capsys):
    """A models file with one window per stage (timm's form): every command says the windows in one spelling."""
    path = tmp_path / "windows.yaml"
    path.write_text(USER_MODELS.replace("window_size: 7", "window_size: [7, 7, 14, [8, 6]]"))
    assert main(["--models-file", str(path), "info", "my_swin"]) == 0
    out = capsys.readouterr().out
    assert "window_size     7, 7, 14, 8x6 per stage" in out and "stage 4: 7x7 tokens" in out
    assert "window 7x6" in out  # stage 4's map (7x7) shrinks the 8x6 window's height
    assert main(["--models-file", str(path), "list", "my_*"]) == 0
    assert "7, 7, 14, 8x6 per stage" in capsys.readouterr().out
    assert main(["--models-file", str(path), "flops", "my_swin", "--no-measure"]) == 0
    assert "window 7, 7, 14, 8x6 per stage" in capsys.readouterr().out


def test_missing_models_file_is_one_line(tmp_path, capsys):
    assert main(["--models-file", str(tmp_path / "none.yaml"), "list"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "none.yaml is not a file" in err


def test_python_dash_m_swin_and_version():
    result = subprocess.run([sys.executable, "-m", "swin", "--version"], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == f"swin {version('swin')}"


def test_validate_takes_weights_and_the_old_checkpoint_spelling():
    for option in ("--weights", "--checkpoint"):
        args = build_parser("validate").parse_args(["validate", "swin_t", "--data", "d", option, "w.pth"])
        assert args.weights == "w.pth"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_and_argument_has_help(command):
    parser = build_parser(command)
    missing = []

    def walk(name: str, sub: argparse.ArgumentParser) -> None:
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child, child_parser in action.choices.items():
                    walk(f"{name} {child}", child_parser)
            if not isinstance(action, argparse._HelpAction) and not action.help:
                missing.append(f"{name}: {'/'.join(action.option_strings) or action.dest}")

    top = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    walk(f"swin {command}", top.choices[command])
    assert not missing, f"no help for {missing}"
