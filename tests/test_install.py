"""A plain (non-editable) install puts layers/registry/weights/tools under swin, nothing at the top level."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# What a build reads: the packages pyproject.toml maps under swin, pyproject.toml and the readme it names.
SOURCES = ("swin", "layers", "registry", "weights", "tools", "pyproject.toml", "README.md")


def test_plain_install_imports_from_elsewhere(tmp_path):
    # Built from a copy: a build in the checkout would leave build/ and swin.egg-info/ there.
    source = tmp_path / "source"
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, source / name)
    target = tmp_path / "site"
    # No index: the build uses the setuptools installed here (no isolated build environment to fetch one),
    # and pip neither downloads nor checks its own version online, reads no user configuration (os.devnull) and
    # writes no cache.
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index"]
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    done = subprocess.run(
        [*pip, "--disable-pip-version-check", "--no-cache-dir", "--target", str(target), str(source)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    installed = sorted(p.name for p in target.iterdir() if not p.name.endswith(".dist-info"))
    assert "swin" in installed
    assert not {"layers", "registry", "weights", "tools"} & set(installed)
    code = (
        "import swin, swin.layers, swin.registry, swin.weights, swin.tools.cli; "
        "print(swin.layers.__file__); print(swin.registry.list_models()[0])"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, check=True, capture_output=True, text=True
    ).stdout.split()
    assert out[0].startswith(str(target)) and out[1] == "swin_b"
    # the fused attention kernel's source, which swin.layers.window_kernel builds on first use
    assert (target / "swin" / "layers" / "window_attention.cpp").is_file()
