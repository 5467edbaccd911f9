"""The audit as text lines and as JSON-ready data: the class table, the registry, the call sites, the plan-stream
variable, and the verdict for a configuration."""

from __future__ import annotations

from .sglang_audit_args import PLAN_ENV
from .sglang_audit_classes import METHOD, Resolution
from .sglang_audit_values import conds_text
from .sglang_audit_verdict import EXIT_SAFE, Verdict
from .sglang_audit_wiring import Audit


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
                when = f" when {conds_text(cand.conds)}" if cand.conds else ""
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
            when = f" when {conds_text(w['when'])}" if w["when"] else ""
            lines.append(f"  worker: {w['algorithm']} → {w['worker'] or '?'}{when}: {what}")
        for lf in verdict.leaves:
            lines.append("  path: " + " → ".join(lf.steps))
        lines.append(f"verdict: {verdict.headline}")
    return lines

