"""`specscope upgrade OLD.db NEW.db`: rewrite a schema 1 trace as schema 2, then check it (like `check --write`)."""

from __future__ import annotations

import argparse
import os
import sys

from .args import check_writable


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `upgrade`."""
    p = subparsers.add_parser(
        "upgrade", help="rewrite a schema 1 trace as schema 2 (queryable tables for the viewers)",
        description="Rewrite a schema 1 trace as a schema 2 trace: every step, request and violation is copied, "
                    "the queryable tables (spans, per-step requests, fault firings) are built, and the invariant "
                    "catalogue's verdicts are written (source 'check', as `specscope check --write` does). Every "
                    "command reads schema 1 traces as they are; upgrading makes the viewers' queries fast. "
                    "Exit 0 on success, 2 if OLD is unreadable or NEW cannot be written.")  # fmt: skip
    p.add_argument("old", metavar="OLD", help="the schema 1 trace (read only)")
    p.add_argument("new", metavar="NEW", help="the schema 2 trace to write")
    p.add_argument("--overwrite", action="store_true", help="replace NEW if it exists")
    p.add_argument("--no-check", action="store_true", help="do not run the catalogue over the new trace")
    p.set_defaults(run=run)


def upgrade_trace(old: str, new: str, *, overwrite: bool = False, check: bool = True) -> dict[str, int]:
    """Rewrite `old` (schema 1) as `new` (schema 2); returns counts (steps, requests, violations, check_*)."""
    from specscope.tracer.errors import TraceError
    from specscope.tracer.reader import TraceReader
    from specscope.tracer.writer import TraceWriter

    if os.path.exists(new) and os.path.samefile(old, new):
        raise TraceError("OLD and NEW are the same file; write the upgrade to a new file", new)
    counts = {"steps": 0, "requests": 0, "violations": 0}
    with TraceReader(old) as r:
        if r.major >= 2:
            raise TraceError(f"is already schema {r.schema_version}; nothing to upgrade", old)
        w = TraceWriter(new, r.run, overwrite=overwrite, threaded=False)
        w.copy_end(r.end_state())  # a schema-1 trace has no end record: the upgrade then has none either
        try:
            for step in r.steps():
                w.write_step(step)  # violations inside a body keep their source "recorder"
                counts["steps"] += 1
            for rec in r.requests():
                w.write_request(rec)
                counts["requests"] += 1
            # Verdicts appended after the run: copied with their source ("check" ones are redone below).
            for source in sorted(r.violation_sources()):
                if source == "recorder" or (check and source == "check"):
                    continue
                vs = r.violations(source=source)
                w.add_violations(vs, source)
                counts["violations"] += len(vs)
            counts["violations"] += len(r.violations(source="recorder"))
        except BaseException:
            try:
                w.close()
            except TraceError:
                pass
            raise
        w.close()
        _mark_upgraded(new, r.schema_version)
    if check:
        from specscope.tracer.live_check import follow

        lc = follow(new, None)
        counts.update(check_errors=lc.num_errors, check_warnings=lc.num_warnings, checked_through=lc.done)
    return counts


def _mark_upgraded(path: str, old_version: str) -> None:
    """meta `upgraded_from`: the catalogue then knows the facts schema 1 never recorded (e.g. wait edges)."""
    import sqlite3

    from specscope.tracer.errors import TraceError
    from specscope.tracer.writer import connect_rw, settle

    try:
        conn = connect_rw(path)
        try:
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('upgraded_from', ?)", (old_version,))
            settle(conn)
        finally:
            conn.close()
    except sqlite3.Error as e:
        raise TraceError(f"cannot finish the upgrade (SQLite: {e})", path) from None


def run(args: argparse.Namespace) -> int:
    """Upgrade; print one summary line."""
    # The command's own flag names: the writer underneath speaks of its keyword argument (overwrite=True).
    same = os.path.exists(args.new) and os.path.exists(args.old) and os.path.samefile(args.old, args.new)
    problem = None
    if same:
        pass  # upgrade_trace says so
    elif os.path.exists(args.new) and not os.path.isdir(args.new) and not args.overwrite:
        problem = f"{args.new}: already exists (pass --overwrite to replace it)"
    else:
        problem = check_writable(args.new)
    if problem is not None:
        print(f"specscope: error: {problem}", file=sys.stderr)
        return 2
    c = upgrade_trace(args.old, args.new, overwrite=args.overwrite, check=not args.no_check)
    line = (f"{args.old} -> {args.new}: schema 2, {c['steps']} steps, {c['requests']} requests, "
            f"{c['violations']} violations copied")  # fmt: skip
    if "check_errors" in c:
        line += f"; catalogue: {c['check_errors']} errors, {c['check_warnings']} warnings written (source check)"
    print(line)
    return 0
