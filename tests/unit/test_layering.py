"""Layering: the UI and the torch-free tracer modules never import torch (checked in a fresh interpreter)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import tomllib

# The tracer's capture side (it runs beside the engine, on its tensors): the modules pyproject's torch-free contract
# lets import torch at run time, one list for both (the probe's import is for annotations only, so it is tested).
_CONTRACT = next(c for c in tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["tool"]
                 ["importlinter"]["contracts"] if c.get("forbidden_modules") == ["torch", "flashinfer", "triton"])
_ALLOWED = r"(specscope\.tracer\.\w+) -> torch"
_TORCH_IMPORTS = (m.group(1) for i in _CONTRACT["ignore_imports"] if (m := re.fullmatch(_ALLOWED, i)))
CAPTURE_SIDE = sorted(set(_TORCH_IMPORTS) - {"specscope.tracer.probe"})

# Every other module under specscope.ui and specscope.tracer is found with pkgutil, so modules added later are covered
# without editing this test.
PROBE = r"""
import importlib, json, pkgutil, sys
import specscope.tracer, specscope.ui
OPTIONAL = {"textual", "dash", "plotly"}  # UI extras; CI installs them, a bare checkout may not
done, skipped = [], []
for pkg, skip in ((specscope.ui, set()), (specscope.tracer, set(json.loads(sys.argv[1])))):
    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        if m.name in skip:
            continue
        try:
            importlib.import_module(m.name)
            done.append(m.name)
        except ModuleNotFoundError as e:
            if (e.name or "").split(".")[0] not in OPTIONAL:
                raise
            skipped.append(m.name)
print(json.dumps({"imported": done, "skipped": skipped, "torch": "torch" in sys.modules,
                  "heavy": sorted(k for k in ("torch", "flashinfer", "triton") if k in sys.modules)}))
"""


def test_ui_and_tracer_never_import_torch() -> None:
    p = subprocess.run([sys.executable, "-c", PROBE, json.dumps(CAPTURE_SIDE)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    required = {
        "specscope.ui.cli", "specscope.ui.cmd_info", "specscope.tracer.schema", "specscope.tracer.store",
        "specscope.tracer.summary", "specscope.tracer.codec", "specscope.tracer.errors",
        "specscope.tracer.reader", "specscope.tracer.writer", "specscope.tracer.tables",
        "specscope.ui.web", "specscope.ui.web.app", "specscope.ui.web.pages", "specscope.ui.cmd_web",
        "specscope.ui.tui", "specscope.ui.tui.app", "specscope.ui.tui.live", "specscope.ui.cmd_tui",
    }  # fmt: skip
    assert required <= set(out["imported"]), out
    assert out["heavy"] == [], f"torch-free modules imported {out['heavy']}: {out['imported']}"


def test_building_the_cli_parser_never_imports_torch() -> None:
    # Every subcommand module is imported to build the parser, so each must defer heavy imports to run().
    code = "import sys\nfrom specscope.ui import cli\ncli.build_parser()\nprint('torch' in sys.modules)"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "False"
