"""How SGLang wires backends and workers to the hook: the backend registry (`@register_attention_backend`), the
call sites of `update_verify_buffers_to_fill_after_draft` and the workers that reach them, the speculative
algorithms and the workers `create_worker` picks, the plan-stream variable, and the release's server-argument
defaults. With the class hierarchy (`Hierarchy`) that is the `Audit` of one source tree; read statically with
`ast`, nothing is imported.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cached_property

from .sglang_audit_args import PLAN_ENV, SERVER_ARGS
from .sglang_audit_classes import METHOD, Hierarchy
from .sglang_audit_eval import Evaluator
from .sglang_audit_index import ClassRef, FuncRef, import_bindings, top_level
from .sglang_audit_source import AuditInputError
from .sglang_audit_values import Const, Member, SelfObj, Static, Unknown, Value, short, walk_body

# SGLang builds this wrapper when the prefill and decode backends differ; its constructor takes both by name.
HYBRID = "HybridAttnBackend"
HYBRID_PARAMS = ("prefill_backend", "decode_backend")
SPEC_ENUM = "SpeculativeAlgorithm"
REGISTER = "register_attention_backend"


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


class Audit(Hierarchy):
    """The static facts of one SGLang source tree that decide whether a plan-stream verify raises."""

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
    out: dict[str, list] = {}
    for n in walk_body(fn.body):
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            for bound, b in import_bindings(n, module, is_pkg):
                out.setdefault(bound, []).append(b)
    return out

