"""The verdict for one server configuration: which object the first plan-stream verify's
`update_verify_buffers_to_fill_after_draft` lands on, through the wrappers (`HybridAttnBackend` for different
prefill and decode backends, and whatever a wrapper's method forwards to), which workers reach the call, and
whether it raises.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import TypedDict

from .sglang_audit_args import PLAN_ENV, SERVER_ARGS, ServerConfig
from .sglang_audit_classes import METHOD, Hierarchy
from .sglang_audit_eval import Evaluator
from .sglang_audit_index import ClassRef
from .sglang_audit_source import AuditInputError
from .sglang_audit_values import Child, Seq, Unknown, conds_text
from .sglang_audit_wiring import HYBRID, Audit

# The speculative algorithm assumed when none is given: the verify the question is about is an EAGLE verify.
DEFAULT_ALGORITHM = "EAGLE"

EXIT_SAFE, EXIT_RAISES, EXIT_UNREADABLE = 0, 1, 2


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


def _land(audit: Audit, ev: Evaluator, node: Node, steps: list[str], depth: int) -> list[Leaf]:
    head = node.label if node.cls is None or node.label == node.cls.name else f"{node.label} = {node.cls.name}"
    if node.conds:
        head += f" [when {conds_text(node.conds)}]"
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
    for t in audit.forward_targets(node.cls, eff.node, ev):
        for conds, v in t.options:
            kids = list(v.items) if isinstance(v, Seq) else [v]
            decided = ", ".join(f"--{k.replace('_', '-')} {val}" for k, val in t.read.items())
            step = f"{here}: forwards to {t.text}"
            step += "" if isinstance(v, Unknown) else f" = {Hierarchy.describe_value(v)}"
            step += (f" [when {conds_text(conds)}]" if conds else "") + (f" [{decided}]" if decided else "")
            for kid in kids:
                if not isinstance(kid, Child):
                    out.append(Leaf(steps + [step, f"cannot tell what {Hierarchy.describe_value(kid)} is"], None,
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

