"""`specscope tui`: the terminal viewer — a trace, a trace another process writes (--follow), or a live run."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import TYPE_CHECKING

from .args import add_step, integer
from .cmd_run import add_run_arguments

if TYPE_CHECKING:
    from specscope.ui.tui.live import Breakpoints

# Run flags the live TUI sets itself (or that make no sense for a live run).
_OWN_RUN_FLAGS = {"output", "quiet", "list_faults", "no_trace", "help"}


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `tui`."""
    p = subparsers.add_parser(
        "tui", help="step through a trace in the terminal, follow one, or drive a live run (--live)",
        description="Browse a trace step by step: step list, streams, step detail, requests, page-table grid, "
                    "violations, draft chains and acceptance. --follow follows a trace another process writes; "
                    "--live starts `specscope run` with the given run options and lets you pause, single-step "
                    "and break on violations or conditions. Keys: ? in the TUI.")
    p.add_argument("trace", nargs="?", metavar="TRACE", help="trace file (.db) to open")
    p.add_argument("--follow", action="store_true", help="follow TRACE while another process writes it")
    p.add_argument("--live", action="store_true",
                   help="start a run with the run options below and drive it (its trace: -o, or a new file)")
    add_step(p, "open at step N")
    g = p.add_argument_group("live breakpoints")
    g.add_argument("--break-on-violation", action=argparse.BooleanOptionalAction, default=True,
                   help="pause at the first step with a violation (exact: the run waits for the checker)")
    g.add_argument("--break-step", **integer(lo=0), default=None, metavar="N", help="pause after step N")
    g.add_argument("--break-if", default=None, metavar="COND",
                   help="pause at a step where COND holds, e.g. 'mode == TARGET_VERIFY and bs != prev.bs'")
    g.add_argument("--paused", action="store_true", help="pause after the first step")
    add_run_arguments(p)
    p.set_defaults(run=run)


def run_argv(args: argparse.Namespace) -> list[str]:
    """The `specscope run` flags that differ from their defaults, rebuilt from parsed `args`."""
    ref = argparse.ArgumentParser(add_help=False)
    add_run_arguments(ref)
    out: list[str] = []
    for a in ref._actions:
        if a.dest in _OWN_RUN_FLAGS or not a.option_strings:
            continue
        v = getattr(args, a.dest, a.default)
        if v == a.default:
            continue
        flag = max(a.option_strings, key=len)
        if isinstance(a, argparse.BooleanOptionalAction):
            flag = a.option_strings[0]  # --x (its twin is --no-x)
            out.append(flag if v else "--no-" + flag[2:])
        elif a.nargs == 0:  # store_true
            out.append(flag)
        elif isinstance(v, list):
            for item in v:
                out += [flag, str(item)]
        elif isinstance(v, tuple):
            out += [flag, ",".join(str(x) for x in v)]
        else:
            out += [flag, str(v)]
    return out


def _error(msg: str) -> int:
    print(f"specscope: error: {' '.join(msg.split())}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    """Open the TUI."""
    try:
        import textual  # noqa: F401
    except ImportError:
        return _error("the TUI needs textual: pip install 'specscope[tui]'")
    if args.live and args.trace:
        return _error("--live starts its own run; name its trace with -o, not as TRACE")
    if not args.live and not args.trace:
        return _error("name a TRACE to open (or --live [run options] to start a run)")
    if args.live:
        return run_live(args)
    from specscope.tracer.store import TraceReader

    with TraceReader(args.trace) as r:  # a bad file fails here with its one sentence (exit 2)
        closed = r.is_closed()
        # By index, not position: a bundle keeps the original run's (sparse) step numbers; an empty live trace
        # may still be asked to open at its first step.
        missing = args.step is not None and not r.has_step(args.step) and not (r.num_steps() == 0 and args.step == 0)
        where = r.steps_text()
    if missing:
        return _error(f"{args.trace}: has no step {args.step} ({where})")
    from specscope.ui.tui.app import SpecscopeApp
    from specscope.ui.tui.idle_gc import tuned_gc

    with tuned_gc() as collector:  # the process's collector settings, for as long as the viewer runs
        app = SpecscopeApp(args.trace, follow=True if args.follow else (None if not closed else False),
                           start=args.step, collector=collector)
        app.run()
    return 0


def live_breakpoints(args: argparse.Namespace) -> Breakpoints:
    """Breakpoints from the flags (a bad condition is a ConditionError, a ValueError)."""
    from specscope.tracer.condition import parse_condition
    from specscope.ui.tui.live import Breakpoints

    cond = None if not args.break_if else parse_condition(args.break_if)
    return Breakpoints(on_violation=args.break_on_violation, step=args.break_step, condition=cond)


def run_live(args: argparse.Namespace) -> int:
    """Start the run as a child, then the TUI over its trace; quitting stops the run cleanly."""
    if args.no_trace:
        return _error("--live needs a trace (drop --no-trace)")
    from specscope.tracer.condition import ConditionError

    try:
        breaks = live_breakpoints(args)
    except ConditionError as e:
        return _error(f"--break-if: {e}")
    trace = args.output or time.strftime("specscope-live-%Y%m%d-%H%M%S.db")
    if os.path.exists(trace) and not args.overwrite:
        return _error(f"{trace} already exists (pass --overwrite to replace it)")
    return launch_live(run_argv(args), trace, breaks, start_paused=args.paused)


def launch_live(argv: list[str], trace: str, breaks: Breakpoints, start_paused: bool = False) -> int:
    """Start `specscope run ARGV -o TRACE --control ...` and the live TUI over it; also used by `demo`."""
    from specscope.ui.tui.app import SpecscopeApp
    from specscope.ui.tui.idle_gc import tuned_gc
    from specscope.ui.tui.live import LiveController, LiveError

    ctl = LiveController(argv, trace, breaks, start_paused=start_paused)
    print(f"specscope: starting the run (trace {trace})…", file=sys.stderr)
    try:
        ctl.launch()
    except LiveError as e:
        ctl.shutdown(5)
        return _error(str(e))
    try:
        with tuned_gc() as collector:
            SpecscopeApp(trace, controller=ctl, follow=True, collector=collector).run()
    finally:
        ctl.shutdown()
    rc = ctl.returncode()
    print(f"trace         {trace}\nnext: specscope tui {trace}    specscope check {trace}", file=sys.stderr)
    return 0 if rc in (0, None) else 2
