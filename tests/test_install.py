"""A plain (non-editable) install puts layers/registry/weights/tools under swin, nothing at the top level."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# What a build reads: the packages pyproject.toml maps under swin, pyproject.toml and the readme it names.
SOURCES = ("swin", "layers", "registry", "weights", "tools", "pyproject.toml", "README.md", "LICENSE")


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


def _requirement_name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_every_imported_library_is_declared():
    # Each third-party module the package imports, anywhere in its code, belongs to a distribution that
    # pyproject.toml names (a dependency or an extra), not one that arrives only because timm needs it.
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {_requirement_name(r) for r in project["dependencies"]}
    declared |= {_requirement_name(r) for extra in project["optional-dependencies"].values() for r in extra}
    imported = set()
    for package in ("swin", "layers", "registry", "weights", "tools"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    imported |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    imported.add(node.module.split(".")[0])
    distributions = importlib.metadata.packages_distributions()
    third_party = imported - set(sys.stdlib_module_names) - {"swin"}
    undeclared = {
        module: distributions.get(module)
        for module in third_party
        if not {d.lower().replace("_", "-") for d in distributions.get(module, [module])} & declared
    }
    assert not undeclared


def test_segmentation_without_transformers_says_what_to_install(monkeypatch):
    from swin.segmentation import upernet

    monkeypatch.setitem(sys.modules, "transformers", None)  # as if not installed: import raises ImportError
    with pytest.raises(ImportError, match=r"pip install transformers \(or, in a checkout, pip install -e"):
        upernet("swin_t", num_labels=3)


def test_source_distribution_carries_the_tests_and_license(tmp_path):
    # What a packager runs the suite from: every file under tests/ (conftest.py and the subpackages included),
    # the docs scripts and examples the tests read, and the license text.
    pytest.importorskip("setuptools", minversion="77")  # pyproject's SPDX license needs it
    source = tmp_path / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in (*SOURCES, "MANIFEST.in", "tests", "docs", "examples"):
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=ignore)
        else:
            shutil.copy2(ROOT / name, source / name)
    dist = tmp_path / "dist"
    dist.mkdir()
    build = f"import setuptools.build_meta as b; print(b.build_sdist({str(dist)!r}))"  # its own process: cwd, logging
    done = subprocess.run([sys.executable, "-c", build], cwd=source, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    archive = dist / done.stdout.split()[-1]
    with tarfile.open(archive) as tar:
        shipped = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    tests = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("*") if p.is_file()}
    tests = {t for t in tests if "__pycache__" not in t and not t.endswith(".pyc")}
    assert tests - shipped == set()
    assert {"LICENSE", "docs/gpu_check.sh", "examples/finetune.py"} <= shipped


def test_torch_hub_loads_from_a_checkout(tmp_path):
    """torch.hub.load(REPO_OR_DIR, "swin_t") as torchvision's: from the checkout itself (the installed
    package hidden), its subpackages found in their folders beside swin/, the model timm's with timm's weights."""
    code = f"""
import importlib.util, sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in (getattr(f, "__module__", "") or "")]
assert importlib.util.find_spec("swin") is None, "the installed package is still importable"
import torch, timm
timm_model = timm.create_model("swin_tiny_patch4_window7_224", embed_dim=32, num_heads=(1, 2, 4, 8)).eval()
ours = torch.hub.load({str(ROOT)!r}, "swin_t", source="local", pretrained=timm_model.state_dict(), embed_dim=32,
                      num_heads=(1, 2, 4, 8)).eval()
backbone = torch.hub.load({str(ROOT)!r}, "create_model", "swinv2_t_w8", source="local", features_only=True,
                          embed_dim=16, depths=(1, 1, 1, 1), num_heads=(1, 1, 1, 1))
import swin
x = torch.randn(1, 3, 224, 224)
with torch.no_grad():
    gap = (ours(x) - timm_model(x)).abs().max().item()
import swin.tools  # an attribute of swin too, as the installed package's
print(swin.layers.__file__, swin.tools.__file__, gap, len(backbone(torch.randn(1, 3, 256, 256))))
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    layers, tools, gap, maps = done.stdout.split()
    assert layers == str(ROOT / "layers" / "__init__.py") and tools == str(ROOT / "tools" / "__init__.py")
    assert float(gap) < 1e-5 and maps == "4"
