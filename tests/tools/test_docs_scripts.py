"""The scripts under docs/ have real command lines: --help works without importing torch (or timm), bad input is
an argparse error, and the documented invocations (``python docs/profile_compiled.py 8 bfloat16``, ``python
docs/linear_libraries.py [ROUNDS]``) still parse. What they time is not run (profile_compiled compiles two models:
minutes)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_script", DOCS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("name", "shown"), [("profile_compiled", ("BATCH", "bfloat16")), ("linear_libraries", ("ROUNDS",))]
)
def test_help_runs_without_importing_torch(name, shown):
    """--help crashed with "invalid literal for int()" in both; it should also not wait for torch and timm."""
    script = str(DOCS / f"{name}.py")
    probe = (
        "import runpy, sys\n"
        f"sys.argv = [{script!r}, '--help']\n"
        "try:\n"
        f"    runpy.run_path({script!r}, run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    print('exit', e.code, 'torch' in sys.modules, 'timm' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"usage: {name}.py" in done.stdout and all(word in done.stdout for word in shown)
    assert done.stdout.strip().splitlines()[-1] == "exit 0 False False"


@pytest.mark.parametrize(
    ("argv", "expected"), [([], (1, "float32", 8)), (["8", "bfloat16"], (8, "bfloat16", 8)), (["1"], (1, "float32", 8))]
)
def test_profile_compiled_documented_invocations_parse(argv, expected):
    args = load_script("profile_compiled").parse_args(argv)
    assert (args.batch, args.dtype, args.top) == expected


@pytest.mark.parametrize(("argv", "rounds"), [([], 7), (["3"], 3)])
def test_linear_libraries_documented_invocations_parse(argv, rounds):
    assert load_script("linear_libraries").parse_args(argv).rounds == rounds


@pytest.mark.parametrize(
    ("name", "argv", "message"),
    [
        ("profile_compiled", ["0"], "argument BATCH"),
        ("profile_compiled", ["x"], "argument BATCH"),
        ("profile_compiled", ["8", "float16"], "argument DTYPE"),
        ("linear_libraries", ["0"], "argument ROUNDS: expected a positive whole number, got '0'"),  # StatisticsError
        ("linear_libraries", ["x"], "argument ROUNDS: expected a positive whole number, got 'x'"),
        ("linear_libraries", ["3", "extra"], "unrecognized arguments: extra"),  # was ignored
    ],
)
def test_bad_arguments_are_argparse_errors(capsys, name, argv, message):
    with pytest.raises(SystemExit) as exit_:
        load_script(name).parse_args(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err
