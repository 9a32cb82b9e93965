"""docs/linear_libraries.py has a real command line: --help works, bad input is an argparse error, and the
documented ``python docs/linear_libraries.py [ROUNDS]`` still parses. The timing itself is not run."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "docs" / "linear_libraries.py"


def load_script():
    spec = importlib.util.spec_from_file_location("linear_libraries_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_help_runs_without_importing_torch():
    """--help crashed with "invalid literal for int()"; it should also not wait for torch."""
    probe = (
        "import runpy, sys\n"
        f"sys.argv = [{str(SCRIPT)!r}, '--help']\n"
        "try:\n"
        f"    runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    print('exit', e.code, 'torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "usage: linear_libraries.py" in done.stdout and "ROUNDS" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "exit 0 False"


@pytest.mark.parametrize(("argv", "rounds"), [([], 7), (["3"], 3)])
def test_documented_invocations_parse(argv, rounds):
    assert load_script().parse_args(argv).rounds == rounds


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["0"], "argument ROUNDS: expected a positive whole number, got '0'"),  # was a StatisticsError
        (["x"], "argument ROUNDS: expected a positive whole number, got 'x'"),
        (["3", "extra"], "unrecognized arguments: extra"),  # was ignored
    ],
)
def test_bad_arguments_are_argparse_errors(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        load_script().parse_args(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err
