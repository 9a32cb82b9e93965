"""A plain (non-editable) install puts layers/registry/weights/tools under swin, nothing at the top level."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_plain_install_imports_from_elsewhere(tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
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
