"""The expressions half of the audit's interpreter: what an expression of SGLang's source evaluates to.

Names resolve through the index (module values, classes, functions, re-exports); attributes of a class, an enum or
`self` come from the class bodies and `__init__`; a call of a function or method of the tree runs it (through
`_call`, the statements half: `sglang_audit_eval.Evaluator`) and merges its outcomes into one value. Server
arguments are read by attribute name. Standard library only; nothing of SGLang is imported or run.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from .sglang_audit_index import Binding, ClassRef, FuncRef, Index, ModRef, ValueRef, top_level
from .sglang_audit_values import (
    Child,
    Choice,
    Const,
    Member,
    Obj,
    Outcome,
    SelfObj,
    Seq,
    Static,
    Unknown,
    Value,
    compare,
    getitem,
    negate,
    short,
    truth,
    walk_body,
)

MAX_STATES = 48  # live paths through one function; more are dropped (the answer then says "unknown")
MAX_DEPTH = 7  # nested calls evaluated
MAX_STEPS = 40_000  # statements run per top-level evaluation


class Raised(Exception):
    """Raised inside the interpreter when the interpreted code raises `exc` on this path."""

    def __init__(self, exc: str) -> None:
        super().__init__(exc)
        self.exc = exc


class OutOfBudget(Exception):
    """Raised when one evaluation has run MAX_STEPS statements: its answer is then "unknown"."""


_ENUM_BASES = {"Enum", "IntEnum", "StrEnum", "Flag", "IntFlag"}
_BUILTIN_CONTAINERS = {"frozenset": frozenset, "set": frozenset, "tuple": tuple, "list": tuple}


@dataclass
class PathState:
    """One live path through a function: the names bound on it and the conditions it runs under."""

    env: dict[str, Value]
    conds: tuple[str, ...]


@dataclass
class Frame:
    """Where code runs: its module (names resolve there) and the function, None at module or class level."""

    module: str
    fn: ast.FunctionDef | ast.AsyncFunctionDef | None


class Expressions:
    """The value of an expression of the tree under a server configuration (attribute name -> value)."""

    def __init__(self, index: Index, config: dict[str, object] | None = None) -> None:
        self.index = index
        self.config = dict(config or {})
        self._steps = 0
        self._self_attr_stack: set[tuple[ClassRef, str]] = set()
        self._value_stack: set[tuple[str, str]] = set()
        self.consulted: dict[str, object] = {}  # the server arguments the last evaluation read

    def _call(self, module: str, fn: ast.FunctionDef | ast.AsyncFunctionDef, args: list[Value],
              kwargs: dict[str, Value], bound: Value | None, depth: int) -> list[Outcome]:
        """Every path through `fn` called with these arguments: the statements half (`Evaluator`) runs it."""
        raise NotImplementedError

    # -- calls -----------------------------------------------------------------------------------------------

    def _safe_eval(self, expr: ast.expr, st: PathState, frame: Frame, depth: int) -> Value:
        try:
            return self._eval(expr, st, frame, depth)
        except Raised:
            return Unknown(short(ast.unparse(expr)))

    def _collapse(self, outs: list[Outcome]) -> Value:
        rets = [(o.conds, o.value) for o in outs if o.kind == "return"]
        if not rets:
            raise Raised(next((o.exc for o in outs if o.exc), "Exception"))
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
            v = self._safe_eval(exprs[0], PathState({}, ()), Frame(r.module, None), depth + 1)
        finally:
            self._value_stack.discard(key)
        return v if isinstance(v, (Const, Static, Member)) else Unknown(r.name)

    def _eval(self, e: ast.expr, s: PathState, frame: Frame, depth: int) -> Value:
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

    def _subscript(self, e: ast.Subscript, s: PathState, frame: Frame, depth: int) -> Value:
        base = self._eval(e.value, s, frame, depth)
        key = self._safe_eval(e.slice, s, frame, depth)
        if isinstance(base, Static) and isinstance(base.ref, ClassRef) and isinstance(key, Const) \
                and isinstance(key.value, str) and self._is_enum(base.ref):
            if key.value in self._members(base.ref):
                return Member(base.ref, key.value)
            raise Raised("KeyError")  # `Enum[name]` for a name that is not a member
        if isinstance(base, Const) and isinstance(key, Const):
            try:
                return Const(getitem(base.value, key.value))
            except (KeyError, IndexError, TypeError):
                return Unknown(short(ast.unparse(e)))
        return Unknown(short(ast.unparse(e)))

    def _attribute(self, e: ast.Attribute, s: PathState, frame: Frame, depth: int) -> Value:
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
                        v = self._safe_eval(st.value, PathState({}, ()), Frame(c.module, None), depth + 1)
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
                for node in walk_body(init.body):
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
        v = self._safe_eval(expr, PathState(env, ()), Frame(c.module, init), depth + 1)
        if isinstance(v, Unknown):
            return Unknown(short(ast.unparse(expr)))
        return v

    def _args(self, e: ast.Call, s: PathState, frame: Frame, depth: int) -> tuple[list[Value], dict[str, Value]]:
        args = [self._safe_eval(a, s, frame, depth) for a in e.args if not isinstance(a, ast.Starred)]
        kwargs = {k.arg: self._safe_eval(k.value, s, frame, depth) for k in e.keywords if k.arg}
        return args, kwargs

    def _call_expr(self, e: ast.Call, s: PathState, frame: Frame, depth: int) -> Value:
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

    def _compare(self, e: ast.Compare, s: PathState, frame: Frame, depth: int) -> Value:
        left = self._eval(e.left, s, frame, depth)
        result = True
        for op, rx in zip(e.ops, e.comparators, strict=False):
            right = self._eval(rx, s, frame, depth)
            r = compare(op, left, right)
            if r is None:
                return Unknown(short(ast.unparse(e)))
            result = result and r
            left = right
        return Const(result)

