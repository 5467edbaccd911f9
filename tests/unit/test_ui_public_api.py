"""The UIs use Textual and Dash through their public APIs only: no private module, no private attribute of a framework
object, no override of a framework class's private method (a framework upgrade must not break the app silently).

import-linter cannot forbid an external package's submodules (it sees `textual` and `dash` as single nodes), so this
test reads the code: every module under ui/ is parsed, and the classes it defines are inspected at run time.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from functools import cache
from pathlib import Path

import pytest

pytest.importorskip("textual")
pytest.importorskip("dash")

import specscope.ui  # noqa: E402

FRAMEWORKS = ("textual", "dash", "flask", "plotly", "rich")
UI = Path(specscope.ui.__file__).parent
_SELF_PRIVATE = re.compile(r"\bself\.(_[A-Za-z]\w*)")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _ui_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(specscope.ui.__path__, "specscope.ui."))


def _framework(obj: object) -> bool:
    return (getattr(obj, "__module__", None) or "").split(".")[0] in FRAMEWORKS


@cache
def _framework_privates(cls: type) -> frozenset[str]:
    """The private names a framework class and its framework bases define: class attributes and `self._x` set or
    read in their source."""
    names: set[str] = set()
    for c in cls.__mro__:
        if not _framework(c):
            continue
        names |= {n for n in vars(c) if _private(n)}
        try:
            names |= set(_SELF_PRIVATE.findall(inspect.getsource(c)))
        except (OSError, TypeError):
            pass
    return frozenset(names)


@cache
def _all_framework_privates() -> frozenset[str]:
    """Every private name the UI frameworks' classes define (for attributes read off objects other than self)."""
    names: set[str] = set()
    for fw in ("textual", "dash"):
        pkg = importlib.import_module(fw)
        for m in pkgutil.walk_packages(pkg.__path__, fw + "."):
            if any(part.startswith("_") or part in ("testing", "pilot") for part in m.name.split(".")[1:]):
                continue
            try:
                mod = importlib.import_module(m.name)
            except Exception:  # noqa: BLE001 - optional parts of a framework (a missing extra) are not ours to judge
                continue
            for obj in vars(mod).values():
                if isinstance(obj, type) and obj.__module__ == m.name:
                    names |= _framework_privates(obj)
    return frozenset(names)


def _own_privates() -> set[str]:
    """Private names the UI's own code defines (methods, class attributes, attributes it assigns)."""
    own: set[str] = set()
    for path in UI.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and _private(node.name):
                own.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _private(node.attr):
                own.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and _private(node.id):
                own.add(node.id)
    return own


def test_ui_imports_no_private_framework_module() -> None:
    found = []
    for path in sorted(UI.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            for name in names:
                parts = name.split(".")
                if parts[0] in FRAMEWORKS and any(p.startswith("_") for p in parts[1:]):
                    found.append(f"{path.relative_to(UI.parent)}:{node.lineno}: {name}")
    assert not found, "private framework modules imported:\n" + "\n".join(found)


def test_ui_classes_neither_override_nor_touch_their_frameworks_privates() -> None:
    found = []
    for name in _ui_modules():
        mod = importlib.import_module(name)
        for cls in vars(mod).values():
            if not (isinstance(cls, type) and cls.__module__ == name and any(map(_framework, cls.__mro__))):
                continue
            theirs = set().union(*(_framework_privates(b) for b in cls.__mro__ if _framework(b)))
            tree = ast.parse(inspect.getsource(cls))
            for node in ast.walk(tree):
                hit = None
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in theirs:
                    hit = f"defines {node.name}"
                elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                      and node.value.id in ("self", "cls") and node.attr in theirs):
                    hit = f"uses self.{node.attr}"
                if hit:
                    found.append(f"{name}.{cls.__name__}: {hit} (private to {', '.join(theirs_of(cls, hit))})")
    assert not found, "framework privates used by UI classes:\n" + "\n".join(sorted(set(found)))


def theirs_of(cls: type, hit: str) -> list[str]:
    """The framework classes in `cls`'s MRO that define the private name `hit` ends with."""
    attr = hit.split(".")[-1].split()[-1]
    return [b.__qualname__ for b in cls.__mro__ if _framework(b) and attr in _framework_privates(b)][:2]


def test_ui_reads_no_private_attribute_of_framework_objects() -> None:
    privates = _all_framework_privates() - _own_privates()
    found = []
    for path in sorted(UI.rglob("*.py")):
        tree = ast.parse(path.read_text())
        # Names bound to modules outside the frameworks (`os._exit` is the standard library's, not Textual's).
        plain = {"self", "cls"} | {a.asname or a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                                   for a in n.names if a.name.split(".")[0] not in FRAMEWORKS}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr in privates
                    and not (isinstance(node.value, ast.Name) and node.value.id in plain)):
                found.append(f"{path.relative_to(UI.parent)}:{node.lineno}: .{node.attr}")
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2
                  and isinstance(node.args[1], ast.Constant) and node.args[1].value in privates):
                where = f"{path.relative_to(UI.parent)}:{node.lineno}"
                found.append(f"{where}: {node.func.id}(..., {node.args[1].value!r})")
    assert not found, "private attributes of framework objects read:\n" + "\n".join(found)
