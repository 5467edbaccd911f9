"""specscope's packages read the process environment only through tracer/user_env.py, whose variables are each
a documented user setting: an engine option is an EngineConfig field and a flag, a measurement variant an object
the benchmarks inject, never a variable a constructor reads."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from specscope.tracer import user_env

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("backend", "tracer", "ui", "integrations")
ALLOWED = ROOT / "tracer" / "user_env.py"


def _env_uses(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of every use of os.environ, os.getenv / putenv / unsetenv and of those names imported from os."""
    found: list[tuple[int, str]] = []
    os_names = {"os"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            os_names |= {a.asname for a in node.names if a.name == "os" and a.asname}
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            for a in node.names:
                if a.name in ("environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"):
                    found.append((node.lineno, f"from os import {a.name}"))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in os_names
                and node.attr in ("environ", "environb", "getenv", "getenvb", "putenv", "unsetenv")):
            found.append((node.lineno, f"os.{node.attr}"))
    return found


def _product_files() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def test_only_the_user_environment_module_reads_the_environment() -> None:
    offenders = []
    for path in _product_files():
        if path == ALLOWED:
            continue
        for line, what in _env_uses(ast.parse(path.read_text(), str(path))):
            offenders.append(f"{path.relative_to(ROOT)}:{line}: {what}")
    assert not offenders, "read the environment through specscope.tracer.user_env:\n" + "\n".join(offenders)


def test_the_scan_finds_every_spelling() -> None:
    src = ("import os\nimport os as o\nfrom os import getenv\nos.environ.get('A')\no.environ['B']\n"
           "x = os.getenv('C')\n'D' in os.environ\n")
    assert [w for _, w in _env_uses(ast.parse(src))].count("os.environ") == 3
    assert {w for _, w in _env_uses(ast.parse(src))} == {"os.environ", "os.getenv", "from os import getenv"}


def test_every_variable_read_is_documented_in_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    missing = [v for v in user_env.DOCUMENTED if v not in readme]
    assert not missing, f"README.md does not document {missing}"


def test_an_undocumented_variable_is_refused() -> None:
    with pytest.raises(KeyError, match="not a documented"):
        user_env.get("SPECSCOPE_SNAPSHOT_RING")
    assert user_env.get(user_env.TRACE, {user_env.TRACE: "t.db"}) == "t.db"
    assert user_env.rank({"RANK": "3", "LOCAL_RANK": "1"}) == "3" and user_env.rank({}) == "0"
