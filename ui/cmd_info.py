"""`specscope info TRACE`: what a trace holds (run, steps by mode, acceptance, text, violations)."""

from __future__ import annotations

import argparse
from typing import Any

from .args import conflict


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the `info` subcommand."""
    p = subparsers.add_parser("info", help="summarize a trace file", description=__doc__)
    p.add_argument("trace", metavar="TRACE", help="trace file (.db) written by `specscope run`")
    p.add_argument("--json", action="store_true", help="print the summary as JSON (every request's prompt tail "
                                                       "and output decoded where a tokenizer is known)")
    p.add_argument("--text", action="store_true",
                   help="also print each request's prompt tail and output as text (--json always holds them)")
    p.add_argument("--no-check", action="store_true",
                   help="do not run the invariant catalogue when the trace holds no verdicts for all its steps "
                        "(info runs it on traces of up to 2,000 steps; verdicts that `run` or `check --write` "
                        "stored are used as they are)")
    p.set_defaults(run=run)


def stored_verdicts_cover(reader: Any) -> bool:
    """Whether the catalogue's stored verdicts (the run's live checker, `check --write`, `upgrade`) reach the
    trace's last step: then `info` reads them instead of running the catalogue again."""
    through = reader.checked_through()
    if through is None:
        return False
    last = next(iter(reader.iter_summaries(backward=True)), None)
    return last is None or through >= last.index


def run(args: argparse.Namespace) -> int:
    """Print the summary of `args.trace`."""
    import json
    import sys

    from specscope.tracer.store import TraceReader
    from specscope.tracer.summary import format_summary, format_texts, summarize
    from specscope.tracer.tokens import tokenizer_for

    if args.json and args.text:
        print("specscope: error: " + conflict("--text", "--json", "the JSON holds every request's prompt tail and "
                                              "output text already (requests[].prompt_tail_text, output_text)"),
              file=sys.stderr)
        return 2
    with TraceReader(args.trace) as reader:
        kind, decode = tokenizer_for(reader.run.target_model)
        stored = stored_verdicts_cover(reader)
        d: dict[str, Any] = summarize(reader, decode=decode, tokenizer=kind,
                                      run_checks=not (args.no_check or stored))
        if stored:  # a clean check stores no rows, only how far it got: its verdicts are the (empty) table
            d["violations_source"] = "trace"
        d["checked_through"] = reader.checked_through()
    if args.json:
        sys.stdout.write(json.dumps(d, indent=2, ensure_ascii=False) + "\n")
    else:
        sys.stdout.write(format_summary(d) + ("\n" + format_texts(d) if args.text else ""))
    return 0
