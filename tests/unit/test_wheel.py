"""The built wheel holds every package of the source tree, under the installed names `specscope.*`."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The source folders and the installed package each one becomes (pyproject.toml's package-dir).
TOP = {"tracer": "specscope/tracer", "backend": "specscope/backend", "ui": "specscope/ui",
       "integrations": "specscope/integrations"}


def _source_packages() -> set[str]:
    """Every folder under the top-level source folders that holds Python modules, as its wheel path."""
    found = set()
    for src, dst in TOP.items():
        for py in (ROOT / src).rglob("*.py"):
            if "__pycache__" in py.parts:
                continue
            rel = py.parent.relative_to(ROOT / src).as_posix()
            found.add(dst if rel == "." else f"{dst}/{rel}")
    return found


def test_the_wheel_holds_every_package_of_the_tree(tmp_path: Path) -> None:
    """A subpackage missing from pyproject.toml's list would ship a wheel without it: build one and look."""
    src = tmp_path / "src"
    src.mkdir()
    for name in [*TOP, "pyproject.toml", "README.md"]:
        p = ROOT / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(p, src / name)
    out = tmp_path / "dist"
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(out), str(src)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = out.glob("specscope-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    in_wheel = {n.rsplit("/", 1)[0] for n in names if n.endswith(".py")}
    missing = sorted(_source_packages() - in_wheel)
    assert not missing, f"packages of the tree missing from the wheel (add them to pyproject.toml): {missing}"
    for pkg in sorted(_source_packages()):
        assert f"{pkg}/py.typed" in names, f"{pkg} ships without its py.typed marker"
    assert any(n.startswith("specscope/ui/web/static/") and n.endswith(".min.js") for n in names), \
        "the dashboard's partial plotly.js bundle is missing from the wheel"
    sheets = {f"specscope/ui/{p.relative_to(ROOT / 'ui').as_posix()}" for p in (ROOT / "ui").rglob("*.tcss")}
    assert sheets and sheets <= set(names), f"TUI stylesheets missing from the wheel: {sorted(sheets - set(names))}"
    dist_info = "-".join(wheel.name.split("-")[:2]) + ".dist-info"
    leaked = sorted({n.split("/")[0] for n in names} - {"specscope", dist_info})
    assert not leaked, f"the wheel installs top-level names other than specscope: {leaked}"
