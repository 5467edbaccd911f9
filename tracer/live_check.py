"""The streaming checker beside a run's writer: `python -m specscope.tracer.live_check TRACE`.

It follows the trace as it grows (`TraceReader.wait_for_steps`), feeds every committed step to the
catalogue (`checks.Checker.feed`, which keeps the capture/replay state), and writes the verdicts in
batches with source "check" together with meta `checked_through` (one short transaction per batch, so the
writer's commits never wait long for it). It runs at a lower CPU priority than the engine and the writer.

It stops once the run is over: end of its stdin (its parent closes it after the writer closed, or died) and
every committed step checked, or the trace closed by its writer. On the way out it prints one line,
`checked THROUGH ERRORS WARNINGS`. Started on a finished trace it checks it whole, replacing earlier "check"
verdicts (what `specscope check --write` does).

`LiveCheck` is the parent's side: whoever runs the recording (`backend/session.py`) starts it once the writer has
created the trace and finishes it once the writer has closed; the writer itself only writes.
"""

from __future__ import annotations

import itertools
import os
import select
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass

from . import tables
from .child_process import StatusLines, death, pipe
from .errors import TraceError
from .reader import TraceReader
from .schema import Severity, Violation
from .writer import connect_rw, settle

SOURCE = "check"
CHUNK = 64  # steps checked per verdict transaction
QUIET_S = 2.0  # after the parent is gone: a trace that has not grown for this long is complete
CHECK_TIMEOUT_S = 900.0  # the checker may lag a fast run; it gets this long after the writer closed


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


@dataclass(frozen=True)
class CheckResult:
    """What the live checker reported when it finished."""

    checked_through: int  # last step index checked (-1: none)
    num_errors: int
    num_warnings: int


class LiveCheck:
    """The live checker of one trace, as a child process beside the run that writes it.

    Start it once the trace exists (its writer has created it: the checker opens it at once); `finish()` it once
    the writer has closed, which waits until the last committed step is checked and keeps the summary in
    `result`."""

    def __init__(self, path: str | os.PathLike[str], *, timeout: float = CHECK_TIMEOUT_S) -> None:
        self.path = os.fspath(path)
        self.timeout = timeout
        self.result: CheckResult | None = None
        self._err = tempfile.TemporaryFile()
        # A session of its own: a terminal's Ctrl-C must not reach it before it can ignore SIGINT (the engine
        # ends the run and then waits for its last verdicts); it still exits when our pipe closes.
        self._proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            [sys.executable, "-m", "specscope.tracer.live_check", self.path], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._err, start_new_session=True)

    def finish(self) -> None:
        """Tell the checker the run is over and wait for its last verdicts (`result`); TraceError if it failed or
        took longer than `timeout`. Call it after the writer closed; a second call does nothing."""
        proc = self._proc
        if proc is None:
            return
        self._proc = None
        try:
            pipe(proc.stdin).close()
        except OSError:
            pass
        lines = StatusLines(proc)
        last = ""
        try:
            while True:
                line = lines.readline(self.timeout)
                if line is None:
                    break
                last = line
        except TimeoutError:
            proc.kill()
            proc.wait()
            raise TraceError(f"the trace checker did not finish within {self.timeout:.0f} s after the run",
                             self.path) from None
        rc = proc.wait()
        parts = last.split()
        if rc == 0 and len(parts) == 4 and parts[0] == "checked":
            self.result = CheckResult(int(parts[1]), int(parts[2]), int(parts[3]))
            return
        raise TraceError(death(proc, self._err, "the trace checker"), self.path)

    def abort(self) -> None:
        """Tell the checker the run is over without waiting (it checks what was committed, then exits)."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            try:
                pipe(proc.stdin).close()
            except OSError:
                pass


if __name__ == "__main__":
    sys.exit(main())
