"""`specscope check`: run the invariant catalogue over a trace."""

from __future__ import annotations

import argparse
import json
import sys


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `check`."""
    p = subparsers.add_parser("check", help="check a trace against the invariant catalogue",
                              description="Check every step of a trace against the invariants whose violations "
                                          "caused real bugs. Exit 0 clean, 1 on any error, 2 if unreadable.")
    p.add_argument("trace", metavar="TRACE")
    p.add_argument("--json", action="store_true", help="print violations as a JSON list")
    p.add_argument("--list", action="store_true", help="print the invariant catalogue and exit")
    p.add_argument("--max-per-check", type=int, default=5, metavar="N", help="examples shown per invariant")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Check the trace; print grouped violations."""
    from specscope.tracer.checks import BY_ID, CATALOGUE, check_steps
    from specscope.tracer.schema import Severity
    from specscope.tracer.store import TraceReader

    if args.list:
        for inv in CATALOGUE:
            print(f"{inv.check_id:4s} {inv.severity.value:7s} {inv.description}  [{inv.upstream}]")
        return 0
    with TraceReader(args.trace) as reader:
        found = list(check_steps(reader.steps()))
        num_steps = reader.num_steps()
    errors = sum(v.severity == Severity.ERROR for v in found)
    if args.json:
        json.dump([{"id": v.check_id, "severity": v.severity.value, "step": v.step, "request_id": v.request_id,
                    "message": v.message} for v in found], sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 1 if errors else 0
    if not found:
        print(f"{args.trace}: {num_steps} steps, {len(CATALOGUE)} invariants, no violations")
        return 0
    groups: dict[str, list] = {}
    for v in found:
        groups.setdefault(v.check_id, []).append(v)
    print(f"{args.trace}: {num_steps} steps, {len(found)} violations of {len(groups)} invariants "
          f"({errors} errors)")
    for cid, vs in sorted(groups.items(), key=lambda kv: kv[1][0].step):
        inv = BY_ID.get(cid)
        desc = inv.description if inv else ""
        steps = sorted({v.step for v in vs})
        print(f"\n{cid} [{vs[0].severity.value}] {desc}")
        print(f"  {len(vs)} violations in {len(steps)} steps; first at step {steps[0]}")
        for v in vs[: args.max_per_check]:
            print(f"  - {v.message}")
    return 1 if errors else 0
