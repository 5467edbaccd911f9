"""`specscope check`: run the invariant catalogue over a trace, report injected faults, optionally write back."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from .args import integer

if TYPE_CHECKING:
    from specscope.tracer.schema import Violation

SEVERITY_RANK = {"error": 0, "warning": 1}  # errors first where two invariants first fire at the same step


def violation_order(v: Any) -> tuple[int, int, tuple[str, int]]:
    """Step, then severity (errors first), then invariant id in catalogue order (`views.check_key`): the first wrong
    step explains a bug best, and the violations after it are often its consequences (docs/checks.md, "Order of the
    report")."""
    from .views import check_key

    return v.step, SEVERITY_RANK.get(v.severity.value, 2), check_key(v.check_id)



def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `check`."""
    p = subparsers.add_parser("check", help="check a trace against the invariant catalogue",
                              description="Check every step of a trace against the invariants whose violations "
                                          "caused real bugs. Exit 0 clean, 1 on any error, 2 if unreadable.")
    p.add_argument("trace", metavar="TRACE", nargs="?", help="the trace (not needed with --list)")
    p.add_argument("--json", action="store_true",
                   help='print JSON: {"violations": [...], "not_recorded": [{"check", "reason", "steps"}]} (with '
                        "--list, the catalogue)")
    p.add_argument("--list", action="store_true", help="print the invariant catalogue and exit")
    p.add_argument("--max-per-check", **integer(lo=0), default=5, metavar="N",
                   help="examples shown per invariant (default 5; 0 shows counts only)")
    p.add_argument("--write", action="store_true",
                   help="store the violations in the trace (replacing those of an earlier `check --write`), so "
                        "viewers show them")
    p.set_defaults(run=run)


def _error(msg: str) -> int:
    print(f"specscope: error: {msg}", file=sys.stderr)
    return 2


def _emit(text: str, code: int) -> int:
    """Print `text`; a reader that went away (`check T | head`) does not change the exit status."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # Later flushes (at exit) would raise again: point stdout at /dev/null.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return code


def _list(as_json: bool) -> int:
    from specscope.tracer.checks import CATALOGUE

    if as_json:
        rows = [{"id": i.check_id, "severity": i.severity.value, "description": i.description,
                 "upstream": i.upstream, "reads": i.reads} for i in CATALOGUE]
        return _emit(json.dumps(rows, indent=1) + "\n", 0)
    return _emit("".join(f"{i.check_id:4s} {i.severity.value:7s} {i.description}  [{i.upstream}]\n"
                         for i in CATALOGUE), 0)


def fault_lines(reports: list[Any], violations: list[Any]) -> list[str]:
    """One sentence per injected fault: how often it fired and what caught it, or why it never fired."""
    from specscope.tracer.fault_hints import FAULT_HINTS

    lines = []
    for r in reports:
        if r.fired:
            first: dict[str, int] = {}
            for v in violations:
                if v.severity.value == "error" and v.step >= (r.first_step or 0):
                    first.setdefault(v.check_id, v.step)
            caught = ", ".join(f"{k} (step {s})" for k, s in sorted(first.items(), key=lambda kv: kv[1]))
            tail = f"caught by {caught}" if caught else "no invariant caught it"
            times = "once" if r.fired == 1 else f"{r.fired} times"
            lines.append(f"fault {r.fault} fired {times}, first at step {r.first_step}; {tail}")
        else:
            why, try_ = FAULT_HINTS.get(r.fault, ("it never changed a recorded step", "the settings in docs/checks.md"))
            lines.append(f"fault {r.fault} never fired in this run ({why}), try {try_}")
    return lines


def run(args: argparse.Namespace) -> int:
    """Check the trace; print grouped violations and the fault report."""
    if args.list:
        return _list(args.json)
    if not args.trace:
        return _error("check needs a TRACE (or --list)")
    from specscope.tracer import store
    from specscope.tracer.checks import BY_ID, CATALOGUE, Checker
    from specscope.tracer.schema import Severity

    with store.TraceReader(args.trace) as reader:
        checker = Checker.for_trace(reader)
        found = []
        last = -1
        for step in reader.steps():
            found.extend(checker.feed(step))
            last = step.index
        num_steps = reader.num_steps()
        found.sort(key=violation_order)  # stable: one step's rows of one invariant keep the checker's order
        faults = fault_lines(reader.fault_report(), found)
        not_recorded = checker.not_recorded()
    if args.write:
        store.append_violations(args.trace, found, source="check", replace=True)
        store.mark_checked(args.trace, last)
    errors = sum(v.severity == Severity.ERROR for v in found)
    code = 1 if errors else 0
    if args.json:
        rows = [{"id": v.check_id, "severity": v.severity.value, "step": v.step, "request_id": v.request_id,
                 "message": v.message, "array": v.array, "row": v.row, "col": v.col, "found": v.found,
                 "expected": v.expected} for v in found]
        for line in faults:
            print(line, file=sys.stderr)
        unchecked = [{"check": cid, "reason": why, "steps": n} for cid, why, n in not_recorded]
        return _emit(json.dumps({"violations": rows, "not_recorded": unchecked}, indent=1) + "\n", code)
    out = []
    groups: dict[str, list[Violation]] = {}
    for v in found:
        groups.setdefault(v.check_id, []).append(v)
    if not found:
        out.append(f"{args.trace}: {num_steps} steps, {len(CATALOGUE)} invariants, no violations")
    else:
        out.append(f"{args.trace}: {num_steps} steps, {len(found)} violations of {len(groups)} invariants "
                   f"({errors} errors)")
    # What could not be judged: "no violations" says nothing about an invariant whose facts were never recorded.
    out += [f"{cid} not recorded by this backend ({why}) on {n} steps" for cid, why, n in not_recorded]
    if found:
        # Groups in the order of their first violation (`found` is sorted by violation_order).
        for cid, vs in groups.items():
            inv = BY_ID.get(cid)
            steps = sorted({v.step for v in vs})
            out += ["", f"{cid} [{vs[0].severity.value}] {inv.description if inv else ''}",
                    f"  {len(vs)} violations in {len(steps)} steps; first at step {steps[0]}"]
            out += [f"  - {v.message}" for v in vs[: args.max_per_check]]
    if faults:
        out += [""] + faults
    if args.write:
        out.append(f"wrote {len(found)} violations into {args.trace}")
    return _emit("\n".join(out) + "\n", code)
