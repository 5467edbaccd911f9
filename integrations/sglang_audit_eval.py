"""A small abstract interpreter over SGLang's source, for the audit: what a function returns or raises, path by path.

It runs the few kinds of code the audit has to understand (the backend registry's factories, a wrapper's
`_select_backend`, `ForwardMode.is_*()`, `SpeculativeAlgorithm.create_worker`) on values that are constants,
classes and instances of the tree, enum members, a wrapper's constructor arguments, or unknown. A condition
it cannot decide splits the path, and the path keeps the condition's source text, so every answer says when it
holds. Server arguments are looked up by attribute name (`x.speculative_attention_mode` is the configured value
whatever `x` is), which is how SGLang reads them across releases (`server_args.`, `get_spec().`, `cfg.`).
Standard library only; nothing of SGLang is imported or run.

The statements half lives here (a function's paths: branches, loops, `try`, returns and raises); what an
expression evaluates to is `sglang_audit_expr.Expressions`, and the values themselves `sglang_audit_values`.
"""

from __future__ import annotations

import ast

from .sglang_audit_expr import MAX_STATES, MAX_STEPS, Expressions, Frame, OutOfBudget, PathState, Raised
from .sglang_audit_index import TryBlock, import_bindings, is_try
from .sglang_audit_values import Const, Outcome, Unknown, Value, negate, options, short, truth


class Evaluator(Expressions):
    """Interprets functions of an `Index` under a server configuration (attribute name -> value)."""

    # -- entry points ----------------------------------------------------------------------------------------

    def run(self, module: str, fn: ast.FunctionDef | ast.AsyncFunctionDef, args: list[Value] | None = None,
            kwargs: dict[str, Value] | None = None, bound: Value | None = None) -> list[Outcome]:
        """Every path through `fn` called with these arguments (`bound`: its `self` / `cls`)."""
        self._steps = 0
        self.consulted = {}
        try:
            return self._call(module, fn, args or [], kwargs or {}, bound, 0)
        except OutOfBudget:
            return [Outcome("return", Unknown(f"{fn.name}(...): too long to follow"), None, ())]

    def value(self, module: str, expr: ast.expr, env: dict[str, Value] | None = None,
              fn: ast.FunctionDef | ast.AsyncFunctionDef | None = None) -> Value:
        """The value of `expr` in `module` (inside `fn`, with `env` bound), raising paths left out."""
        self._steps = 0
        self.consulted = {}
        try:
            return self._eval(expr, PathState(dict(env or {}), ()), Frame(module, fn), 0)
        except Raised as r:
            return Unknown(f"raises {r.exc}")
        except OutOfBudget:
            return Unknown(short(ast.unparse(expr)))

    # -- calls -----------------------------------------------------------------------------------------------

    def _call(self, module: str, fn: ast.FunctionDef | ast.AsyncFunctionDef, args: list[Value],
              kwargs: dict[str, Value], bound: Value | None, depth: int) -> list[Outcome]:
        env: dict[str, Value] = {}
        a = fn.args
        params = [p.arg for p in a.posonlyargs + a.args]
        defaults: list[ast.expr | None] = [None] * (len(params) - len(a.defaults)) + list(a.defaults)
        positional: list[Value] = ([bound] if bound is not None else []) + list(args)
        frame = Frame(module, fn)
        for i, name in enumerate(params):
            default = defaults[i]
            if i < len(positional):
                env[name] = positional[i]
            elif name in kwargs:
                env[name] = kwargs[name]
            elif default is not None:
                env[name] = self._safe_eval(default, PathState({}, ()), Frame(module, None), depth)
            else:
                env[name] = Unknown(name)
        for kw, d in zip(a.kwonlyargs, a.kw_defaults, strict=False):
            env[kw.arg] = kwargs.get(kw.arg) or (self._safe_eval(d, PathState({}, ()), Frame(module, None), depth)
                                                 if d is not None else Unknown(kw.arg))
        if a.vararg:
            env[a.vararg.arg] = Unknown(a.vararg.arg)
        if a.kwarg:
            env[a.kwarg.arg] = Unknown(a.kwarg.arg)
        live, outs = self._block(fn.body, [PathState(env, ())], frame, depth)
        outs.extend(Outcome("return", Const(None), None, s.conds) for s in live)  # falling off the end
        return outs

    # -- statements ------------------------------------------------------------------------------------------

    def _block(self, body: list[ast.stmt], states: list[PathState], frame: Frame,
               depth: int) -> tuple[list[PathState], list[Outcome]]:
        outs: list[Outcome] = []
        live = states
        for st in body:
            nxt: list[PathState] = []
            for s in live:
                l2, o2 = self._stmt(st, s, frame, depth)
                nxt.extend(l2)
                outs.extend(o2)
            live = nxt[:MAX_STATES]
            if not live:
                break
        return live, outs

    def _stmt(self, st: ast.stmt, s: PathState, frame: Frame, depth: int) -> tuple[list[PathState], list[Outcome]]:
        self._steps += 1
        if self._steps > MAX_STEPS:
            raise OutOfBudget
        try:
            return self._stmt_inner(st, s, frame, depth)
        except Raised as r:
            return [], [Outcome("raise", Unknown(r.exc), r.exc, s.conds)]

    def _stmt_inner(self, st: ast.stmt, s: PathState, frame: Frame,
                    depth: int) -> tuple[list[PathState], list[Outcome]]:
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
            return [PathState(env, s.conds)], []
        if isinstance(st, (ast.AugAssign,)) and isinstance(st.target, ast.Name):
            return [PathState({**s.env, st.target.id: Unknown(st.target.id)}, s.conds)], []
        if isinstance(st, (ast.Import, ast.ImportFrom)):
            env = dict(s.env)
            for bound, b in import_bindings(st, frame.module, self.index.src.is_package(frame.module)):
                env[bound] = self._binding_value(b, bound)
            return [PathState(env, s.conds)], []
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
            _, outs = self._block(st.body, [PathState(env, s.conds)], frame, depth)
            return [s], outs
        if isinstance(st, ast.Assert):
            if truth(self._safe_eval(st.test, s, frame, depth)) is False:
                return [], [Outcome("raise", Unknown("AssertionError"), "AssertionError", s.conds)]
            return [s], []
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return [PathState({**s.env, st.name: Unknown(st.name)}, s.conds)], []
        return [s], []  # Expr, Pass, Delete, Global, Break, Continue, Match...: no effect tracked

    def _branch(self, test: ast.expr, body: list[ast.stmt], orelse: list[ast.stmt], s: PathState, frame: Frame,
                depth: int) -> tuple[list[PathState], list[Outcome]]:
        v = self._safe_eval(test, s, frame, depth)
        t = truth(v)
        if t is True:
            return self._block(body, [s], frame, depth)
        if t is False:
            return self._block(orelse, [s], frame, depth)
        cond = short(v.text if isinstance(v, Unknown) else ast.unparse(test))
        l1, o1 = self._block(body, [PathState(s.env, s.conds + (cond,))], frame, depth)
        l2, o2 = self._block(orelse, [PathState(s.env, s.conds + (negate(cond),))], frame, depth)
        return l1 + l2, o1 + o2

    def _try(self, st: TryBlock, s: PathState, frame: Frame, depth: int) -> tuple[list[PathState], list[Outcome]]:
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
            l2, o2 = self._block(handler.body, [PathState(env, o.conds)], frame, depth)
            live.extend(l2)
            kept.extend(o2)
        if st.orelse and live:
            live, o3 = self._block(st.orelse, live, frame, depth)
            kept.extend(o3)
        if st.finalbody and live:
            live, o4 = self._block(st.finalbody, live, frame, depth)
            kept.extend(o4)
        return live[:MAX_STATES], kept

