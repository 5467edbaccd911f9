"""Where `update_verify_buffers_to_fill_after_draft` resolves for every `AttentionBackend` subclass of SGLang.

The base class is found in the source; its subclasses are every class whose bases lead to it (across modules, C3
order); each class body's own definition of the method is classified (a no-op, the raising default, a body, a
`super()` call, or a forward to child backends, whose receivers are evaluated), and the method is resolved up each
class's MRO: *define*, *inherit* a non-raising one, or *raise*. Read statically with `ast`; nothing is imported.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from functools import cached_property

from .sglang_audit_eval import Evaluator
from .sglang_audit_index import ClassRef, Index
from .sglang_audit_source import AuditInputError, SourceTree
from .sglang_audit_values import Child, SelfObj, Seq, Unknown, Value, conds_text, options, short, walk_body

METHOD = "update_verify_buffers_to_fill_after_draft"
BASE = "AttentionBackend"

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


class Hierarchy:
    """The `AttentionBackend` subclasses of one SGLang source tree and where the method resolves for each."""

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
            d.targets = self.forward_targets(ref, node, Evaluator(self.index))
            d.summary = "forwards to " + "; ".join(self.describe_target(t) for t in d.targets)
            return d
        if calls and len(body) == 1:
            return Definition(ref, "super", where, "calls super()'s", node=node)
        return Definition(ref, "body", where, "body: " + _first_line(body), node=node)

    def forward_targets(self, self_cls: ClassRef, fn: ast.FunctionDef | ast.AsyncFunctionDef,
                        ev: Evaluator) -> list[Target]:
        """The calls a forwarding definition makes, each receiver evaluated with `ev` (its server arguments)."""
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
            return "every one of " + ", ".join(Hierarchy.describe_value(x) for x in v.items)
        if isinstance(v, Unknown):
            return v.text
        return type(v).__name__

    def describe_target(self, t: Target) -> str:
        """A forwarded call in words: the receiver and what it is, under which conditions."""
        alts = [self.describe_value(v) + (f" when {conds_text(c)}" if c else "") for c, v in t.options]
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
