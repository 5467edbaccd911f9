"""`specscope sglang-audit`: will the overlap plan stream's fix-up hook raise on this SGLang server?

With `SGLANG_ENABLE_OVERLAP_PLAN_STREAM` set, SGLang's EAGLE-family workers prepare the verify's metadata on a
second stream and then call `target_attn_backend.update_verify_buffers_to_fill_after_draft(...)` before the verify
runs. The base `AttentionBackend` raises `NotImplementedError` there, so a server whose target backend lands on that
default dies at its first verify. This module answers the question from SGLang's source alone, read statically
with `ast` (an installed package, an unpacked wheel or a `.whl`; torch and SGLang are never imported):

- every `AttentionBackend` subclass and where the method resolves for it: defined (a no-op, a body, a forward to
  a child backend), inherited non-raising, or the raising default;
- the backend registry (`@register_attention_backend("name")`): which classes each name builds, and when;
- the call sites, the workers that reach them and the speculative algorithms that pick those workers;
- for given server arguments, the object the verify's call lands on, through the wrappers (`HybridAttnBackend`
  for different prefill and decode backends, and whatever any wrapper's method forwards to), and whether the first
  verify raises.

Nothing is tabulated per release: each answer is derived from the source it reads.
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import TypedDict

from ..tracer import user_env
from .sglang_audit_eval import (
    Child,
    Const,
    Evaluator,
    Member,
    SelfObj,
    Seq,
    Static,
    Unknown,
    Value,
    options,
    short,
    walk_body,
)
from .sglang_audit_index import ClassRef, FuncRef, Index, top_level
from .sglang_audit_source import AuditInputError, SourceTree, open_source

METHOD = "update_verify_buffers_to_fill_after_draft"
PLAN_ENV = user_env.SGLANG_PLAN_STREAM
BASE = "AttentionBackend"
# SGLang builds this wrapper when the prefill and decode backends differ; its constructor takes both by name.
HYBRID = "HybridAttnBackend"
HYBRID_PARAMS = ("prefill_backend", "decode_backend")
SPEC_ENUM = "SpeculativeAlgorithm"
REGISTER = "register_attention_backend"
# The speculative algorithm assumed when none is given: the verify the question is about is an EAGLE verify.
DEFAULT_ALGORITHM = "EAGLE"
# Server arguments the audit evaluates; their defaults come from the release's own field declarations.
SERVER_ARGS = ("attention_backend", "prefill_attention_backend", "decode_attention_backend",
               "speculative_attention_mode", "speculative_algorithm", "disable_overlap_schedule",
               "enable_multi_layer_eagle")

EXIT_SAFE, EXIT_RAISES, EXIT_UNREADABLE = 0, 1, 2

_HEADER = re.compile(r"^[ \t]*class[ \t]+(\w+)[ \t]*\(((?:[^()]|\([^()]*\))*)\)[ \t]*:", re.M)
_IDENT = re.compile(r"[A-Za-z_]\w*")
_LAST_WORD = re.compile(r"(\w+)[ \t]*$")


# -- what a definition of the method does ----------------------------------------------------------------------


@dataclass
class Target:
    """One `<receiver>.update_verify_buffers_to_fill_after_draft(...)` call inside a forwarding definition."""

    text: str  # the receiver as written (a loop: `x in self.attn_backend_list`)
    options: list[tuple[tuple[str, ...], Value]]  # what the receiver is, under which conditions
    line: int
    read: dict[str, object] = field(default_factory=dict)  # server arguments that decided it


@dataclass
class Definition:
    """A class body's own `update_verify_buffers_to_fill_after_draft`."""

    owner: ClassRef
    kind: str  # "no-op" | "raises" | "forwards" | "body" | "super" | "alias"
    where: str
    summary: str
    exc: str | None = None
    targets: list[Target] = field(default_factory=list)
    node: ast.AST | None = None

    @property
    def raises(self) -> bool:
        """Whether calling it raises unconditionally."""
        return self.kind == "raises"


@dataclass
class Resolution:
    """Where the method resolves for one class."""

    cls: ClassRef
    where: str
    status: str  # "define" | "inherit" | "raise"
    definition: Definition | None  # None: no class of the MRO defines it (AttributeError)
    chain: list[Definition] = field(default_factory=list)  # `super()` delegations followed

    @property
    def effective(self) -> Definition | None:
        """The definition whose effect the call has (after `super()` delegations)."""
        return self.chain[-1] if self.chain else self.definition

    @property
    def forwards(self) -> bool:
        """Whether the call is passed on to child backends."""
        eff = self.effective
        return eff is not None and eff.kind == "forwards"

    @property
    def exc(self) -> str:
        """The exception a raising resolution raises."""
        eff = self.effective
        return "AttributeError" if eff is None else (eff.exc or "an exception")


@dataclass
class Candidate:
    """One class a registered backend name builds, under its conditions (None: the code does not say which)."""

    cls: ClassRef | None
    conds: tuple[str, ...]
    text: str = ""


@dataclass
class Registered:
    """A registered attention backend name and the factory behind it."""

    name: str
    where: str
    candidates: list[Candidate]
    refusals: list[tuple[tuple[str, ...], str]]  # (conditions, exception) where the factory refuses


@dataclass
class CallSite:
    """A call of the method outside the attention backends: where a worker runs the fix-up."""

    where: str
    module: str
    function: str  # qualified name of the enclosing function
    cls: ClassRef | None  # the enclosing class, for a method
    guards: list[str]  # the enclosing `if` tests, outermost first


def _strip_doc(body: list[ast.stmt]) -> list[ast.stmt]:
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[1:]
    return body


def _trivial(st: ast.stmt) -> bool:
    if isinstance(st, ast.Pass):
        return True
    if isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant):
        return True  # `...` or a stray string
    return isinstance(st, ast.Return) and (st.value is None or (isinstance(st.value, ast.Constant)
                                                               and st.value.value is None))


def _is_super_call(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def _calls_of(body: list[ast.stmt]) -> list[ast.Call]:
    return [n for n in walk_body(body) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr == METHOD]


def _receiver(call: ast.Call) -> ast.expr:
    """The object a call found by `_calls_of` is made on (`recv` of `recv.METHOD(...)`)."""
    assert isinstance(call.func, ast.Attribute), "_calls_of keeps attribute calls only"
    return call.func.value


def _first_line(body: list[ast.stmt]) -> str:
    if not body:
        return ""
    text = ast.unparse(body[0]).splitlines()
    return short("; ".join(t.strip() for t in text[:2]) + (" …" if len(text) > 2 or len(body) > 1 else ""))


# -- the audit of one source tree ------------------------------------------------------------------------------


class Audit:
    """The static facts of one SGLang source tree that decide whether a plan-stream verify raises."""

    def __init__(self, src: SourceTree) -> None:
        self.src = src
        self.index = Index(src)
        self._resolutions: dict[ClassRef, Resolution] = {}
        self._definitions: dict[ClassRef, Definition | None] = {}
        self.base = self._find_base()

    @property
    def version(self) -> str:
        """The release, as its version file or metadata says."""
        return self.src.version or "unknown"

    def where(self, ref: ClassRef, node: ast.AST | None = None) -> str:
        """`path:line` of a class (or of a node in its module)."""
        target = node if node is not None else self.index.classdef(ref)
        return self.index.line(ref.module, target) if target is not None else self.src.path(ref.module)

    # -- the base class --------------------------------------------------------------------------------------

    def _find_base(self) -> ClassRef:
        hits: list[ClassRef] = []
        # Where every release so far keeps it: checked first, so a narrow question needs no scan of the tree.
        usual = "sglang.srt.layers.attention.base_attn_backend"
        info = self.index.module(usual)
        if info is not None and BASE in info.classes and self.index.method(ClassRef(usual, BASE), METHOD):
            return ClassRef(usual, BASE)
        for m, text in self.src.texts():
            if f"class {BASE}" in text:
                info = self.index.module(m)
                if info is not None and BASE in info.classes:
                    hits.append(ClassRef(m, BASE))
        if not hits:
            raise AuditInputError(f"{self.src.origin}: no `class {BASE}` in this source: not SGLang's runtime")
        # The ABC every backend derives from: the one that declares the method, in base_attn_backend if several.
        hits.sort(key=lambda r: (self.index.method(r, METHOD) is None, not r.module.endswith("base_attn_backend"),
                                 r.module))
        return hits[0]

    @cached_property
    def base_definition(self) -> Definition | None:
        """The base class's own definition of the method (None: the base does not declare it)."""
        return self.definition(self.base)

    # -- classes ---------------------------------------------------------------------------------------------

    @cached_property
    def subclasses(self) -> list[ClassRef]:
        """Every class of the tree that derives from the base, sorted by file and line."""
        out = [ref for ref in self._candidate_classes() if self.is_subclass(ref)]
        return sorted(out, key=lambda r: (self.src.path(r.module), getattr(self.index.classdef(r), "lineno", 0)))

    def _candidate_classes(self) -> list[ClassRef]:
        # A textual pre-pass keeps the parse to the files that can hold a subclass: class headers whose bases
        # name the base class or a class already found (or a local `import X as Y` alias of one); the answer
        # itself comes from the parsed files.
        headers: list[tuple[str, str, set[str]]] = []
        texts: dict[str, str] = {}
        for m, text in self.src.texts():
            if "class" not in text:
                continue
            found = _HEADER.findall(text)
            if found:
                texts[m] = text
                headers.extend((m, name, set(_IDENT.findall(bases))) for name, bases in found)
        names = {BASE}
        alias_cache: dict[tuple[str, str], set[str]] = {}

        def aliases(module: str, ident: str) -> set[str]:
            key = (module, ident)
            if key not in alias_cache:
                text = texts[module]
                found: set[str] = set()
                if f" as {ident}" in text:
                    # The literal prefix keeps the scan fast; the aliased name is the word just before ` as `.
                    for hit in re.finditer(rf" as[ \t]+{ident}\b", text):
                        before = _LAST_WORD.search(text, max(0, hit.start() - 80), hit.start())
                        if before:
                            found.add(before.group(1))
                alias_cache[key] = found
            return alias_cache[key]

        modules: set[str] = set()
        changed = True
        while changed:
            changed = False
            for m, name, idents in headers:
                if m in modules and name in names:
                    continue
                if idents & names or any(aliases(m, i) & names for i in idents if i not in names):
                    modules.add(m)
                    if name not in names:
                        names.add(name)
                        changed = True
        refs: list[ClassRef] = []
        for m in sorted(modules):
            info = self.index.module(m)
            if info is not None:
                refs.extend(ClassRef(m, n) for n in info.classes)
        return refs

    def find_class(self, name: str) -> ClassRef | None:
        """The subclass named `name` (the first by path when several share it), found without the full scan."""
        hits = []
        for m, text in self.src.texts():
            if f"class {name}" in text:
                info = self.index.module(m)
                if info is not None and name in info.classes and self.is_subclass(ClassRef(m, name)):
                    hits.append(ClassRef(m, name))
        hits.sort(key=lambda r: self.src.path(r.module))
        return hits[0] if hits else None

    def is_subclass(self, ref: ClassRef) -> bool:
        """Whether `ref` derives from the base class (and is not the base itself)."""
        return ref != self.base and self.base in self.index.mro(ref)

    def definition(self, ref: ClassRef) -> Definition | None:
        """The class body's own definition of the method, classified."""
        if ref not in self._definitions:
            node = self.index.method(ref, METHOD)
            self._definitions[ref] = None if node is None else self._classify(ref, node)
        return self._definitions[ref]

    def _classify(self, ref: ClassRef, node: ast.AST) -> Definition:
        where = self.where(ref, node)
        if isinstance(node, ast.Assign):
            return Definition(ref, "alias", where, short(ast.unparse(node.value)), node=node)
        assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        body = _strip_doc(node.body)
        if all(_trivial(st) for st in body):
            return Definition(ref, "no-op", where, "no-op", node=node)
        if isinstance(body[0], ast.Raise):
            exc = body[0].exc
            name = "re-raise" if exc is None else ast.unparse(exc.func if isinstance(exc, ast.Call) else exc)
            return Definition(ref, "raises", where, f"raise {name}", exc=name, node=node)
        calls = _calls_of(body)
        plain = [c for c in calls if not _is_super_call(_receiver(c))]
        if plain:
            d = Definition(ref, "forwards", where, "", node=node)
            d.targets = self._targets(ref, node, Evaluator(self.index))
            d.summary = "forwards to " + "; ".join(self.describe_target(t) for t in d.targets)
            return d
        if calls and len(body) == 1:
            return Definition(ref, "super", where, "calls super()'s", node=node)
        return Definition(ref, "body", where, "body: " + _first_line(body), node=node)

    def _targets(self, self_cls: ClassRef, fn: ast.FunctionDef | ast.AsyncFunctionDef,
                 ev: Evaluator) -> list[Target]:
        # The receiver of each forwarded call, as a value: a constructor argument the wrapper kept, a list of
        # them (a `for` loop over it), or what a selector method returns.
        nodes = walk_body(fn.body)
        loops: dict[str, ast.expr] = {}
        assigns: dict[str, list[ast.Assign]] = {}
        for n in nodes:
            if isinstance(n, (ast.For, ast.AsyncFor)) and isinstance(n.target, ast.Name):
                loops[n.target.id] = n.iter
            elif isinstance(n, ast.Assign):
                for t in n.targets:
                    if isinstance(t, ast.Name):
                        assigns.setdefault(t.id, []).append(n)
        owner = self.index.lookup(self_cls, METHOD)
        module = owner[0].module if owner else self_cls.module
        env: dict[str, Value] = {p.arg: Unknown(p.arg) for p in fn.args.posonlyargs + fn.args.args
                                 + fn.args.kwonlyargs}
        env["self"] = SelfObj(self_cls)
        out: list[Target] = []
        for call in _calls_of(fn.body):
            recv = _receiver(call)
            if _is_super_call(recv):
                continue
            text = ast.unparse(recv)
            expr: ast.expr = recv
            if isinstance(recv, ast.Name) and recv.id in loops:
                expr = loops[recv.id]
                text = f"each {recv.id} in {ast.unparse(expr)}"
            elif isinstance(recv, ast.Name) and recv.id in assigns:
                before = [a for a in assigns[recv.id] if a.lineno <= call.lineno] or assigns[recv.id]
                expr = before[-1].value
                text = f"{recv.id} = {ast.unparse(expr)}"
            v = ev.value(module, expr, env, fn)
            out.append(Target(short(text), options(v), call.lineno, dict(ev.consulted)))
        return out

    @staticmethod
    def describe_value(v: Value) -> str:
        """A receiver value in words."""
        if isinstance(v, Child):
            return f"self.{v.attr}" if v.attr == v.param else f"self.{v.attr} (argument {v.param})"
        if isinstance(v, Seq):
            return "every one of " + ", ".join(Audit.describe_value(x) for x in v.items)
        if isinstance(v, Unknown):
            return v.text
        return type(v).__name__

    def describe_target(self, t: Target) -> str:
        """A forwarded call in words: the receiver and what it is, under which conditions."""
        alts = [self.describe_value(v) + (f" when {_conds(c)}" if c else "") for c, v in t.options]
        shown = " or ".join(alts)
        return t.text if shown == t.text else f"{t.text} → {shown}"

    def resolve(self, ref: ClassRef) -> Resolution:
        """Where the method resolves for `ref`, classified define / inherit / raise."""
        if ref in self._resolutions:
            return self._resolutions[ref]
        mro = [c for c in self.index.mro(ref) if isinstance(c, ClassRef)]
        res: Resolution | None = None
        for i, c in enumerate(mro):
            d = self.definition(c)
            if d is None:
                continue
            chain: list[Definition] = []
            eff = d
            j = i
            while eff.kind == "super":  # `super().m(...)` and nothing else: the next definition up the MRO acts
                nxt = next(((k, dx) for k, x in enumerate(mro) if k > j
                            and (dx := self.definition(x)) is not None), None)
                if nxt is None:
                    break
                j, eff = nxt[0], nxt[1]
                chain.append(eff)
            status = "raise" if eff.raises else ("define" if c == ref else "inherit")
            res = Resolution(ref, self.where(ref), status, d, chain)
            break
        if res is None:
            res = Resolution(ref, self.where(ref), "raise", None)
        self._resolutions[ref] = res
        return res

    def counts(self) -> dict[str, int]:
        """How many subclasses define it, inherit a non-raising one, resolve to a raising one; and forward."""
        rs = [self.resolve(r) for r in self.subclasses]
        return {"classes": len(rs), "define": sum(r.status == "define" for r in rs),
                "inherit": sum(r.status == "inherit" for r in rs), "raise": sum(r.status == "raise" for r in rs),
                "forward": sum(r.forwards for r in rs)}

    # -- the registry ----------------------------------------------------------------------------------------

    @cached_property
    def registry(self) -> dict[str, Registered]:
        """Registered backend names, in source order, with the classes each builds."""
        out: dict[str, Registered] = {}
        ev = Evaluator(self.index)
        for m, text in self.src.texts():
            if f"{REGISTER}(" not in text:
                continue
            info = self.index.module(m)
            if info is None:
                continue
            for fn in info.functions.values():
                for d in fn.decorator_list:
                    if not (isinstance(d, ast.Call) and d.args and isinstance(d.args[0], ast.Constant)
                            and isinstance(d.args[0].value, str)):
                        continue
                    f = d.func
                    if (f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "") \
                            != REGISTER:
                        continue
                    out[d.args[0].value] = self._registered(ev, m, fn, d.args[0].value)
        return out

    def _registered(self, ev: Evaluator, module: str, fn: ast.FunctionDef | ast.AsyncFunctionDef,
                    name: str) -> Registered:
        groups: dict[tuple[ClassRef | None, str], list[tuple[str, ...]]] = {}
        refusals: list[tuple[tuple[str, ...], str]] = []
        for o in ev.run(module, fn, [Unknown("runner")]):
            if o.kind == "raise":
                refusals.append((o.conds, o.exc or "an exception"))
                continue
            cls = getattr(o.value, "cls", None)
            if not isinstance(cls, ClassRef) or isinstance(o.value, (Member, SelfObj)):
                cls = None
            text = "" if cls is not None else (o.value.text if isinstance(o.value, Unknown)
                                               else type(o.value).__name__)
            groups.setdefault((cls, text), []).append(o.conds)
        # One row per class, under the conditions all its paths share (the branches that only matter elsewhere
        # in the factory, such as setting up a stream, drop out).
        cands = []
        for (cls, text), paths in groups.items():
            common = [c for c in paths[0] if all(c in p for p in paths[1:])] if len(groups) > 1 else []
            cands.append(Candidate(cls, tuple(common), text))
        return Registered(name, self.index.line(module, fn), cands, refusals)

    # -- where the method is called --------------------------------------------------------------------------

    @cached_property
    def call_sites(self) -> list[CallSite]:
        """Calls of the method outside the backends' own forwarding definitions."""
        out: list[CallSite] = []
        for m, text in self.src.texts():
            if METHOD not in text:
                continue
            info = self.index.module(m)
            if info is None:
                continue
            for cls_name, fn, call, guards in _calls_in_module(info.tree):
                cls = ClassRef(m, cls_name) if cls_name else None
                if cls is not None and (cls == self.base or self.is_subclass(cls)):
                    continue  # a backend forwarding it to its children, not a worker running the fix-up
                qual = f"{cls_name}.{fn.name}" if cls_name else fn.name
                out.append(CallSite(self.index.line(m, call), m, qual, cls, guards))
        return out

    @cached_property
    def reaching_classes(self) -> dict[ClassRef, CallSite]:
        """Classes with a method that runs a call site (directly or through module functions it calls)."""
        out: dict[ClassRef, CallSite] = {}
        for site in self.call_sites:
            if site.cls is not None:
                out.setdefault(site.cls, site)
                continue
            frontier = [FuncRef(site.module, site.function)]
            seen: set[FuncRef] = set()
            for _ in range(3):  # a worker method -> a helper -> the function holding the call
                nxt: list[FuncRef] = []
                for f in frontier:
                    if f in seen:
                        continue
                    seen.add(f)
                    for caller_cls, caller_fn in self._callers(f):
                        if caller_cls is not None:
                            out.setdefault(caller_cls, site)
                        elif caller_fn is not None:
                            nxt.append(caller_fn)
                frontier = nxt
        return out

    def _callers(self, f: FuncRef) -> list[tuple[ClassRef | None, FuncRef | None]]:
        out: list[tuple[ClassRef | None, FuncRef | None]] = []
        for m, text in self.src.texts():
            if f"{f.name}(" not in text:
                continue
            info = self.index.module(m)
            if info is None:
                continue
            for cls_name, fn in _functions_in_module(info.tree):
                local = _local_imports(fn, m, self.src.is_package(m))
                for n in walk_body(fn.body):
                    if not (isinstance(n, ast.Call) and isinstance(n.func, (ast.Name, ast.Attribute))):
                        continue
                    called = n.func.id if isinstance(n.func, ast.Name) else n.func.attr
                    if called != f.name:
                        continue
                    if f in self.index.resolve_expr(m, n.func, local):
                        out.append((ClassRef(m, cls_name), None) if cls_name else (None, FuncRef(m, fn.name)))
                        break
        return out

    # -- the plan-stream variable and server-argument defaults -----------------------------------------------

    @cached_property
    def plan_env(self) -> tuple[str, str, str] | None:
        """(module, `path:line`, declaration such as `EnvBool(False)`) of the plan-stream variable; None: absent."""
        for m, text in self.src.texts():
            if f"{PLAN_ENV} =" not in text and f"{PLAN_ENV}=" not in text:
                continue
            info = self.index.module(m)
            if info is None:
                continue
            for n in ast.walk(info.tree):
                if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == PLAN_ENV
                                                     for t in n.targets):
                    return m, self.index.line(m, n), ast.unparse(n.value)
        return None

    def plan_stream_on(self, value: str | None) -> bool:
        """Whether SGLang reads `value` of the plan-stream variable as on (its `EnvBool.parse`, read statically)."""
        if value is None:
            return False
        decl = self.plan_env
        parse = self._env_parser(decl[0], decl[2].split("(")[0]) if decl is not None else None
        if parse is not None:
            module, fn, cls = parse
            outs = Evaluator(self.index).run(module, fn, [Const(value)], bound=SelfObj(cls))
            if outs and all(o.kind == "raise" for o in outs):
                raise AuditInputError(f"{PLAN_ENV}={value!r}: SGLang refuses this value "
                                      f"({outs[0].exc or 'an error'}); use 1 or 0")
            rets = {o.value.value for o in outs if o.kind == "return" and isinstance(o.value, Const)}
            if len(rets) == 1:
                return bool(rets.pop())
        # No parser found (or it depends on more than the text): the values SGLang's EnvBool has always taken.
        return value.strip().lower() in ("1", "true", "yes", "y")

    def _env_parser(self, module: str, kind: str) -> tuple[str, ast.FunctionDef, ClassRef] | None:
        for r in self.index.resolve(module, kind):
            if isinstance(r, ClassRef):
                hit = self.index.lookup(r, "parse")
                if hit is not None and isinstance(hit[1], ast.FunctionDef):
                    return hit[0].module, hit[1], r
        return None

    @cached_property
    def defaults(self) -> dict[str, object]:
        """The release's default of each evaluated server argument (its dataclass field declaration)."""
        out: dict[str, object] = {}
        preferred = ("sglang.srt.server_args", "sglang.srt.arg_groups")
        mods = sorted(self.src.modules(), key=lambda m: (not m.startswith(preferred), m))
        wanted = set(SERVER_ARGS)
        for m in mods:
            if not m.startswith("sglang.srt"):
                continue
            text = self.src.text(m) or ""
            if not any(f"{k}:" in text for k in wanted - set(out)):
                continue
            info = self.index.module(m)
            if info is None:
                continue
            for cdef in (n for n in ast.walk(info.tree) if isinstance(n, ast.ClassDef)):
                for st in cdef.body:
                    if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) \
                            and st.target.id in wanted and st.target.id not in out \
                            and isinstance(st.value, ast.Constant):
                        out[st.target.id] = st.value.value
            if set(out) == wanted:
                break
        return out

    # -- speculative algorithms and their workers ------------------------------------------------------------

    @cached_property
    def spec_enum(self) -> ClassRef | None:
        """SGLang's `SpeculativeAlgorithm` enum."""
        hits = []
        for m, text in self.src.texts("sglang.srt"):
            if f"class {SPEC_ENUM}" in text:
                info = self.index.module(m)
                if info is not None and SPEC_ENUM in info.classes:
                    hits.append(ClassRef(m, SPEC_ENUM))
        hits.sort(key=lambda r: (not r.module.endswith("spec_info"), r.module))
        return hits[0] if hits else None

    def algorithm_members(self, name: str) -> list[tuple[str, tuple[str, ...]]]:
        """The enum member(s) a `--speculative-algorithm` value becomes, with the conditions of each."""
        enum = self.spec_enum
        if enum is None:
            raise AuditInputError(f"{self.src.origin}: no `{SPEC_ENUM}` enum found")
        ev = Evaluator(self.index)
        members = ev._members(enum)  # noqa: SLF001 - same package
        upper = name.upper()
        if upper in members:
            return [(upper, ())]
        found: list[tuple[str, tuple[str, ...]]] = []
        hit = self.index.lookup(enum, "from_string")
        if hit is not None and isinstance(hit[1], ast.FunctionDef):
            for o in ev.run(hit[0].module, hit[1], [Const(name)], bound=Static(enum)):
                if o.kind == "return" and isinstance(o.value, Member):
                    found.append((o.value.name, o.conds))
        if not found:
            found = self._alias_functions(name, members)
        if not found:
            raise AuditInputError(f"--speculative-algorithm {name}: not an algorithm of sglang {self.version} "
                                  f"(one of {', '.join(sorted(members))})")
        return found

    def _alias_functions(self, name: str, members: set[str]) -> list[tuple[str, tuple[str, ...]]]:
        # A name that is no member (NEXTN) is normalised by a server-args function taking the algorithm string:
        # run every function of the runtime that has such a parameter and returns member names.
        out: list[tuple[str, tuple[str, ...]]] = []
        ev = Evaluator(self.index)
        for m, text in self.src.texts("sglang.srt"):
            if f'"{name}"' not in text and f"'{name}'" not in text:
                continue
            info = self.index.module(m)
            if info is None:
                continue
            for fn in info.functions.values():
                params = [p.arg for p in fn.args.posonlyargs + fn.args.args]
                if "speculative_algorithm" not in params:
                    continue
                args: list[Value] = [Const(name) if p == "speculative_algorithm" else Unknown(p) for p in params]
                for o in ev.run(m, fn, args):
                    if o.kind == "return" and isinstance(o.value, Const) and isinstance(o.value.value, str) \
                            and o.value.value.upper() in members and o.value.value.upper() != name.upper():
                        out.append((o.value.value.upper(), o.conds + (f"{fn.name}() maps {name} to it",)))
        return list(dict.fromkeys(out))

    def workers(self, member: str, config: dict[str, object]) -> list[tuple[ClassRef | None, tuple[str, ...], str]]:
        """(worker class, conditions, refusal) for an algorithm: what `create_worker` returns or raises."""
        enum = self.spec_enum
        hit = self.index.lookup(enum, "create_worker") if enum is not None else None
        if enum is None or hit is None or not isinstance(hit[1], ast.FunctionDef):
            return [(None, (), "")]
        out: list[tuple[ClassRef | None, tuple[str, ...], str]] = []
        for o in Evaluator(self.index, config).run(hit[0].module, hit[1], [Unknown("server_args")],
                                                    bound=Member(enum, member)):
            if o.kind == "raise":
                out.append((None, o.conds, o.exc or "an exception"))
            elif isinstance(o.value, Static) and isinstance(o.value.ref, ClassRef):
                out.append((o.value.ref, o.conds, ""))
            elif not (isinstance(o.value, Const) and o.value.value is None):
                out.append((None, o.conds, ""))
        return out

    def reaches(self, worker: ClassRef) -> CallSite | None:
        """The call site a worker class runs (through its MRO), if any."""
        for c in self.index.mro(worker):
            if isinstance(c, ClassRef) and c in self.reaching_classes:
                return self.reaching_classes[c]
        return None

    @cached_property
    def hybrid_site(self) -> str | None:
        """Where SGLang builds the prefill/decode wrapper (outside its own module)."""
        cls = self.find_class(HYBRID)
        if cls is None:
            return None
        for m, text in self.src.texts("sglang.srt"):
            if f"{HYBRID}(" not in text or m == cls.module:
                continue
            info = self.index.module(m)
            for n in ast.walk(info.tree) if info else []:
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == HYBRID:
                    return self.index.line(m, n)
        return None


def _functions_in_module(tree: ast.Module) -> list[tuple[str | None, ast.FunctionDef | ast.AsyncFunctionDef]]:
    out: list[tuple[str | None, ast.FunctionDef | ast.AsyncFunctionDef]] = []
    for st in top_level(tree.body):
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append((None, st))
        elif isinstance(st, ast.ClassDef):
            out.extend((st.name, f) for f in top_level(st.body) if isinstance(f, (ast.FunctionDef,
                                                                                   ast.AsyncFunctionDef)))
    return out


def _calls_in_module(tree: ast.Module) -> list[tuple[str | None, ast.FunctionDef | ast.AsyncFunctionDef, ast.Call,
                                                      list[str]]]:
    out = []
    for cls_name, fn in _functions_in_module(tree):
        for call, guards in _guarded_calls(fn.body, []):
            out.append((cls_name, fn, call, guards))
    return out


def _guarded_calls(body: list[ast.stmt], guards: list[str]) -> list[tuple[ast.Call, list[str]]]:
    out: list[tuple[ast.Call, list[str]]] = []
    for st in body:
        if isinstance(st, ast.If):
            test = short(ast.unparse(st.test))
            out.extend(_guarded_calls(st.body, guards + [f"if {test}"]))
            out.extend(_guarded_calls(st.orelse, guards + [f"if not ({test})"]))
            nodes = walk_body([ast.Expr(st.test)])
        elif isinstance(st, (ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try)):
            inner = list(st.body) + list(getattr(st, "orelse", [])) + list(getattr(st, "finalbody", []))
            for h in getattr(st, "handlers", []):
                inner.extend(h.body)
            out.extend(_guarded_calls(inner, guards))
            continue
        else:
            nodes = walk_body([st])
        for n in nodes:
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == METHOD:
                out.append((n, guards))
    return out


def _local_imports(fn: ast.FunctionDef | ast.AsyncFunctionDef, module: str, is_pkg: bool) -> dict[str, list]:
    from .sglang_audit_index import import_bindings

    out: dict[str, list] = {}
    for n in walk_body(fn.body):
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            for bound, b in import_bindings(n, module, is_pkg):
                out.setdefault(bound, []).append(b)
    return out


# -- a server configuration ------------------------------------------------------------------------------------


@dataclass
class ServerConfig:
    """The server arguments and environment the verdict depends on (None: not given, SGLang's default)."""

    attention_backend: str | None = None
    prefill_attention_backend: str | None = None
    decode_attention_backend: str | None = None
    speculative_attention_mode: str | None = None
    speculative_algorithm: str | None = None
    disable_overlap_schedule: bool | None = None
    enable_multi_layer_eagle: bool | None = None
    plan_stream: str | None = None  # the value of SGLANG_ENABLE_OVERLAP_PLAN_STREAM; None: unset

    def args(self) -> list[str]:
        """The configuration as launch-server flags (and the variable), for messages."""
        out = [f"{PLAN_ENV}={self.plan_stream}"] if self.plan_stream is not None else []
        for k in SERVER_ARGS:
            v = getattr(self, k)
            if isinstance(v, bool):
                out += [f"--{k.replace('_', '-')}"] if v else []
            elif v is not None:
                out += [f"--{k.replace('_', '-')}", v]
        return out


_STR_FLAGS = {f"--{k.replace('_', '-')}": k for k in SERVER_ARGS[:5]}
_BOOL_FLAGS = {f"--{k.replace('_', '-')}": k for k in SERVER_ARGS[5:]}
_ENV_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


def parse_server_command(tokens: list[str], config: ServerConfig | None = None) -> ServerConfig:
    """Pick the evaluated arguments (and `SGLANG_ENABLE_OVERLAP_PLAN_STREAM=...`) out of a launch command line;
    every other token (the model, the port, `python -m sglang.launch_server`) is ignored."""
    cfg = config or ServerConfig()
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        m = _ENV_ASSIGN.match(tok)
        if m and not tok.startswith("-"):
            if m.group(1) == PLAN_ENV:
                cfg.plan_stream = m.group(2)
            i += 1
            continue
        flag, eq, val = tok.partition("=")
        if flag in _STR_FLAGS:
            if not eq:
                if i + 1 >= len(tokens) or tokens[i + 1].startswith("--"):
                    raise AuditInputError(f"{flag} needs a value")
                val = tokens[i + 1]
                i += 1
            setattr(cfg, _STR_FLAGS[flag], val)
        elif flag in _BOOL_FLAGS:
            setattr(cfg, _BOOL_FLAGS[flag], True if not eq else val.lower() in ("1", "true", "yes", "y"))
        i += 1
    return cfg


@dataclass
class Node:
    """A backend object of the configuration: its class (None: unknown) and the children it was built with."""

    label: str  # how the configuration names it: `fa3`, `HybridAttnBackend`
    cls: ClassRef | None
    conds: tuple[str, ...] = ()
    children: dict[str, list[Node]] = field(default_factory=dict)
    why_unknown: str = ""


@dataclass
class Leaf:
    """One way the verify's call can end: the path through the wrappers and whether it raises."""

    steps: list[str]
    raises: bool | None  # None: cannot tell
    exc: str | None = None
    conds: tuple[str, ...] = ()


class WorkerEntry(TypedDict):
    """One worker an algorithm can pick, as the verdict reports it."""

    algorithm: str
    worker: str | None
    when: list[str]
    refused: str | None
    call_site: str | None


@dataclass
class Verdict:
    """The answer for one configuration."""

    exit_code: int
    headline: str
    config: ServerConfig
    algorithm: str
    mode: str
    plan_stream: bool
    workers: list[WorkerEntry]
    target: str
    leaves: list[Leaf]
    notes: list[str]
    would_raise: bool  # with the plan stream on (whether or not it is on here)

    def to_json(self) -> dict[str, object]:
        """The verdict as JSON-ready data."""
        return {"exit": self.exit_code, "headline": self.headline, "server_args": self.config.args(),
                "speculative_algorithm": self.algorithm, "speculative_attention_mode": self.mode,
                "plan_stream": self.plan_stream, "raises_with_plan_stream": self.would_raise,
                "workers": self.workers, "target": self.target,
                "paths": [{"steps": lf.steps, "raises": lf.raises, "exception": lf.exc, "when": list(lf.conds)}
                          for lf in self.leaves],
                "notes": self.notes}


class ConfigError(AuditInputError):
    """The configuration cannot be judged (a name the release does not register, a backend left to SGLang)."""


def _server_config_dict(audit: Audit, cfg: ServerConfig) -> dict[str, object]:
    out = dict(audit.defaults)
    for k in SERVER_ARGS:
        v = getattr(cfg, k)
        if v is not None:
            out[k] = v
    return out


def judge(audit: Audit, cfg: ServerConfig) -> Verdict:
    """Where the first plan-stream verify's `update_verify_buffers_to_fill_after_draft` lands, and if it raises."""
    values = _server_config_dict(audit, cfg)
    notes: list[str] = []
    mode = str(values.get("speculative_attention_mode") or "prefill")
    if cfg.speculative_attention_mode is None:
        if "speculative_attention_mode" in audit.defaults:
            notes.append(f"--speculative-attention-mode {mode}: the default of sglang {audit.version}")
        else:
            notes.append("--speculative-attention-mode: no declared default found; assumed prefill")
            values["speculative_attention_mode"] = mode
    algorithm = cfg.speculative_algorithm or DEFAULT_ALGORITHM
    if cfg.speculative_algorithm is None:
        notes.append(f"--speculative-algorithm not given: assumed {DEFAULT_ALGORITHM}")
    values["speculative_algorithm"] = algorithm
    plan_on = audit.plan_stream_on(cfg.plan_stream)

    backend_leaves, target = _land_config(audit, cfg, values, notes)
    would_raise = any(lf.raises for lf in backend_leaves)
    undecided = [lf for lf in backend_leaves if lf.raises is None]

    if algorithm.upper() == "NONE":
        workers_json: list[WorkerEntry] = []
        return _verdict(EXIT_SAFE, "safe: no speculative decoding, so no verify and no fix-up call", cfg, algorithm,
                        mode, plan_on, workers_json, target, backend_leaves, notes, would_raise)
    members = audit.algorithm_members(algorithm)
    workers_json = []
    reaching = []
    for member, mconds in members:
        for wcls, wconds, refusal in audit.workers(member, values):
            site = audit.reaches(wcls) if wcls is not None else None
            entry: WorkerEntry = {"algorithm": member, "worker": wcls.name if wcls else None,
                                  "when": list(mconds + wconds), "refused": refusal or None,
                                  "call_site": site.where if site else None}
            workers_json.append(entry)
            # A worker the source does not name (an out-of-tree platform's plugin) is not SGLang's code to judge.
            if site is not None:
                reaching.append(entry)
    if not reaching:
        return _verdict(EXIT_SAFE, f"safe: no worker of --speculative-algorithm {algorithm} calls {METHOD}",
                        cfg, algorithm, mode, plan_on, workers_json, target, backend_leaves, notes, would_raise)
    if audit.plan_env is None and not audit.call_sites:
        return _verdict(EXIT_SAFE, f"safe: sglang {audit.version} never calls {METHOD}", cfg, algorithm, mode,
                        plan_on, workers_json, target, backend_leaves, notes, would_raise)
    if not plan_on:
        then = "would raise" if would_raise else "would not raise"
        return _verdict(EXIT_SAFE, f"safe: the plan stream is off, so {METHOD} is never called ({PLAN_ENV}=1 "
                        f"{then} at the first verify)", cfg, algorithm, mode, plan_on, workers_json, target,
                        backend_leaves, notes, would_raise)
    if would_raise:
        exc = next(lf.exc for lf in backend_leaves if lf.raises)
        some = "" if all(lf.raises for lf in backend_leaves) else " (on some of the paths below)"
        return _verdict(EXIT_RAISES, f"RAISES {exc} at the first verify{some}", cfg, algorithm, mode, plan_on,
                        workers_json, target, backend_leaves, notes, would_raise)
    if undecided:
        raise ConfigError(f"cannot tell where the verify's {METHOD} lands: " + "; ".join(
            lf.steps[-1] for lf in undecided))
    return _verdict(EXIT_SAFE, "safe: the first verify's fix-up call does not raise", cfg, algorithm, mode,
                    plan_on, workers_json, target, backend_leaves, notes, would_raise)


def _verdict(code: int, headline: str, cfg: ServerConfig, algorithm: str, mode: str, plan_on: bool,
             workers: list[WorkerEntry], target: str, leaves: list[Leaf], notes: list[str],
             would_raise: bool) -> Verdict:
    return Verdict(code, headline, cfg, algorithm, mode, plan_on, workers, target, leaves, notes, would_raise)


def _node_for(audit: Audit, name: str | None, role: str) -> list[Node]:
    if name is None:
        return [Node(f"<{role}>", None, why_unknown=f"the {role} backend is SGLang's automatic choice for the "
                     f"device and model: name it with --{role}-attention-backend or --attention-backend")]
    reg = audit.registry.get(name)
    if reg is None:
        raise ConfigError(f"{name!r} is not a registered attention backend of sglang {audit.version} (registered: "
                          f"{', '.join(audit.registry) or 'none'})")
    nodes = [Node(name, c.cls, c.conds, why_unknown=c.text) for c in reg.candidates]
    return nodes or [Node(name, None, why_unknown=f"the factory of {name!r} never returns a backend")]


def _land_config(audit: Audit, cfg: ServerConfig, values: dict[str, object],
                 notes: list[str]) -> tuple[list[Leaf], str]:
    prefill = cfg.prefill_attention_backend or cfg.attention_backend
    decode = cfg.decode_attention_backend or cfg.attention_backend
    if prefill is None and decode is None:
        raise ConfigError("name the attention backend: --attention-backend, or --prefill-attention-backend and "
                          "--decode-attention-backend (SGLang's automatic choice depends on the device and model)")
    ev = Evaluator(audit.index, values)
    if prefill != decode:
        hybrid = audit.find_class(HYBRID)
        if hybrid is None:
            raise ConfigError(f"sglang {audit.version} has no {HYBRID} for different prefill and decode backends")
        site = audit.hybrid_site
        target = f"{HYBRID} (prefill {prefill or 'auto'}, decode {decode or 'auto'}" + (
            f"; built at {site})" if site else ")")
        root = Node(HYBRID, hybrid, children={"prefill_backend": _node_for(audit, prefill, "prefill"),
                                              "decode_backend": _node_for(audit, decode, "decode")})
        roots = [root]
    else:
        roots = _node_for(audit, prefill, "prefill")
        target = f"--attention-backend {prefill}"
    notes.append("a model-specific wrapper (hybrid linear attention, MiniMax sparse, Dots: attn_backend_wrapper) "
                 "and server-args hooks that rewrite backends for a device or model are not evaluated")
    leaves: list[Leaf] = []
    for r in roots:
        leaves.extend(_land(audit, ev, r, [], 0))
    return leaves, target


def _cls_text(audit: Audit, ref: ClassRef) -> str:
    return f"{ref.name} ({audit.where(ref)})"


def _land(audit: Audit, ev: Evaluator, node: Node, steps: list[str], depth: int) -> list[Leaf]:
    head = node.label if node.cls is None or node.label == node.cls.name else f"{node.label} = {node.cls.name}"
    if node.conds:
        head += f" [when {_conds(node.conds)}]"
    if node.cls is None:
        return [Leaf(steps + [f"{head}: {node.why_unknown or 'unknown class'}"], None, conds=node.conds)]
    res = audit.resolve(node.cls)
    eff = res.effective
    if eff is None:
        return [Leaf(steps + [f"{head}: no class of its MRO defines {METHOD}"], True, "AttributeError",
                     node.conds)]
    owner = "its own" if eff.owner == node.cls else f"{eff.owner.name}'s"
    here = f"{head}: {owner} {METHOD} ({eff.where})"
    if eff.kind == "raises":
        return [Leaf(steps + [f"{here}: {eff.summary}"], True, eff.exc, node.conds)]
    if eff.kind != "forwards":
        return [Leaf(steps + [f"{here}: {eff.summary}"], False, None, node.conds)]
    if depth > 6:
        return [Leaf(steps + [f"{here}: forwards deeper than the audit follows"], None, conds=node.conds)]
    assert isinstance(eff.node, (ast.FunctionDef, ast.AsyncFunctionDef))
    out: list[Leaf] = []
    for t in audit._targets(node.cls, eff.node, ev):  # noqa: SLF001 - same module
        for conds, v in t.options:
            kids = list(v.items) if isinstance(v, Seq) else [v]
            decided = ", ".join(f"--{k.replace('_', '-')} {val}" for k, val in t.read.items())
            step = f"{here}: forwards to {t.text}"
            step += "" if isinstance(v, Unknown) else f" = {Audit.describe_value(v)}"
            step += (f" [when {_conds(conds)}]" if conds else "") + (f" [{decided}]" if decided else "")
            for kid in kids:
                if not isinstance(kid, Child):
                    out.append(Leaf(steps + [step, f"cannot tell what {Audit.describe_value(kid)} is"], None,
                                    conds=node.conds + conds))
                    continue
                alts = node.children.get(kid.param)
                if alts is None:
                    out.append(Leaf(steps + [step, f"{kid.param}: not given by this configuration"], None,
                                    conds=node.conds + conds))
                    continue
                arg = "" if kid.param == kid.attr else f" (argument {kid.param})"
                for alt in alts:
                    out.extend(Leaf(lf.steps, lf.raises, lf.exc, node.conds + conds + lf.conds)
                               for lf in _land(audit, ev, alt, steps + [step + arg], depth + 1))
    return out


# -- reports ---------------------------------------------------------------------------------------------------


def _conds(conds: tuple[str, ...] | list[str]) -> str:
    """Conditions joined with `and`, each with `or` inside it parenthesised."""
    return " and ".join(f"({c})" if " or " in c and not (c.startswith("(") and c.endswith(")")) else c
                        for c in conds)


def _resolution_text(audit: Audit, r: Resolution) -> str:
    eff = r.effective
    if eff is None:
        return "no definition in the MRO: AttributeError"
    if r.status == "define":
        return eff.summary
    if r.status == "inherit":
        return f"from {eff.owner.name}: {eff.summary}"
    if eff.owner == audit.base:
        return f"{audit.base.name}'s {eff.summary}"
    return f"{eff.owner.name}: {eff.summary}"


def report_json(audit: Audit, verdict: Verdict | None) -> dict[str, object]:
    """The whole audit as JSON-ready data."""
    base_def = audit.base_definition
    classes = []
    for ref in audit.subclasses:
        r = audit.resolve(ref)
        eff = r.effective
        classes.append({"class": ref.name, "module": ref.module, "where": r.where, "status": r.status,
                        "kind": eff.kind if eff else None, "from": eff.owner.name if eff else None,
                        "definition": eff.where if eff else None, "forwards": r.forwards,
                        "what": _resolution_text(audit, r)})
    registry = []
    for reg in audit.registry.values():
        registry.append({"name": reg.name, "where": reg.where, "classes": [
            {"class": c.cls.name if c.cls else None, "module": c.cls.module if c.cls else None, "when": list(c.conds),
             "status": audit.resolve(c.cls).status if c.cls and c.cls in audit.subclasses else None,
             "note": c.text or None} for c in reg.candidates],
            "refused": [{"when": list(cs), "exception": e} for cs, e in reg.refusals]})
    plan = audit.plan_env
    return {"sglang": {"version": audit.version, "source": audit.src.origin, "kind": audit.src.kind},
            "base": {"class": audit.base.name, "where": audit.where(audit.base),
                     "definition": base_def.where if base_def else None,
                     "what": base_def.summary if base_def else None},
            "counts": audit.counts(), "classes": classes, "registry": registry,
            "call_sites": [{"where": s.where, "function": s.function, "guards": s.guards} for s in audit.call_sites],
            "plan_stream_variable": {"name": PLAN_ENV, "where": plan[1], "declared": plan[2]} if plan else None,
            "verdict": verdict.to_json() if verdict else None,
            "exit": verdict.exit_code if verdict else EXIT_SAFE,
            "unparsed": audit.src.syntax_errors}


def report_text(audit: Audit, verdict: Verdict | None, full: bool = True) -> list[str]:
    """The audit as lines of text: the class table and the registry (when `full`), then the verdict."""
    lines: list[str] = []
    c = audit.counts()
    base_def = audit.base_definition
    lines.append(f"sglang {audit.version} ({audit.src.origin})")
    lines.append(f"{audit.base.name} ({audit.where(audit.base)}): {METHOD} "
                 + (f"{base_def.summary} ({base_def.where})" if base_def else "not declared"))
    lines.append(f"{c['classes']} subclasses: {c['define']} define it, {c['inherit']} inherit a non-raising one, "
                 f"{c['raise']} resolve to a raising one; {c['forward']} forward it to child backends")
    if full:
        lines.append("")
        rows = [(audit.resolve(r).status, r.name, audit.resolve(r).where, _resolution_text(audit, audit.resolve(r)))
                for r in audit.subclasses]
        w1 = max((len(x[1]) for x in rows), default=5)
        w2 = max((len(x[2]) for x in rows), default=5)
        lines.append(f"{'status':<8} {'class':<{w1}} {'file':<{w2}} what a plan-stream verify gets")
        lines.extend(f"{s:<8} {n:<{w1}} {p:<{w2}} {what}" for s, n, p, what in rows)
        lines.append("")
        lines.append(f"registered backends ({len(audit.registry)}):")
        for reg in audit.registry.values():
            parts = []
            for cand in reg.candidates:
                if cand.cls is None:
                    parts.append(f"? ({cand.text})")
                    continue
                r = audit.resolve(cand.cls)
                when = f" when {_conds(cand.conds)}" if cand.conds else ""
                tag = "raises" if r.status == "raise" else "forwards" if r.forwards else "ok"
                parts.append(f"{cand.cls.name} [{tag}]{when}")
            lines.append(f"  {reg.name:<22} " + ("; ".join(parts) or "no backend class found"))
        lines.append("")
        for s in audit.call_sites:
            guard = f" under `{' / '.join(s.guards)}`" if s.guards else ""
            lines.append(f"call site: {s.where} in {s.function}{guard}")
        plan = audit.plan_env
        lines.append(f"plan stream: {PLAN_ENV} = {plan[2]} ({plan[1]})" if plan else
                     f"plan stream: {PLAN_ENV} is not declared in this release")
        for err in audit.src.syntax_errors:
            lines.append(f"not parsed: {err}")
    if verdict is not None:
        lines.append("")
        lines.append(f"configuration: {' '.join(verdict.config.args()) or '(defaults)'}")
        for n in verdict.notes:
            lines.append(f"  note: {n}")
        lines.append(f"target backend: {verdict.target}")
        for w in verdict.workers:
            what = f"refuses ({w['refused']})" if w["refused"] else (
                f"calls it at {w['call_site']}" if w["call_site"] else "never calls it" if w["worker"]
                else "a worker class this source does not name (not judged)")
            when = f" when {_conds(w['when'])}" if w["when"] else ""
            lines.append(f"  worker: {w['algorithm']} → {w['worker'] or '?'}{when}: {what}")
        for lf in verdict.leaves:
            lines.append("  path: " + " → ".join(lf.steps))
        lines.append(f"verdict: {verdict.headline}")
    return lines


# -- the entry points ------------------------------------------------------------------------------------------

_CACHE: dict[tuple[str, str | None, str | None], Audit] = {}


def load(path: str | None = None, version: str | None = None) -> Audit:
    """The audit of an SGLang source (see `open_source`), cached per process."""
    key = (os.path.abspath(path) if path else "", version, None)
    if key not in _CACHE:
        _CACHE[key] = Audit(open_source(path, version))
    return _CACHE[key]


# The configurations `sglang-hook install` checks: TRTLLM MHA alone (Blackwell) and TRTLLM MHA for decode with
# FlashAttention 3 for prefill (Hopper), the two recipes of docs/sglang.md.
COMMON = (("--attention-backend", "trtllm_mha"),
          ("--prefill-attention-backend", "fa3", "--decode-attention-backend", "trtllm_mha"))


def plan_stream_warning(environ: dict[str, str] | None = None, path: str | None = None) -> list[str]:
    """At most two lines for `sglang-hook install`: the common configurations that raise at the first verify with
    the plan stream on, on the installed sglang (or `path`); empty when none does."""
    audit = load(path)
    value = user_env.get(PLAN_ENV, environ)
    on = audit.plan_stream_on(value) if value is not None else False
    bad: list[str] = []
    fixes: list[str] = []
    for args in COMMON:
        cfg = parse_server_command(list(args) + ["--speculative-algorithm", DEFAULT_ALGORITHM])
        cfg.plan_stream = "1"
        try:
            if judge(audit, cfg).exit_code != EXIT_RAISES:
                continue
            bad.append(" ".join(args))
            cfg.speculative_attention_mode = "decode"
            if judge(audit, cfg).exit_code == EXIT_SAFE:
                fixes.append(" ".join(args))
        except AuditInputError:
            continue
    if not bad:
        return []
    state = f"{PLAN_ENV} is on here" if on else f"with {PLAN_ENV}=1"
    fix = " (add --speculative-attention-mode decode)" if fixes == bad else ""
    return [f"specscope: warning: {state}, sglang {audit.version} raises NotImplementedError at the first verify "
            f"with {'; '.join(bad)}{fix}",
            "specscope: warning: check a server's arguments with `specscope sglang-audit -- <launch command>`"]
