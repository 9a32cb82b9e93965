"""The ``swin`` command: list and info, offline, through the installed console script."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from swin.tools.cli import main
from tests.test_params import PUBLISHED


def test_list_json(capsys):
    assert main(["list", "--format", "json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    for name, params in PUBLISHED.items():
        assert rows[name]["params"] == params


def test_info(capsys):
    assert main(["info", "swin_tiny_patch4_window7_224"]) == 0
    out = capsys.readouterr().out
    assert "swin_t" in out and "28,288,354" in out and "stage 4: 7x7 tokens" in out


def test_unknown_name_exit_code(capsys):
    assert main(["info", "swin_q"]) == 2
    assert "unknown model 'swin_q'" in capsys.readouterr().err


def test_console_script():
    exe = shutil.which("swin")
    if exe is None:
        pytest.skip("the swin console script is not on PATH (package not installed)")
    result = subprocess.run([exe, "info", "swin_t", "--format", "json"], capture_output=True, text=True, check=True)
    assert json.loads(result.stdout)["params"] == PUBLISHED["swin_t"]


def test_malformed_models_file_is_a_user_error(tmp_path, capsys):
    """A YAML syntax error is the file's, not an internal failure: its path and line, no exception name."""
    path = tmp_path / "broken.yaml"
    path.write_text("my_swin:\n  embed_dim: 96\n  depths: [2, 2\n")
    assert main(["--models-file", str(path), "list"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"swin list: --models-file {path}: not valid YAML at line 4") and err.count("\n") == 1, err
    assert "(while parsing a flow sequence at line 3, column 11)" in err  # where the unclosed list opens
    assert "Error" not in err and "SWIN_DEBUG" not in err


@pytest.mark.parametrize(
    "argv",
    [
        ["flops", "swin_t", "--plot", "{file}/plot.png"],
        ["export", "swin_t", "{file}/m.onnx", "--random-weights"],
        ["convert", "{file}", "{file}/out.pth"],
    ],
)
def test_an_output_under_a_file_is_named(tmp_path, capsys, argv):
    """An output whose folder is a regular file: one line saying so (was 'the folder ... does not exist', or a
    bare '[Errno 20] Not a directory')."""
    file = tmp_path / "a_file"
    file.write_bytes(b"x")
    status = main([a.format(file=file) for a in argv])
    err = capsys.readouterr().err
    assert status in (1, 2) and f"{file} is a file, not a folder" in err and len(err.strip().splitlines()) == 1, err


def test_an_interrupt_while_the_command_loads_is_one_line(monkeypatch, capsys):
    """Ctrl-C while torch is still importing (building the parser imports the command's modules): a line and
    status 130, as later in the command (was a KeyboardInterrupt traceback)."""
    from swin.tools import cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert main(["flops", "swin_t"]) == 130
    assert capsys.readouterr().err.strip() == "swin flops: interrupted"


def test_a_models_file_redefining_a_registered_name_says_so(tmp_path, capsys, monkeypatch):
    """A models file may redefine a registered name (the commands then build its definition), but not unnoticed:
    one line on stderr (it replaced swin_t silently). The same definition again says nothing."""
    import swin
    from swin.registry import lookup

    swin.list_models()  # the bundled entries, before the copies the test works on
    monkeypatch.setattr(lookup, "_configs", dict(lookup._configs))
    monkeypatch.setattr(lookup, "_aliases", dict(lookup._aliases))
    path = tmp_path / "models.yaml"
    path.write_text("swin_t:\n  embed_dim: 64\n  depths: [1, 1, 1, 1]\n  num_heads: [1, 2, 4, 8]\n")
    assert main(["--models-file", str(path), "info", "swin_t"]) == 0
    err = capsys.readouterr().err
    assert err.strip() == (
        f"swin: --models-file {path} redefines swin_t, registered before with other fields; the commands use the "
        "file's definition"
    )
    assert main(["--models-file", str(path), "info", "swin_t"]) == 0
    assert capsys.readouterr().err == ""
