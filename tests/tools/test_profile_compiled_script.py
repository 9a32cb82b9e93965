"""docs/profile_compiled.py has a real command line: --help works, bad input is an argparse error, and the
documented ``python docs/profile_compiled.py 8 bfloat16`` still parses. The profile itself is not run (it
compiles two models: minutes)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "docs" / "profile_compiled.py"


def load_script():
    spec = importlib.util.spec_from_file_location("profile_compiled_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_help_runs_without_importing_torch():
    """--help crashed with "invalid literal for int()"; it should also not wait for torch and timm."""
    probe = (
        "import runpy, sys\n"
        f"sys.argv = [{str(SCRIPT)!r}, '--help']\n"
        "try:\n"
        f"    runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    print('exit', e.code, 'torch' in sys.modules, 'timm' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "usage: profile_compiled.py" in done.stdout and "BATCH" in done.stdout and "bfloat16" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "exit 0 False False"


@pytest.mark.parametrize(
    ("argv", "expected"), [([], (1, "float32", 8)), (["8", "bfloat16"], (8, "bfloat16", 8)), (["1"], (1, "float32", 8))]
)
def test_documented_invocations_parse(argv, expected):
    args = load_script().parse_args(argv)
    assert (args.batch, args.dtype, args.top) == expected


@pytest.mark.parametrize(("argv", "message"), [(["0"], "BATCH"), (["x"], "BATCH"), (["8", "float16"], "DTYPE")])
def test_bad_arguments_are_argparse_errors(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        load_script().parse_args(argv)
    assert exit_.value.code == 2 and f"argument {message}" in capsys.readouterr().err
