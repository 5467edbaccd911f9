"""`specscope export TRACE --perfetto OUT.json[.gz] | --bundle OUT.zip [--steps A:B]`: timelines and bug reports."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

from .args import check_writable


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `export`."""
    p = subparsers.add_parser(
        "export", help="export a trace: Perfetto timeline, bug-report bundle",
        description="Export steps of a trace (or bundle) as a Perfetto / Chrome Trace Event JSON timeline "
                    "(ui.perfetto.dev opens it) and/or as a self-contained bug-report bundle (.zip) that every "
                    "specscope command opens.")
    p.add_argument("trace", metavar="TRACE", help="trace file (.db) or bundle (.zip)")
    p.add_argument("--perfetto", metavar="OUT.json[.gz]", help="write a Chrome Trace Event JSON file (gzip if .gz)")
    p.add_argument("--bundle", metavar="OUT.zip", help="write a bug-report bundle")
    p.add_argument("--steps", metavar="A:B", help="step indexes A <= i < B (also A:, :B, N; default: all; "
                                                  "--step N is accepted for one step)")
    # One step in the spelling of the commands that take one (replay, tui): the same as --steps N.
    p.add_argument("--step", dest="steps", metavar="N", help=argparse.SUPPRESS)
    p.add_argument("--attention", choices=("all", "flagged", "none"), default="all",
                   help="bundle: which recorded attention calls to include (they dominate its size): all, only "
                        "steps the checks flag, or none (default: all)")
    p.add_argument("--overwrite", action="store_true", help="replace existing output files")
    p.add_argument("--json", action="store_true",
                   help="print what was written as JSON (each file's path, kind, size in bytes and steps)")
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
        problem = check_writable(out) if out else None  # before the trace is read: /proc, a read-only mount
        if problem is not None:
            return _fail(problem)
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
        files: list[dict[str, Any]] = []
        current = args.perfetto or args.bundle
        try:
            if args.perfetto:
                with _staged(args.perfetto) as tmp:
                    n = write_perfetto(reader, tmp, start, stop)
                size = os.path.getsize(args.perfetto)
                files.append({"kind": "perfetto", "path": args.perfetto, "bytes": size, "steps": len(selected),
                              "events": n})
                if not args.json:
                    print(f"{args.perfetto}: {n} trace events, {len(selected)} steps ({size} bytes); open it in "
                          "https://ui.perfetto.dev")
            if args.bundle:
                current = args.bundle
                with _staged(args.bundle) as tmp:
                    m = write_bundle(reader, tmp, start, stop, trace_path=args.trace,
                                     export_command=quote_command(["specscope", *sys.argv[1:]]),
                                     attention=args.attention)
                size = os.path.getsize(args.bundle)
                files.append({"kind": "bundle", "path": args.bundle, "bytes": size, "steps": m["num_steps"],
                              "captures_added": len(m["captures_added"]),
                              "attention_steps": len(m["attention_steps"]),
                              "violations": m["num_violations_bundle_check"]})
                if not args.json:
                    print(f"{args.bundle}: {m['num_steps']} steps ({len(m['captures_added'])} captures added), "
                          f"{len(m['attention_steps'])} with recorded attention, {m['num_violations_bundle_check']} "
                          f"violations; {size} bytes. A maintainer runs: specscope info / check / "
                          f"replay {os.path.basename(args.bundle)} (see README.md inside)")
        except OSError as e:  # a full disk, a folder removed meanwhile: name the output, never a temporary file
            return _fail(f"cannot write {current}: {e.strerror or e}")
    if args.json:
        print(json.dumps({"trace": args.trace, "steps": args.steps, "files": files}, indent=1))
    return 0


@contextlib.contextmanager
def _staged(out: str) -> Iterator[str]:
    """A path to write `out` to in a private folder beside it, moved onto `out` when the block succeeds; the folder
    goes whatever happens, so a failed or interrupted export leaves no partial or temporary file behind."""
    folder = tempfile.mkdtemp(dir=os.path.dirname(os.path.abspath(out)), prefix=".specscope-export-")
    try:
        tmp = os.path.join(folder, os.path.basename(out))  # the writers name the file in what they write
        yield tmp
        os.replace(tmp, out)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
