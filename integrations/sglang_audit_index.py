"""Static index of SGLang's source for the audit: what a module defines and imports, names resolved across modules
(re-exports, relative and conditional imports, aliases), classes with their bases and C3 method resolution order.

Nothing is imported or executed; every answer comes from `ast` over a `SourceTree`. Standard library only.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Protocol, TypeGuard

from .sglang_audit_source import SourceTree


@dataclass(frozen=True)
class ClassRef:
    """A class defined in the tree, by module and (dotted, for nested) name."""

    module: str
    name: str

    @property
    def key(self) -> str:
        """`module.Name`, unique in the tree."""
        return f"{self.module}.{self.name}"


@dataclass(frozen=True)
class FuncRef:
    """A module-level function defined in the tree."""

    module: str
    name: str


@dataclass(frozen=True)
class ModRef:
    """A module (or package) of the tree."""

    module: str


@dataclass(frozen=True)
class ValueRef:
    """A module-level `NAME = expr` of the tree (a constant, an alias of a class)."""

    module: str
    name: str


Ref = ClassRef | FuncRef | ModRef | ValueRef


@dataclass(frozen=True)
class Binding:
    """One way a name gets bound by an import: `from module import name` or `import module`."""

    module: str
    name: str | None  # None: the name is the module itself


@dataclass
class ModuleInfo:
    """What one module defines and imports at its top level (including under `if` / `try`)."""

    name: str
    tree: ast.Module
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = field(default_factory=dict)
    imports: dict[str, list[Binding]] = field(default_factory=dict)
    values: dict[str, list[ast.expr]] = field(default_factory=dict)


class TryBlock(Protocol):
    """The fields `try` and `try`/`except*` statements share (`ast.TryStar` exists from Python 3.11 only)."""

    body: list[ast.stmt]
    handlers: list[ast.ExceptHandler]
    orelse: list[ast.stmt]
    finalbody: list[ast.stmt]


def is_try(st: ast.stmt) -> TypeGuard[TryBlock]:
    """Whether `st` is a `try` or a `try`/`except*` statement."""
    return isinstance(st, ast.Try) or type(st).__name__ == "TryStar"


def top_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements of `body` and of the `if` / `try` / `with` blocks in it: what runs at import time."""
    out: list[ast.stmt] = []
    for st in body:
        out.append(st)
        if isinstance(st, ast.If):
            out.extend(top_level(st.body) + top_level(st.orelse))
        elif is_try(st):
            out.extend(top_level(st.body))
            for h in st.handlers:
                out.extend(top_level(h.body))
            out.extend(top_level(st.orelse) + top_level(st.finalbody))
        elif isinstance(st, (ast.With, ast.AsyncWith)):
            out.extend(top_level(st.body))
    return out


def import_bindings(st: ast.stmt, module: str, is_package: bool) -> list[tuple[str, Binding]]:
    """(bound name, binding) for an `import` / `from ... import` statement of `module`."""
    out: list[tuple[str, Binding]] = []
    if isinstance(st, ast.Import):
        for a in st.names:
            if a.asname:
                out.append((a.asname, Binding(a.name, None)))
            else:  # `import a.b.c` binds `a`
                out.append((a.name.split(".")[0], Binding(a.name.split(".")[0], None)))
    elif isinstance(st, ast.ImportFrom):
        base = st.module or ""
        if st.level:
            pkg = module if is_package else module.rpartition(".")[0]
            for _ in range(st.level - 1):
                pkg = pkg.rpartition(".")[0]
            base = f"{pkg}.{base}" if base else pkg
        for a in st.names:
            if a.name != "*":
                out.append((a.asname or a.name, Binding(base, a.name)))
    return out


class Index:
    """Modules of a `SourceTree`, parsed on demand, with cross-module name resolution and class MROs."""

    def __init__(self, src: SourceTree) -> None:
        self.src = src
        self._modules: dict[str, ModuleInfo | None] = {}
        self._mro: dict[ClassRef, list[ClassRef | str]] = {}
        self._bases: dict[ClassRef, list[ClassRef | str]] = {}

    def module(self, name: str) -> ModuleInfo | None:
        """The parsed module `name` (None when the tree lacks it or it does not parse)."""
        if name not in self._modules:
            tree = self.src.tree(name) if self.src.has(name) else None
            self._modules[name] = None if tree is None else self._info(name, tree)
        return self._modules[name]

    def _info(self, name: str, tree: ast.Module) -> ModuleInfo:
        info = ModuleInfo(name, tree)
        is_pkg = self.src.is_package(name)
        for st in top_level(tree.body):
            if isinstance(st, ast.ClassDef):
                info.classes.setdefault(st.name, st)
            elif isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
                info.functions.setdefault(st.name, st)
            elif isinstance(st, (ast.Import, ast.ImportFrom)):
                for bound, b in import_bindings(st, name, is_pkg):
                    info.imports.setdefault(bound, []).append(b)
            elif isinstance(st, ast.Assign):
                for t in st.targets:
                    if isinstance(t, ast.Name):
                        info.values.setdefault(t.id, []).append(st.value)
            elif isinstance(st, ast.AnnAssign) and st.value is not None and isinstance(st.target, ast.Name):
                info.values.setdefault(st.target.id, []).append(st.value)
        return info

    # -- names ---------------------------------------------------------------------------------------------

    def resolve(self, module: str, name: str, local: dict[str, list[Binding]] | None = None,
                _seen: frozenset[tuple[str, str]] = frozenset()) -> list[Ref]:
        """What `name` can mean in `module` (its definitions, then its imports; `local` imports first)."""
        if (module, name) in _seen or len(_seen) > 24:
            return []
        seen = _seen | {(module, name)}
        out: list[Ref] = []
        for b in (local or {}).get(name, []):
            out.extend(self._follow(b, seen))
        if out:
            return out
        info = self.module(module)
        if info is None:
            return []
        if name in info.classes:
            return [ClassRef(module, name)]
        if name in info.functions:
            return [FuncRef(module, name)]
        for b in info.imports.get(name, []):
            out.extend(self._follow(b, seen))
        if not out and name in info.values:
            for v in info.values[name]:
                if isinstance(v, (ast.Name, ast.Attribute)):  # `Alias = SomeClass`
                    out.extend(r for r in self.resolve_expr(module, v, None, seen) if isinstance(r, ClassRef))
            if not out:
                out.append(ValueRef(module, name))
        if not out and self.src.is_package(f"{module}.{name}"):
            out.append(ModRef(f"{module}.{name}"))  # a submodule reached as an attribute of its package
        return out

    def _follow(self, b: Binding, seen: frozenset[tuple[str, str]]) -> list[Ref]:
        if b.name is None:
            return [ModRef(b.module)] if self.src.has(b.module) or self.src.is_package(b.module) else []
        sub = f"{b.module}.{b.name}"
        if self.src.has(sub) or self.src.is_package(sub):
            # `from pkg import mod` binds the submodule, unless pkg/__init__ defines that name itself.
            info = self.module(b.module)
            if info is None or (b.name not in info.classes and b.name not in info.functions):
                return [ModRef(sub)]
        return self.resolve(b.module, b.name, None, seen)

    def resolve_expr(self, module: str, expr: ast.expr, local: dict[str, list[Binding]] | None = None,
                     _seen: frozenset[tuple[str, str]] = frozenset()) -> list[Ref]:
        """What a dotted name (`A`, `mod.A`, `pkg.mod.A`) means in `module`."""
        if isinstance(expr, ast.Name):
            return self.resolve(module, expr.id, local, _seen)
        if isinstance(expr, ast.Attribute):
            out: list[Ref] = []
            for base in self.resolve_expr(module, expr.value, local, _seen):
                if isinstance(base, ModRef):
                    out.extend(self.resolve(base.module, expr.attr, None, _seen))
                elif isinstance(base, ClassRef):
                    cdef = self.classdef(base)
                    if cdef is not None and any(isinstance(s, ast.ClassDef) and s.name == expr.attr
                                                for s in cdef.body):
                        out.append(ClassRef(base.module, f"{base.name}.{expr.attr}"))
            return out
        if isinstance(expr, ast.Subscript):  # Generic[T], SomeBase[X]
            return self.resolve_expr(module, expr.value, local, _seen)
        return []

    # -- classes -------------------------------------------------------------------------------------------

    def classdef(self, ref: ClassRef) -> ast.ClassDef | None:
        """The `class` statement of `ref`."""
        info = self.module(ref.module)
        if info is None:
            return None
        parts = ref.name.split(".")
        node: ast.ClassDef | None = info.classes.get(parts[0])
        for p in parts[1:]:
            if node is None:
                return None
            node = next((s for s in node.body if isinstance(s, ast.ClassDef) and s.name == p), None)
        return node

    def bases(self, ref: ClassRef) -> list[ClassRef | str]:
        """The class's bases: a `ClassRef` when defined in the tree, else the base's source text."""
        if ref not in self._bases:
            cdef = self.classdef(ref)
            out: list[ClassRef | str] = []
            for b in cdef.bases if cdef is not None else []:
                hits = [r for r in self.resolve_expr(ref.module, b) if isinstance(r, ClassRef) and r != ref]
                out.append(hits[0] if hits else ast.unparse(b))
            self._bases[ref] = out
        return self._bases[ref]

    def mro(self, ref: ClassRef, _stack: frozenset[ClassRef] = frozenset()) -> list[ClassRef | str]:
        """C3 linearisation over the tree's classes; a base outside the tree is an opaque name at its place."""
        if ref in self._mro:
            return self._mro[ref]
        if ref in _stack:  # a cycle through a mis-resolved name: cut it
            return [ref]
        stack = _stack | {ref}
        bases = self.bases(ref)
        seqs = [self.mro(b, stack) if isinstance(b, ClassRef) else [b] for b in bases] + [list(bases)]
        out: list[ClassRef | str] = [ref]
        seqs = [list(s) for s in seqs if s]
        while seqs:
            head = next((s[0] for s in seqs if not any(s[0] in t[1:] for t in seqs)), None)
            if head is None:  # not linearisable as written: fall back to depth-first order
                for s in seqs:
                    out.extend(x for x in s if x not in out)
                break
            out.append(head)
            seqs = [[x for x in s if x != head] for s in seqs]
            seqs = [s for s in seqs if s]
        self._mro[ref] = out
        return out

    def method(self, ref: ClassRef, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | ast.Assign | None:
        """The class body's own definition of `name` (a `def`, or an assignment such as `m = other.m`)."""
        cdef = self.classdef(ref)
        if cdef is None:
            return None
        found: ast.FunctionDef | ast.AsyncFunctionDef | ast.Assign | None = None
        for st in top_level(cdef.body):
            if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)) and st.name == name:
                found = st  # the last definition wins, as in Python
            elif isinstance(st, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in st.targets):
                found = st
        return found

    def lookup(self, ref: ClassRef, name: str) -> tuple[ClassRef, ast.FunctionDef | ast.AsyncFunctionDef
                                                       | ast.Assign] | None:
        """The first class of `ref`'s MRO that defines `name`, with that definition."""
        for c in self.mro(ref):
            if isinstance(c, ClassRef):
                d = self.method(c, name)
                if d is not None:
                    return c, d
        return None

    def line(self, module: str, node: ast.AST) -> str:
        """`path:line` of a node, the path relative to the package root."""
        return f"{self.src.path(module)}:{getattr(node, 'lineno', 0)}"
