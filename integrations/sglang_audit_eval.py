"""A small abstract interpreter over SGLang's source, for the audit: what a function returns or raises, path by path.

It runs the few kinds of code the audit has to understand (the backend registry's factories, a wrapper's
`_select_backend`, `ForwardMode.is_*()`, `SpeculativeAlgorithm.create_worker`) on values that are constants,
classes and instances of the tree, enum members, a wrapper's constructor arguments, or unknown. A condition
it cannot decide splits the path, and the path keeps the condition's source text, so every answer says when it
holds. Server arguments are looked up by attribute name (`x.speculative_attention_mode` is the configured value
whatever `x` is), which is how SGLang reads them across releases (`server_args.`, `get_spec().`, `cfg.`).
Standard library only; nothing of SGLang is imported or run.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .sglang_audit_index import (
    Binding,
    ClassRef,
    FuncRef,
    Index,
    ModRef,
    TryBlock,
    ValueRef,
    import_bindings,
    is_try,
    top_level,
)

MAX_STATES = 48  # live paths through one function; more are dropped (the answer then says "unknown")
MAX_DEPTH = 7  # nested calls evaluated
MAX_STEPS = 40_000  # statements run per top-level evaluation
MAX_TEXT = 110


# -- values ----------------------------------------------------------------------------------------------------


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


class _Raise(Exception):
    """Raised inside the interpreter when the interpreted code raises `exc` on this path."""

    def __init__(self, exc: str) -> None:
        super().__init__(exc)
        self.exc = exc


class _OutOfBudget(Exception):
    pass


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


_ENUM_BASES = {"Enum", "IntEnum", "StrEnum", "Flag", "IntFlag"}
_BUILTIN_CONTAINERS = {"frozenset": frozenset, "set": frozenset, "tuple": tuple, "list": tuple}


@dataclass
class _State:
    env: dict[str, Value]
    conds: tuple[str, ...]


@dataclass
class _Frame:
    module: str
    fn: ast.FunctionDef | ast.AsyncFunctionDef | None


class Evaluator:
    """Interprets functions of an `Index` under a server configuration (attribute name -> value)."""

    def __init__(self, index: Index, config: dict[str, object] | None = None) -> None:
        self.index = index
        self.config = dict(config or {})
        self._steps = 0
        self._self_attr_stack: set[tuple[ClassRef, str]] = set()
        self._value_stack: set[tuple[str, str]] = set()
        self.consulted: dict[str, object] = {}  # the server arguments the last evaluation read

    # -- entry points ----------------------------------------------------------------------------------------

    def run(self, module: str, fn: ast.FunctionDef | ast.AsyncFunctionDef, args: list[Value] | None = None,
            kwargs: dict[str, Value] | None = None, bound: Value | None = None) -> list[Outcome]:
        """Every path through `fn` called with these arguments (`bound`: its `self` / `cls`)."""
        self._steps = 0
        self.consulted = {}
        try:
            return self._call(module, fn, args or [], kwargs or {}, bound, 0)
        except _OutOfBudget:
            return [Outcome("return", Unknown(f"{fn.name}(...): too long to follow"), None, ())]

    def value(self, module: str, expr: ast.expr, env: dict[str, Value] | None = None,
              fn: ast.FunctionDef | ast.AsyncFunctionDef | None = None) -> Value:
        """The value of `expr` in `module` (inside `fn`, with `env` bound), raising paths left out."""
        self._steps = 0
        self.consulted = {}
        try:
            return self._eval(expr, _State(dict(env or {}), ()), _Frame(module, fn), 0)
        except _Raise as r:
            return Unknown(f"raises {r.exc}")
        except _OutOfBudget:
            return Unknown(short(ast.unparse(expr)))

    # -- calls -----------------------------------------------------------------------------------------------

    def _call(self, module: str, fn: ast.FunctionDef | ast.AsyncFunctionDef, args: list[Value],
              kwargs: dict[str, Value], bound: Value | None, depth: int) -> list[Outcome]:
        env: dict[str, Value] = {}
        a = fn.args
        params = [p.arg for p in a.posonlyargs + a.args]
        defaults: list[ast.expr | None] = [None] * (len(params) - len(a.defaults)) + list(a.defaults)
        positional: list[Value] = ([bound] if bound is not None else []) + list(args)
        frame = _Frame(module, fn)
        for i, name in enumerate(params):
            default = defaults[i]
            if i < len(positional):
                env[name] = positional[i]
            elif name in kwargs:
                env[name] = kwargs[name]
            elif default is not None:
                env[name] = self._safe_eval(default, _State({}, ()), _Frame(module, None), depth)
            else:
                env[name] = Unknown(name)
        for kw, d in zip(a.kwonlyargs, a.kw_defaults, strict=False):
            env[kw.arg] = kwargs.get(kw.arg) or (self._safe_eval(d, _State({}, ()), _Frame(module, None), depth)
                                                 if d is not None else Unknown(kw.arg))
        if a.vararg:
            env[a.vararg.arg] = Unknown(a.vararg.arg)
        if a.kwarg:
            env[a.kwarg.arg] = Unknown(a.kwarg.arg)
        live, outs = self._block(fn.body, [_State(env, ())], frame, depth)
        outs.extend(Outcome("return", Const(None), None, s.conds) for s in live)  # falling off the end
        return outs

    def _safe_eval(self, expr: ast.expr, st: _State, frame: _Frame, depth: int) -> Value:
        try:
            return self._eval(expr, st, frame, depth)
        except _Raise:
            return Unknown(short(ast.unparse(expr)))

    def _collapse(self, outs: list[Outcome]) -> Value:
        rets = [(o.conds, o.value) for o in outs if o.kind == "return"]
        if not rets:
            raise _Raise(next((o.exc for o in outs if o.exc), "Exception"))
        if len(rets) == 1:
            return rets[0][1]
        # The caller needs one value: the alternatives, each under its conditions (same values merged).
        merged: dict[Value, tuple[str, ...]] = {}
        for conds, v in rets:
            try:
                merged.setdefault(v, conds)
            except TypeError:
                return Unknown("a value of several kinds")
        if len(merged) == 1:
            return next(iter(merged))
        return Choice(tuple((c, v) for v, c in merged.items()))

    def _invoke(self, target: Value, args: list[Value], kwargs: dict[str, Value], text: str,
                depth: int) -> Value:
        """Call a function / class of the tree."""
        if isinstance(target, Static):
            ref = target.ref
            if isinstance(ref, ClassRef):
                return Obj(ref)
            if isinstance(ref, FuncRef) and depth < MAX_DEPTH:
                info = self.index.module(ref.module)
                fn = info.functions.get(ref.name) if info else None
                if fn is not None:
                    return self._collapse(self._call(ref.module, fn, args, kwargs, None, depth + 1))
        return Unknown(text)

    def _method(self, recv: Value, name: str, args: list[Value], kwargs: dict[str, Value], text: str,
                depth: int) -> Value:
        """`recv.name(...)` for an enum member, `self`, or a class (its classmethods)."""
        cls = recv.cls if isinstance(recv, (Member, SelfObj)) else (
            recv.ref if isinstance(recv, Static) and isinstance(recv.ref, ClassRef) else None)
        if cls is None or depth >= MAX_DEPTH:
            return Unknown(text)
        hit = self.index.lookup(cls, name)
        if hit is None or not isinstance(hit[1], (ast.FunctionDef, ast.AsyncFunctionDef)):
            return Unknown(text)
        owner, fn = hit[0], hit[1]
        deco = {ast.unparse(d) for d in fn.decorator_list}
        bound: Value | None = None if "staticmethod" in deco else recv
        return self._collapse(self._call(owner.module, fn, args, kwargs, bound, depth + 1))

    # -- statements ------------------------------------------------------------------------------------------

    def _block(self, body: list[ast.stmt], states: list[_State], frame: _Frame,
               depth: int) -> tuple[list[_State], list[Outcome]]:
        outs: list[Outcome] = []
        live = states
        for st in body:
            nxt: list[_State] = []
            for s in live:
                l2, o2 = self._stmt(st, s, frame, depth)
                nxt.extend(l2)
                outs.extend(o2)
            live = nxt[:MAX_STATES]
            if not live:
                break
        return live, outs

    def _stmt(self, st: ast.stmt, s: _State, frame: _Frame, depth: int) -> tuple[list[_State], list[Outcome]]:
        self._steps += 1
        if self._steps > MAX_STEPS:
            raise _OutOfBudget
        try:
            return self._stmt_inner(st, s, frame, depth)
        except _Raise as r:
            return [], [Outcome("raise", Unknown(r.exc), r.exc, s.conds)]

    def _stmt_inner(self, st: ast.stmt, s: _State, frame: _Frame,
                    depth: int) -> tuple[list[_State], list[Outcome]]:
        if isinstance(st, ast.Return):
            v = Const(None) if st.value is None else self._eval(st.value, s, frame, depth)
            return [], [Outcome("return", x, None, s.conds + c) for c, x in options(v)]
        if isinstance(st, ast.Raise):
            exc = st.exc
            name = "re-raise" if exc is None else ast.unparse(exc.func if isinstance(exc, ast.Call) else exc)
            return [], [Outcome("raise", Unknown(name), name, s.conds)]
        if isinstance(st, ast.If):
            return self._branch(st.test, st.body, st.orelse, s, frame, depth)
        if isinstance(st, (ast.Assign, ast.AnnAssign)):
            if st.value is None:
                return [s], []
            targets = st.targets if isinstance(st, ast.Assign) else [st.target]
            v = self._eval(st.value, s, frame, depth)
            env = dict(s.env)
            for t in targets:
                if isinstance(t, ast.Name):
                    env[t.id] = v
                elif isinstance(t, (ast.Tuple, ast.List)):
                    for e in t.elts:
                        if isinstance(e, ast.Name):
                            env[e.id] = Unknown(e.id)
            return [_State(env, s.conds)], []
        if isinstance(st, (ast.AugAssign,)) and isinstance(st.target, ast.Name):
            return [_State({**s.env, st.target.id: Unknown(st.target.id)}, s.conds)], []
        if isinstance(st, (ast.Import, ast.ImportFrom)):
            env = dict(s.env)
            for bound, b in import_bindings(st, frame.module, self.index.src.is_package(frame.module)):
                env[bound] = self._binding_value(b, bound)
            return [_State(env, s.conds)], []
        if isinstance(st, (ast.With, ast.AsyncWith)):
            return self._block(st.body, [s], frame, depth)
        if is_try(st):
            return self._try(st, s, frame, depth)
        if isinstance(st, (ast.For, ast.AsyncFor, ast.While)):
            # The body once, its loop variable unknown: a return inside it is a possible outcome; the state
            # after the loop is the one before it (what a loop assigns is not tracked).
            env = dict(s.env)
            if isinstance(st, (ast.For, ast.AsyncFor)):
                for n in ast.walk(st.target):
                    if isinstance(n, ast.Name):
                        env[n.id] = Unknown(n.id)
            _, outs = self._block(st.body, [_State(env, s.conds)], frame, depth)
            return [s], outs
        if isinstance(st, ast.Assert):
            if truth(self._safe_eval(st.test, s, frame, depth)) is False:
                return [], [Outcome("raise", Unknown("AssertionError"), "AssertionError", s.conds)]
            return [s], []
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return [_State({**s.env, st.name: Unknown(st.name)}, s.conds)], []
        return [s], []  # Expr, Pass, Delete, Global, Break, Continue, Match...: no effect tracked

    def _branch(self, test: ast.expr, body: list[ast.stmt], orelse: list[ast.stmt], s: _State, frame: _Frame,
                depth: int) -> tuple[list[_State], list[Outcome]]:
        v = self._safe_eval(test, s, frame, depth)
        t = truth(v)
        if t is True:
            return self._block(body, [s], frame, depth)
        if t is False:
            return self._block(orelse, [s], frame, depth)
        cond = short(v.text if isinstance(v, Unknown) else ast.unparse(test))
        l1, o1 = self._block(body, [_State(s.env, s.conds + (cond,))], frame, depth)
        l2, o2 = self._block(orelse, [_State(s.env, s.conds + (negate(cond),))], frame, depth)
        return l1 + l2, o1 + o2

    def _try(self, st: TryBlock, s: _State, frame: _Frame, depth: int) -> tuple[list[_State], list[Outcome]]:
        live, outs = self._block(st.body, [s], frame, depth)
        kept: list[Outcome] = []
        for o in outs:
            handler = None
            if o.kind == "raise":
                for h in st.handlers:
                    names = {ast.unparse(x).rsplit(".", 1)[-1] for x in
                             (h.type.elts if isinstance(h.type, ast.Tuple) else [h.type])} if h.type else {"*"}
                    if "*" in names or (o.exc or "").rsplit(".", 1)[-1] in names or names & {"Exception",
                                                                                              "BaseException"}:
                        handler = h
                        break
            if handler is None:
                kept.append(o)
                continue
            # The handler runs from the state before the try (assignments inside it are not tracked).
            env = dict(s.env)
            if handler.name:
                env[handler.name] = Unknown(handler.name)
            l2, o2 = self._block(handler.body, [_State(env, o.conds)], frame, depth)
            live.extend(l2)
            kept.extend(o2)
        if st.orelse and live:
            live, o3 = self._block(st.orelse, live, frame, depth)
            kept.extend(o3)
        if st.finalbody and live:
            live, o4 = self._block(st.finalbody, live, frame, depth)
            kept.extend(o4)
        return live[:MAX_STATES], kept

    # -- expressions -----------------------------------------------------------------------------------------

    def _binding_value(self, b: Binding, bound: str) -> Value:
        refs = self.index._follow(b, frozenset())
        return Static(refs[0]) if refs else Unknown(bound)

    def _static(self, module: str, name: str, depth: int) -> Value:
        refs = self.index.resolve(module, name)
        for r in refs:
            if isinstance(r, ValueRef):
                return self._module_value(r, depth)
        return Static(refs[0]) if refs else Unknown(name)

    def _module_value(self, r: ValueRef, depth: int) -> Value:
        key = (r.module, r.name)
        info = self.index.module(r.module)
        if info is None or key in self._value_stack or depth >= MAX_DEPTH:
            return Unknown(r.name)
        exprs = info.values.get(r.name, [])
        if len(exprs) != 1:  # assigned in several places (e.g. per platform): not one value
            return Unknown(r.name)
        self._value_stack.add(key)
        try:
            v = self._safe_eval(exprs[0], _State({}, ()), _Frame(r.module, None), depth + 1)
        finally:
            self._value_stack.discard(key)
        return v if isinstance(v, (Const, Static, Member)) else Unknown(r.name)

    def _eval(self, e: ast.expr, s: _State, frame: _Frame, depth: int) -> Value:
        if isinstance(e, ast.Constant):
            return Const(e.value)
        if isinstance(e, ast.Name):
            if e.id in s.env:
                return s.env[e.id]
            return self._static(frame.module, e.id, depth)
        if isinstance(e, ast.Attribute):
            return self._attribute(e, s, frame, depth)
        if isinstance(e, ast.Call):
            return self._call_expr(e, s, frame, depth)
        if isinstance(e, ast.Compare):
            return self._compare(e, s, frame, depth)
        if isinstance(e, ast.BoolOp):
            last: Value = Const(None)
            for x in e.values:
                last = self._eval(x, s, frame, depth)
                t = truth(last)
                if t is None:
                    return Unknown(short(ast.unparse(e)))
                if t is (isinstance(e.op, ast.Or)):
                    return last
            return last
        if isinstance(e, ast.UnaryOp):
            v = self._eval(e.operand, s, frame, depth)
            if isinstance(e.op, ast.Not):
                t = truth(v)
                return Unknown(short(ast.unparse(e))) if t is None else Const(not t)
            if isinstance(v, Const) and isinstance(e.op, ast.USub) and isinstance(v.value, (int, float)):
                return Const(-v.value)
            return Unknown(short(ast.unparse(e)))
        if isinstance(e, ast.IfExp):
            v = self._safe_eval(e.test, s, frame, depth)
            t = truth(v)
            if t is True:
                return self._eval(e.body, s, frame, depth)
            if t is False:
                return self._eval(e.orelse, s, frame, depth)
            cond = short(v.text if isinstance(v, Unknown) else ast.unparse(e.test))
            return Choice((((cond,), self._safe_eval(e.body, s, frame, depth)),
                           ((negate(cond),), self._safe_eval(e.orelse, s, frame, depth))))
        if isinstance(e, (ast.Tuple, ast.List, ast.Set)):
            items = tuple(self._safe_eval(x, s, frame, depth) for x in e.elts)
            vals = [x.value for x in items if isinstance(x, Const)]
            if len(vals) == len(items):
                try:
                    return Const(frozenset(vals) if isinstance(e, ast.Set) else tuple(vals))
                except TypeError:
                    return Unknown(short(ast.unparse(e)))
            return Seq(items)
        if isinstance(e, ast.Subscript):
            return self._subscript(e, s, frame, depth)
        if isinstance(e, ast.NamedExpr):
            return self._eval(e.value, s, frame, depth)
        return Unknown(short(ast.unparse(e)))

    def _subscript(self, e: ast.Subscript, s: _State, frame: _Frame, depth: int) -> Value:
        base = self._eval(e.value, s, frame, depth)
        key = self._safe_eval(e.slice, s, frame, depth)
        if isinstance(base, Static) and isinstance(base.ref, ClassRef) and isinstance(key, Const) \
                and isinstance(key.value, str) and self._is_enum(base.ref):
            if key.value in self._members(base.ref):
                return Member(base.ref, key.value)
            raise _Raise("KeyError")  # `Enum[name]` for a name that is not a member
        if isinstance(base, Const) and isinstance(key, Const):
            try:
                return Const(_getitem(base.value, key.value))
            except (KeyError, IndexError, TypeError):
                return Unknown(short(ast.unparse(e)))
        return Unknown(short(ast.unparse(e)))

    def _attribute(self, e: ast.Attribute, s: _State, frame: _Frame, depth: int) -> Value:
        base = self._safe_eval(e.value, s, frame, depth)
        text = short(ast.unparse(e))
        if isinstance(base, Static):
            ref = base.ref
            if isinstance(ref, ModRef):
                return self._static(ref.module, e.attr, depth)
            if isinstance(ref, ClassRef):
                return self._class_attr(ref, e.attr, text, depth)
            return Unknown(text)
        if isinstance(base, Member):
            if e.attr == "name":
                return Const(base.name)
            return Unknown(text)
        if isinstance(base, SelfObj):
            v = self._self_attr(base.cls, e.attr, depth)
            if isinstance(v, Unknown) and e.attr in self.config:
                return self._config(e.attr)
            return v
        if e.attr in self.config:
            return self._config(e.attr)  # a server argument, read through whatever object carries it
        return Unknown(text)

    def _config(self, name: str) -> Const:
        self.consulted[name] = self.config[name]
        return Const(self.config[name])

    def _members(self, cls: ClassRef) -> set[str]:
        cdef = self.index.classdef(cls)
        out: set[str] = set()
        for st in top_level(cdef.body) if cdef else []:
            targets = st.targets if isinstance(st, ast.Assign) else [st.target] if isinstance(st, ast.AnnAssign) \
                and st.value is not None else []
            for t in targets:
                if isinstance(t, ast.Name) and not t.id.startswith("_"):
                    out.add(t.id)
        return out

    def _is_enum(self, cls: ClassRef) -> bool:
        return any((c if isinstance(c, str) else c.name).rsplit(".", 1)[-1].split("[")[0] in _ENUM_BASES
                   for c in self.index.mro(cls))

    def _class_attr(self, cls: ClassRef, attr: str, text: str, depth: int) -> Value:
        for c in self.index.mro(cls):
            if not isinstance(c, ClassRef):
                continue
            cdef = self.index.classdef(c)
            if cdef is None:
                continue
            if attr in self._members(c):
                if self._is_enum(c):
                    return Member(c, attr)
                for st in top_level(cdef.body):
                    if isinstance(st, ast.Assign) and any(isinstance(t, ast.Name) and t.id == attr
                                                          for t in st.targets):
                        v = self._safe_eval(st.value, _State({}, ()), _Frame(c.module, None), depth + 1)
                        return v if isinstance(v, Const) else Unknown(text)
            if any(isinstance(st, ast.ClassDef) and st.name == attr for st in cdef.body):
                return Static(ClassRef(c.module, f"{c.name}.{attr}"))
        return Unknown(text)

    def _self_attr(self, cls: ClassRef, attr: str, depth: int) -> Value:
        """`self.attr`: a constructor argument kept as is (a `Child`), or what `__init__` computes."""
        key = (cls, attr)
        if key in self._self_attr_stack or depth >= MAX_DEPTH:
            return Unknown(f"self.{attr}")
        self._self_attr_stack.add(key)
        try:
            return self._self_attr_inner(cls, attr, depth)
        finally:
            self._self_attr_stack.discard(key)

    def _self_attr_inner(self, cls: ClassRef, attr: str, depth: int) -> Value:
        for c in self.index.mro(cls):
            if not isinstance(c, ClassRef):
                continue
            init = self.index.method(c, "__init__")
            if isinstance(init, (ast.FunctionDef, ast.AsyncFunctionDef)):
                params = {p.arg for p in init.args.posonlyargs + init.args.args + init.args.kwonlyargs}
                for node in _walk_body(init.body):
                    if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                        if any(isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                               and t.value.id == "self" and t.attr == attr for t in targets):
                            return self._init_value(c, init, params, attr, node.value, depth)
            if attr in self._members(c):
                return self._class_attr(c, attr, f"self.{attr}", depth)
            prop = self.index.method(c, attr)
            if isinstance(prop, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                    ast.unparse(d).endswith("property") for d in prop.decorator_list):
                return self._collapse(self._call(c.module, prop, [], {}, SelfObj(cls), depth + 1))
        return Unknown(f"self.{attr}")

    def _init_value(self, c: ClassRef, init: ast.FunctionDef | ast.AsyncFunctionDef, params: set[str], attr: str,
                    expr: ast.expr, depth: int) -> Value:
        if isinstance(expr, ast.Name) and expr.id in params:
            return Child(expr.id, attr)
        if isinstance(expr, (ast.List, ast.Tuple)):
            names = [x.id for x in expr.elts if isinstance(x, ast.Name) and x.id in params]
            if len(names) == len(expr.elts):
                return Seq(tuple(Child(n, n) for n in names))
        env: dict[str, Value] = {p: Unknown(p) for p in params}
        env["self"] = SelfObj(c)
        v = self._safe_eval(expr, _State(env, ()), _Frame(c.module, init), depth + 1)
        if isinstance(v, Unknown):
            return Unknown(short(ast.unparse(expr)))
        return v

    def _args(self, e: ast.Call, s: _State, frame: _Frame, depth: int) -> tuple[list[Value], dict[str, Value]]:
        args = [self._safe_eval(a, s, frame, depth) for a in e.args if not isinstance(a, ast.Starred)]
        kwargs = {k.arg: self._safe_eval(k.value, s, frame, depth) for k in e.keywords if k.arg}
        return args, kwargs

    def _call_expr(self, e: ast.Call, s: _State, frame: _Frame, depth: int) -> Value:
        text = short(ast.unparse(e))
        f = e.func
        if isinstance(f, ast.Name) and f.id in _BUILTIN_CONTAINERS and f.id not in s.env and len(e.args) == 1:
            v = self._safe_eval(e.args[0], s, frame, depth)
            if isinstance(v, Const) and isinstance(v.value, (tuple, frozenset, str)):
                try:
                    return Const(_BUILTIN_CONTAINERS[f.id](v.value))
                except TypeError:
                    return Unknown(text)
            return Unknown(text)
        if isinstance(f, ast.Attribute):
            if isinstance(f.value, ast.Call) and isinstance(f.value.func, ast.Name) and f.value.func.id == "super":
                return Unknown(text)
            recv = self._safe_eval(f.value, s, frame, depth)
            args, kwargs = self._args(e, s, frame, depth)
            if isinstance(recv, (Member, SelfObj)):
                return self._method(recv, f.attr, args, kwargs, text, depth)
            if isinstance(recv, Static):
                if isinstance(recv.ref, ClassRef):
                    return self._method(recv, f.attr, args, kwargs, text, depth)
                if isinstance(recv.ref, ModRef):
                    return self._invoke(self._static(recv.ref.module, f.attr, depth), args, kwargs, text, depth)
            if isinstance(recv, Const) and isinstance(recv.value, str) and f.attr in ("upper", "lower") and not args:
                return Const(getattr(recv.value, f.attr)())
            return Unknown(text)
        target = self._safe_eval(f, s, frame, depth)
        args, kwargs = self._args(e, s, frame, depth)
        return self._invoke(target, args, kwargs, text, depth)

    def _compare(self, e: ast.Compare, s: _State, frame: _Frame, depth: int) -> Value:
        left = self._eval(e.left, s, frame, depth)
        result = True
        for op, rx in zip(e.ops, e.comparators, strict=False):
            right = self._eval(rx, s, frame, depth)
            r = _compare(op, left, right)
            if r is None:
                return Unknown(short(ast.unparse(e)))
            result = result and r
            left = right
        return Const(result)


# Python's own operators, applied to interpreted constants of any type: a pair they do not support raises
# TypeError, as the interpreted code would, and the caller answers "unknown".
_ORDER: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {ast.Lt: operator.lt, ast.LtE: operator.le,
                                                           ast.Gt: operator.gt, ast.GtE: operator.ge}
_getitem: Callable[[Any, Any], Any] = operator.getitem


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


def _compare(op: ast.cmpop, a: Value, b: Value) -> bool | None:
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


def _walk_body(body: list[ast.stmt]) -> list[ast.AST]:
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


walk_body = _walk_body
