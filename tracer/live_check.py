"""The streaming checker beside a run's writer: `python -m specscope.tracer.live_check TRACE`.

It follows the trace as it grows (`TraceReader.wait_for_steps`), feeds every committed step to the
catalogue (`checks.Checker.feed`, which keeps the capture/replay state), and writes the verdicts in
batches with source "check" together with meta `checked_through` (one short transaction per batch, so the
writer's commits never wait long for it). It runs at a lower CPU priority than the engine and the writer.

It stops once the run is over: end of its stdin (its parent, `ProcessTraceWriter`, closes it after the
writer closed, or died) and every committed step checked, or the trace closed by its writer. On the way
out it prints one line, `checked THROUGH ERRORS WARNINGS`. Started on a finished trace it checks it whole,
replacing earlier "check" verdicts (what `specscope check --write` does).
"""

from __future__ import annotations

import itertools
import os
import select
import signal
import sqlite3
import sys
import time
from collections.abc import Sequence

from . import tables
from .errors import TraceError
from .reader import TraceReader
from .schema import Severity, Violation
from .writer import connect_rw, settle

SOURCE = "check"
CHUNK = 64  # steps checked per verdict transaction
QUIET_S = 2.0  # after the parent is gone: a trace that has not grown for this long is complete


class LiveChecker:
    """Checks a trace's committed steps and writes the verdicts; `step()` does one batch."""

    def __init__(self, path: str) -> None:
        from .checks import Checker

        self.path = path
        self.reader = TraceReader(path)
        if self.reader.major < 2:
            self.reader.close()
            raise TraceError("is a schema 1 trace; run `specscope upgrade` first", path)
        self.checker = Checker.for_trace(self.reader)
        self.done = -1  # last step index checked
        self.num_errors = 0
        self.num_warnings = 0
        self._conn = connect_rw(path, timeout=60.0)
        # A trace written by an older specscope (schema 2.0) has no `related` column.
        cols = [str(c[1]) for c in self._conn.execute("PRAGMA table_info(violations)")]
        self._insert, self._insert_width = tables.violation_insert(cols)
        self._write([], replace=True)

    def _write(self, found: list[Violation], *, replace: bool = False) -> None:
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            if replace:
                conn.execute("DELETE FROM violations WHERE source = ?", (SOURCE,))
            conn.executemany(self._insert, [tables.violation_row(v, SOURCE)[: self._insert_width] for v in found])
            conn.execute(
                "INSERT INTO meta (key, value) VALUES ('checked_through', ?)"
                " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (str(self.done),),
            )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def step(self) -> int:
        """Check the next batch of committed steps (at most CHUNK); returns how many were checked."""
        # By index, not count: a step lost in flight leaves a gap, and the walk goes on past it.
        last = self.reader.last_index()
        if last is None or last <= self.done:
            return 0
        found: list[Violation] = []
        count = 0
        for st in itertools.islice(self.reader.steps(self.done + 1, last + 1), CHUNK):
            # Violations attached by the recorder are already in the table (source "recorder").
            attached = set(st.violations)
            for v in self.checker.feed(st):
                if v not in attached:
                    found.append(v)
            self.done = st.index
            count += 1
        self.num_errors += sum(v.severity == Severity.ERROR for v in found)
        self.num_warnings += sum(v.severity == Severity.WARNING for v in found)
        self._write(found)
        return count

    def close(self) -> None:
        """Settle a finished trace into one file and release it."""
        try:
            closed = self.reader.is_closed()
            self.reader.close()  # first: leaving WAL mode needs the only connection
            if closed:
                settle(self._conn)
        finally:
            self._conn.close()


def follow(path: str, stdin_fd: int | None) -> LiveChecker:
    """Check `path` until the run is over (see the module docstring); returns the finished checker."""
    lc = LiveChecker(path)
    parent_gone = stdin_fd is None
    quiet_since: float | None = None
    try:
        while True:
            if lc.step():
                quiet_since = None
                continue
            last = lc.reader.last_index()
            if lc.reader.is_closed() and (-1 if last is None else last) <= lc.done:
                break
            if parent_gone:
                now = time.monotonic()
                quiet_since = quiet_since or now
                if now - quiet_since >= QUIET_S:
                    break
                lc.reader.wait_for_steps(lc.done, 0.1)
                continue
            assert stdin_fd is not None, "with no stdin the parent counts as gone from the start"
            r, _, _ = select.select([stdin_fd], [], [], 0.1)
            if r and not os.read(stdin_fd, 4096):
                parent_gone = True
    except BaseException:
        lc.close()
        raise
    lc.close()
    return lc


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the checker process."""
    # Ctrl-C reaches the run's whole process group; the engine side ends the run and then waits for us to finish.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m specscope.tracer.live_check TRACE", file=sys.stderr)
        return 2
    try:
        os.nice(5)  # the engine and the writer come first; the checker catches up when they idle
    except (AttributeError, OSError):
        pass
    try:
        lc = follow(args[0], sys.stdin.fileno() if not sys.stdin.closed else None)
    except TraceError as e:
        print(f"specscope: error: {e}", file=sys.stderr)
        return 2
    except sqlite3.Error as e:
        print(f"specscope: error: {args[0]}: cannot write verdicts (SQLite: {e})", file=sys.stderr)
        return 2
    print(f"checked {lc.done} {lc.num_errors} {lc.num_warnings}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
