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
