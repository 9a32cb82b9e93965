"""The intended layering holds: layers < registry < weights < swin < tools, imports inside functions too.

Every source file is parsed and each import (absolute or relative, at any depth) is resolved to the
installed package it names; an import against the direction fails with the file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# source folder -> the package it installs as (pyproject's package-dir)
PACKAGES = {
    "layers": "swin.layers",
    "registry": "swin.registry",
    "weights": "swin.weights",
    "tools": "swin.tools",
    "swin": "swin",
}

# package -> packages it must never import
FORBIDDEN = {
    "swin.layers": ("swin.registry", "swin.weights", "swin.tools", "swin"),
    "swin.registry": ("swin.weights", "swin.tools"),
    "swin.weights": ("swin.tools",),
    "swin": ("swin.tools",),
}

# what a package may import of "swin" itself (the top package holds the model assembly)
OWN = ("swin.layers", "swin.registry", "swin.weights", "swin.tools")


def _imports(path: Path, package: str) -> list[tuple[int, str]]:
    module = f"{package}.{path.stem}" if path.stem != "__init__" else package
    parent = module.rsplit(".", 1)[0] if path.stem != "__init__" else package
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = parent.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            # `from . import storage` names submodules
            found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names if not node.module]
    return found


def _violates(package: str, target: str) -> bool:
    for bad in FORBIDDEN.get(package, ()):
        if bad == "swin":  # layers may import nothing of swin outside swin.layers
            if (target == "swin" or target.startswith("swin.")) and not target.startswith("swin.layers"):
                return True
        elif target == bad or target.startswith(bad + "."):
            return True
    return False


def test_no_import_against_the_layering():
    problems = []
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            for line, target in _imports(path, package):
                if target.startswith(package + ".") or target == package:
                    continue  # within the package itself
                if package == "swin" and target.startswith(OWN) and not target.startswith("swin.tools"):
                    continue
                if _violates(package, target):
                    problems.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not problems, "imports against layers < registry < weights < swin < tools:\n" + "\n".join(problems)


def test_the_checker_sees_relative_and_function_level_imports(tmp_path):
    source = tmp_path / "probe.py"
    source.write_text("def f():\n    from ..weights import manifest\n    import swin.tools.cli\n")
    targets = [t for _, t in _imports(source, "swin.registry")]
    assert "swin.weights" in targets and "swin.tools.cli" in targets
    assert _violates("swin.registry", "swin.weights") and _violates("swin.registry", "swin.tools.cli")
    assert _violates("swin.layers", "swin.registry.config") and not _violates("swin.layers", "swin.layers.block")
