"""TraceWriter: appends steps to a trace file from a background thread, one transaction per step."""

from __future__ import annotations

import atexit
import collections
import os
import queue
import sqlite3
import sys
import threading
import time
from collections.abc import Iterable
from typing import Any

from . import codec, tables
from .errors import TraceError
from .schema import RequestRecord, RunInfo, Step, Violation

_BLOB_CACHE_SIZE = 8192  # digests of recent blobs; page tables repeat across nearby steps
_STOP = "stop"
_FLUSH = "flush"


def connect_rw(path: str) -> sqlite3.Connection:
    """A read-write connection with the pragmas every trace writer uses."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
    conn.execute("PRAGMA journal_mode=WAL")
    # NORMAL in WAL mode: a commit survives a process crash (SIGKILL); only an OS crash may lose the tail.
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


class TraceWriter:
    """Writes one trace file; steps are queued and committed by a background thread.

    The arrays of a queued step are encoded later, on the writer thread: do not modify them after
    `write_step` (hand over copies of reused buffers).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        run: RunInfo,
        *,
        queue_size: int = 1024,
        overwrite: bool = False,
    ) -> None:
        self.path = os.fspath(path)
        self._error: BaseException | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._conn = self._create(run, overwrite)
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=max(1, queue_size))
        self._blob_ids: collections.OrderedDict[bytes, int] = collections.OrderedDict()
        self._thread = threading.Thread(target=self._loop, name=f"specscope-writer:{self.path}", daemon=True)
        self._thread.start()
        # The thread is a daemon so a forgotten close() cannot hang interpreter exit; atexit flushes it.
        atexit.register(self._close_at_exit)

    def _create(self, run: RunInfo, overwrite: bool) -> sqlite3.Connection:
        if os.path.isdir(self.path):
            raise TraceError("is a directory, not a trace file", self.path)
        if os.path.lexists(self.path):
            if not overwrite:
                raise TraceError("already exists (pass overwrite=True to replace it)", self.path)
            for p in (self.path, self.path + "-wal", self.path + "-shm"):
                if os.path.lexists(p):
                    os.remove(p)
        try:
            conn = connect_rw(self.path)
            conn.execute("BEGIN")
            # One by one, not executescript(): that would commit outside our transaction.
            for stmt in tables.DDL.split(";"):
                if stmt.strip():
                    conn.execute(stmt)
            conn.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", tables.meta_rows())
            conn.execute("INSERT INTO meta (key, value) VALUES ('created_ns', ?)", (str(time.time_ns()),))
            conn.execute("INSERT INTO run (id, info) VALUES (1, ?)", (tables.dumps(run.to_dict()),))
            conn.execute("COMMIT")
        except (sqlite3.Error, OSError, TypeError, ValueError) as e:
            raise TraceError(f"cannot create the trace ({type(e).__name__}: {e})", self.path) from e
        return conn

    # -- producer side ---------------------------------------------------------------------------

    def write_step(self, step: Step) -> None:
        """Queue a step for writing; blocks while the queue is full (never drops)."""
        if not isinstance(step, Step):
            raise TypeError(f"write_step expects a Step, got {type(step).__name__}")
        self._put(("step", step))

    def write_request(self, rec: RequestRecord) -> None:
        """Queue a request record (inserted, or replacing the record with the same request_id)."""
        if not isinstance(rec, RequestRecord):
            raise TypeError(f"write_request expects a RequestRecord, got {type(rec).__name__}")
        self._put(("request", rec))

    def add_violations(self, violations: Iterable[Violation], source: str = "check") -> None:
        """Queue violations found outside the recorder (e.g. by a checker) for the violations table."""
        self._put(("violations", (list(violations), source)))

    def flush(self) -> None:
        """Wait until everything queued so far is committed; raise TraceError if writing failed."""
        if self._closed:
            self._raise_if_failed()
            return
        done = threading.Event()
        self._put((_FLUSH, done))
        while not done.wait(0.5):
            if not self._thread.is_alive():
                break
        self._raise_if_failed()

    def close(self) -> None:
        """Flush, stop the writer thread and close the file; raise TraceError if writing failed."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        atexit.unregister(self._close_at_exit)
        if self._thread.is_alive():
            self._queue.put((_STOP, None))
            self._thread.join()
        self._raise_if_failed()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _put(self, item: tuple[str, Any]) -> None:
        if self._closed:
            raise TraceError("the trace writer is already closed", self.path)
        self._raise_if_failed()
        self._queue.put(item)

    def _raise_if_failed(self) -> None:
        e = self._error
        if e is None:
            return
        if isinstance(e, TraceError):
            raise e.with_path(self.path)
        raise TraceError(f"writing the trace failed ({type(e).__name__}: {e})", self.path) from e

    def _close_at_exit(self) -> None:
        try:
            self.close()
        except TraceError as e:
            print(f"specscope: warning: {e}", file=sys.stderr)

    # -- writer thread ---------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            kind, payload = self._queue.get()
            try:
                # After a failure keep draining (discarding) so producers blocked on put() wake up.
                if self._error is None:
                    if kind == "step":
                        self._write_step(payload)
                    elif kind == "request":
                        self._transaction(tables.UPSERT_REQUEST, [tables.request_row(payload)])
                    elif kind == "violations":
                        vs, source = payload
                        rows = [tables.violation_row(v, source) for v in vs]
                        self._transaction(tables.INSERT_VIOLATION, rows)
            except BaseException as e:  # noqa: BLE001 - surfaced to the producer on its next call
                self._error = e
            finally:
                if kind == _FLUSH:
                    payload.set()
            if kind == _STOP:
                self._finish()
                return

    def _finish(self) -> None:
        try:
            if self._error is None:
                self._conn.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES ('closed_ns', ?)", (str(time.time_ns()),)
                )
            # A finished trace becomes one self-contained file: readers then need no -wal/-shm beside it
            # (so read-only folders work). If a live reader still holds it, it simply stays in WAL mode.
            try:
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                self._conn.execute("PRAGMA journal_mode=DELETE")
            except sqlite3.OperationalError:
                pass
            self._conn.close()
        except sqlite3.Error as e:
            if self._error is None:
                self._error = e

    def _transaction(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        conn = self._conn
        conn.execute("BEGIN")
        try:
            conn.executemany(sql, rows)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _write_step(self, step: Step) -> None:
        conn = self._conn
        vrows = [tables.violation_row(v, "recorder") for v in step.violations]
        added: list[bytes] = []
        conn.execute("BEGIN")
        try:
            row, body = tables.encode_step(step, lambda values: self._blob_id(values, added))
            conn.execute(tables.INSERT_STEP, row)
            conn.execute("INSERT INTO step_bodies (idx, body) VALUES (?, ?)", (row[0], body))
            if vrows:
                conn.executemany(tables.INSERT_VIOLATION, vrows)
            conn.execute("COMMIT")
        except BaseException as e:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            for d in added:  # those blob rows were rolled back with the step
                self._blob_ids.pop(d, None)
            if isinstance(e, sqlite3.IntegrityError) and "steps.idx" in str(e):
                raise TraceError(f"step index {step.index} was written twice") from e
            raise

    def _blob_id(self, values: Any, added: list[bytes]) -> int:
        d = codec.digest(values)
        cache = self._blob_ids
        bid = cache.get(d)
        if bid is not None:
            cache.move_to_end(d)
            return bid
        hit = self._conn.execute("SELECT id FROM blobs WHERE digest = ?", (d,)).fetchone()
        if hit is not None:
            bid = int(hit[0])
        else:
            sql = "INSERT INTO blobs (digest, data) VALUES (?, ?)"
            cur = self._conn.execute(sql, (d, codec.encode(values)))
            bid = int(cur.lastrowid)  # type: ignore[arg-type]
            added.append(d)
        cache[d] = bid
        if len(cache) > _BLOB_CACHE_SIZE:
            cache.popitem(last=False)
        return bid
