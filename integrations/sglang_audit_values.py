"""The values the audit's interpreter computes with, and what is known of them: constants, the tree's classes,
functions and instances, enum members, a wrapper's constructor arguments, sequences, `self`, unknowns and
choices under conditions; a value's truth, comparisons between values, and the source texts of conditions.

Standard library only; nothing of SGLang is imported or run.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .sglang_audit_index import ClassRef, FuncRef, ModRef, ValueRef

MAX_TEXT = 110  # characters of source text a value or condition is shown with


@dataclass(frozen=True)
class Const:
    """A Python constant (or a tuple / frozenset of them)."""

    value: object


@dataclass(frozen=True)
class Static:
    """A class, function, module or module-level value of the tree, by name."""

    ref: ClassRef | FuncRef | ModRef | ValueRef


@dataclass(frozen=True)
class Obj:
    """An instance built by calling a class of the tree."""

    cls: ClassRef


@dataclass(frozen=True)
class Member:
    """An enum member (`ForwardMode.TARGET_VERIFY`)."""

    cls: ClassRef
    name: str


@dataclass(frozen=True)
class Child:
    """A constructor argument a wrapper keeps as `self.attr`: the backend it forwards to."""

    param: str
    attr: str


@dataclass(frozen=True)
class Seq:
    """A tuple / list / set with at least one non-constant item."""

    items: tuple[Value, ...]


@dataclass(frozen=True)
class SelfObj:
    """`self` inside a method of `cls` (or of a subclass being audited)."""

    cls: ClassRef


@dataclass(frozen=True)
class Unknown:
    """A value the interpreter cannot know; `text` is what the source says."""

    text: str


@dataclass(frozen=True)
class Choice:
    """One of several values, each under its conditions."""

    options: tuple[tuple[tuple[str, ...], Value], ...]


Value = Const | Static | Obj | Member | Child | Seq | SelfObj | Unknown | Choice


@dataclass(frozen=True)
class Outcome:
    """One path through a function: it returns `value` or raises `exc`, under `conds` (source texts)."""

    kind: str  # "return" | "raise"
    value: Value
    exc: str | None
    conds: tuple[str, ...]


def short(text: str) -> str:
    """One line of at most MAX_TEXT characters."""
    text = " ".join(text.split())
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"


def negate(cond: str) -> str:
    """The source text of a condition's negation (`not (not x)` written as `x`)."""
    if cond.startswith("not (") and cond.endswith(")"):
        inner, depth = cond[5:-1], 0
        for ch in inner:
            depth += ch == "("
            depth -= ch == ")"
            if depth < 0:
                break
        else:
            return inner
    if cond.startswith("not ") and " " not in cond[4:]:
        return cond[4:]
    return f"not ({cond})"


def options(v: Value) -> list[tuple[tuple[str, ...], Value]]:
    """A value as (conditions, plain value) alternatives."""
    if isinstance(v, Choice):
        out: list[tuple[tuple[str, ...], Value]] = []
        for conds, x in v.options:
            out.extend((conds + c2, y) for c2, y in options(x))
        return out
    return [((), v)]


def truth(v: Value) -> bool | None:
    """Whether the value is true, when that is known."""
    if isinstance(v, Const):
        try:
            return bool(v.value)
        except Exception:  # noqa: BLE001 - a constant without a truth value
            return None
    if isinstance(v, (Member, Obj, Static, SelfObj, Child)):
        return True
    if isinstance(v, Seq):
        return bool(v.items)
    if isinstance(v, Choice):
        ts = {truth(x) for _, x in v.options}
        return ts.pop() if len(ts) == 1 else None
    return None


def conds_text(conds: tuple[str, ...] | list[str]) -> str:
    """Conditions joined with `and`, each with `or` inside it parenthesised."""
    return " and ".join(f"({c})" if " or " in c and not (c.startswith("(") and c.endswith(")")) else c
                        for c in conds)


# Python's own operators, applied to interpreted constants of any type: a pair they do not support raises
# TypeError, as the interpreted code would, and the caller answers "unknown".
_ORDER: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {ast.Lt: operator.lt, ast.LtE: operator.le,
                                                           ast.Gt: operator.gt, ast.GtE: operator.ge}
getitem: Callable[[Any, Any], Any] = operator.getitem


def _same(a: Value, b: Value) -> bool | None:
    if isinstance(a, Const) and isinstance(b, Const):
        try:
            return bool(a.value == b.value)
        except Exception:  # noqa: BLE001 - a constant that does not compare
            return None
    if isinstance(a, Member) and isinstance(b, Member):
        return a == b
    if isinstance(a, Member) and isinstance(b, Const) and b.value is None:
        return False
    if isinstance(b, Member) and isinstance(a, Const) and a.value is None:
        return False
    if isinstance(a, Obj) and isinstance(b, Const) and b.value is None:
        return False
    return None


def compare(op: ast.cmpop, a: Value, b: Value) -> bool | None:
    """`a op b` for a comparison operator, when the values decide it."""
    if isinstance(op, (ast.Eq, ast.Is)):
        return _same(a, b)
    if isinstance(op, (ast.NotEq, ast.IsNot)):
        r = _same(a, b)
        return None if r is None else not r
    if isinstance(op, (ast.In, ast.NotIn)):
        if isinstance(b, Const) and isinstance(b.value, (tuple, frozenset, str, list, dict)) and isinstance(a, Const):
            try:
                r = a.value in b.value
            except TypeError:
                return None
        elif isinstance(b, (Seq, Const)):
            items: tuple[Value, ...] = b.items if isinstance(b, Seq) else tuple(
                Const(x) for x in b.value) if isinstance(b.value, (tuple, frozenset)) else ()
            if not items and not (isinstance(b, Const) and isinstance(b.value, (tuple, frozenset))):
                return None
            hits = [_same(a, x) for x in items]
            if any(h is True for h in hits):
                r = True
            elif all(h is False for h in hits):
                r = False
            else:
                return None
        else:
            return None
        return r if isinstance(op, ast.In) else not r
    if isinstance(a, Const) and isinstance(b, Const):
        order = _ORDER.get(type(op))
        if order is not None:
            try:
                return bool(order(a.value, b.value))
            except TypeError:
                return None
    return None


def walk_body(body: list[ast.stmt]) -> list[ast.AST]:
    """Every node of `body` in source order, not descending into nested functions / classes / lambdas."""
    out: list[ast.AST] = []
    stack: list[ast.AST] = list(reversed(body))
    while stack:
        n = stack.pop()
        out.append(n)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        stack.extend(reversed(list(ast.iter_child_nodes(n))))
    return out


