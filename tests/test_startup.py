"""Startup stays quick: ``import swin`` and the command line's list/help import neither torch nor timm until a
model is built (timm alone costs seconds, and it pulls in torchvision and torch._dynamo)."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import sys, json
{code}
print(json.dumps({{m: m in sys.modules for m in ("torch", "timm", "torchvision", "torch._dynamo")}}))
"""


def _loaded(code: str) -> dict[str, bool]:
    result = subprocess.run([sys.executable, "-c", PROBE.format(code=code)], capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_import_swin_loads_no_heavy_module():
    assert not any(_loaded("import swin").values())


def test_list_and_help_need_no_torch():
    code = (
        "import contextlib, io\n"
        "from swin.tools.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert main(['list']) == 0 and main(['list', '*tiny*']) == 0\n"
        "    try:\n"
        "        main(['--help'])\n"
        "    except SystemExit:\n"
        "        pass\n"
    )
    assert not any(_loaded(code).values())


def test_building_a_model_does_not_import_timm():
    loaded = _loaded("import swin, torch\nswin.create_model('swin_t', depths=(1, 1, 1, 1))(torch.zeros(1, 3, 64, 64))")
    assert loaded["torch"] and not loaded["timm"] and not loaded["torchvision"]
