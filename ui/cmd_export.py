"""`specscope export TRACE --perfetto OUT.json[.gz] | --bundle OUT.zip [--steps A:B]`: timelines and bug reports."""

from __future__ import annotations

import argparse
import os
import sys


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `export`."""
    p = subparsers.add_parser(
        "export", help="export a trace: Perfetto timeline, bug-report bundle",
        description="Export steps of a trace (or bundle) as a Perfetto / Chrome Trace Event JSON timeline "
                    "(ui.perfetto.dev opens it) and/or as a self-contained bug-report bundle (.zip) that every "
                    "specscope command opens.")
    p.add_argument("trace", metavar="TRACE", help="trace file (.db) or bundle (.zip)")
    p.add_argument("--perfetto", metavar="OUT.json[.gz]", help="write a Chrome Trace Event JSON file (gzip if .gz)")
    p.add_argument("--bundle", metavar="OUT.zip", help="write a bug-report bundle")
    p.add_argument("--steps", metavar="A:B", help="step indexes A <= i < B (also A:, :B, N; default: all)")
    p.add_argument("--attention", choices=("all", "flagged", "none"), default="all",
                   help="bundle: which recorded attention calls to include (they dominate its size): all, only "
                        "steps the checks flag, or none (default: all)")
    p.add_argument("--overwrite", action="store_true", help="replace existing output files")
    p.set_defaults(run=run)


def _fail(msg: str) -> int:
    print(f"specscope: error: {msg}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    """Write the requested exports; print one line per file."""
    from specscope.tracer.export.bundle import quote_command, write_bundle
    from specscope.tracer.export.perfetto import write_perfetto
    from specscope.tracer.export.steps import parse_steps
    from specscope.tracer.store import TraceReader

    if not args.perfetto and not args.bundle:
        return _fail("export: nothing to write (give --perfetto OUT.json[.gz] and/or --bundle OUT.zip)")
    if args.perfetto and not (args.perfetto.endswith(".json") or args.perfetto.endswith(".json.gz")):
        return _fail(f"--perfetto {args.perfetto}: the file name must end in .json or .json.gz")
    if args.bundle and not args.bundle.endswith(".zip"):
        return _fail(f"--bundle {args.bundle}: the file name must end in .zip")
    for out in (args.perfetto, args.bundle):
        if out and os.path.exists(out) and not args.overwrite:
            return _fail(f"{out}: already exists (pass --overwrite to replace it)")
        if out and not os.path.isdir(os.path.dirname(os.path.abspath(out))):
            return _fail(f"{out}: no such folder")
    try:
        start, stop = parse_steps(args.steps)
    except ValueError as e:
        return _fail(str(e))
    # The reader opens a bundle itself (its trace.db, under the step numbers of the original trace), and knows
    # the .zip's name for the files it writes.
    with TraceReader(args.trace) as reader:
        selected = reader.summaries(start, stop)
        if not selected:
            return _fail(f"{args.trace}: no steps in --steps {args.steps} (it has {reader.steps_text()})")
        if args.perfetto:
            n = write_perfetto(reader, args.perfetto, start, stop)
            print(f"{args.perfetto}: {n} trace events, {len(selected)} steps "
                  f"({os.path.getsize(args.perfetto)} bytes); open it in https://ui.perfetto.dev")
        if args.bundle:
            m = write_bundle(reader, args.bundle, start, stop, trace_path=args.trace,
                             export_command=quote_command(["specscope", *sys.argv[1:]]), attention=args.attention)
            print(f"{args.bundle}: {m['num_steps']} steps ({len(m['captures_added'])} captures added), "
                  f"{len(m['attention_steps'])} with recorded attention, {m['num_violations_bundle_check']} "
                  f"violations; {os.path.getsize(args.bundle)} bytes. A maintainer runs: specscope info / check / "
                  f"replay {os.path.basename(args.bundle)} (see README.md inside)")
    return 0
