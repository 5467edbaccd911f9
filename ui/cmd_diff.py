"""`specscope diff A B`: where two traces of the same workload first diverge, and the acceptance of each."""

from __future__ import annotations

import argparse
import json
import sys


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `diff`."""
    p = subparsers.add_parser(
        "diff", help="first diverging step of two traces of the same workload",
        description="Pair the steps of two traces of the same workload (e.g. a run with --inject against the "
                    "clean run) and report the first step whose metadata, tokens or acceptance differ, what "
                    "differs there, and the acceptance of each overall. Exit 0 when nothing differs, 1 when "
                    "they diverge, 2 for unusable input.")
    p.add_argument("a", metavar="A", help="trace (.db) or bundle (.zip), e.g. the fault run")
    p.add_argument("b", metavar="B", help="trace (.db) or bundle (.zip), e.g. the clean run")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Diff the two traces."""
    from specscope.tracer.diff import diff_traces, format_report
    from specscope.tracer.export.bundle import open_trace_or_bundle
    from specscope.tracer.store import TraceReader

    with open_trace_or_bundle(args.a) as pa, open_trace_or_bundle(args.b) as pb, \
            TraceReader(pa) as ra, TraceReader(pb) as rb:
        rep = diff_traces(ra, rb)
    rep.a, rep.b = args.a, args.b
    if args.json:
        json.dump(rep.to_dict(), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(format_report(rep))
    differ = rep.first is not None or rep.outputs.get("differing") or rep.a_steps != rep.b_steps
    return 1 if differ else 0
