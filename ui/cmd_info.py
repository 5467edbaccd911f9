"""`specscope info TRACE`: what a trace holds (run, steps by mode, acceptance, violations)."""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the `info` subcommand."""
    p = subparsers.add_parser("info", help="summarize a trace file", description=__doc__)
    p.add_argument("trace", metavar="TRACE", help="trace file (.db) written by `specscope run`")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Print the summary of `args.trace`."""
    import json
    import sys

    from specscope.tracer.store import TraceReader
    from specscope.tracer.summary import format_summary, summarize

    with TraceReader(args.trace) as reader:
        d = summarize(reader)
    sys.stdout.write(json.dumps(d, indent=2) + "\n" if args.json else format_summary(d))
    return 0
