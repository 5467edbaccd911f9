"""`specscope demo`: run the embedded default (tiny target + draft, speculative decoding) with no arguments."""

from __future__ import annotations

import argparse
import os
import sys
import time

from .cmd_run import DefaultsHelpFormatter, add_json_argument, add_run_arguments


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `demo`."""
    p = subparsers.add_parser("demo", help="run the embedded tiny models and record a trace (no arguments needed)",
                              description="Run the embedded byte-level target and draft models through the "
                                          "instrumented backend, record a trace, and check it.",
                              formatter_class=DefaultsHelpFormatter)
    add_run_arguments(p, default_output="specscope-demo-<time>.db")
    add_json_argument(p)
    p.add_argument("--no-tui", action="store_true",
                   help="print the summary instead of opening the live TUI (always so when stdout is not a terminal, "
                        "and with --json)")
    p.set_defaults(run=run)


def _wants_tui(args: argparse.Namespace) -> bool:
    """The live TUI opens when both ends are a terminal, textual is installed, and nothing says otherwise."""
    if args.no_tui or args.json or args.no_trace or args.list_faults:
        return False
    if not (sys.stdout.isatty() and sys.stdin.isatty()):
        return False
    try:
        import textual  # noqa: F401
    except ImportError:
        return False
    return True


def run(args: argparse.Namespace) -> int:
    """Run, then check the trace and say what to do next."""
    from .cmd_run import run as run_engine
    from .cmd_run import trace_verdicts

    if not args.output and not args.no_trace:
        args.output = time.strftime("specscope-demo-%Y%m%d-%H%M%S.db")
    if _wants_tui(args):
        from specscope.ui.tui.live import Breakpoints

        from .cmd_tui import launch_live, run_argv

        # Paused at its first step: the tiny models finish in seconds, before a newcomer could try the live keys.
        return launch_live(run_argv(args), args.output, Breakpoints(on_violation=True), start_paused=True)
    rc = run_engine(args)
    if rc != 0 or args.no_trace or not os.path.exists(args.output):
        return rc
    verdicts = trace_verdicts(args.output)  # the run's live checker wrote its verdicts into the trace
    counts, errors = verdicts["by_id"], verdicts["errors"]
    print(f"\nnext: specscope info {args.output}    specscope check {args.output}", file=sys.stderr)
    if errors:
        ids = ", ".join(f"{k}={n}" for k, n in counts.items())
        print(f"specscope: the checks found {errors} errors ({ids}): see specscope check {args.output}",
              file=sys.stderr)
        return 1
    return 0
