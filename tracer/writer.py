"""TraceWriter: appends steps to a trace file; every committed step is whole (crash-safe).

Two ways to run it, one encoder:

- `threaded=True` (default, for callers in a process that does other work): one worker thread encodes
  each step (rows, body, new blobs), compresses it and commits. The input queue is bounded, so a slow
  disk blocks `write_step` (backpressure) instead of dropping steps or growing memory.
- `threaded=False` (the writer child process, `process_writer_child.py`): `write_step` encodes on the caller's
  thread and the caller decides when to commit (`commit()`); the child commits whenever its input pipe
  is momentarily empty. The child has no thread of its own: it would be one asynchronous boundary too many,
  every step paying two thread hand-offs and the GIL ping-pong between reader and worker.

Steps that are waiting at the same moment share one transaction (group commit): a commit writes every
dirty page to the WAL, and the `step_requests` rows of one step touch one B-tree leaf per live request,
so committing 64 backlogged steps at once costs little more than committing one. A step is never
half-written, and a crash loses only the steps not committed yet.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from . import codec, tables
from .batch_queue import BatchQueue
from .blob_refs import BlobRefs
from .errors import TraceError
from .schema import END_STATE_KEY, EndState, RequestRecord, RunInfo, Step, Violation

_WAL_AUTOCHECKPOINT_PAGES = 16384  # 64 MiB: fewer checkpoints (each one fsyncs) on long runs
_BATCH = 64  # items the worker takes from the queue per lock round-trip (and at most per transaction)
GROUP_MAX = 256  # steps in one transaction at most (bounds what a crash can lose from a backlog)
DICT_SAMPLES = 256  # bodies the zstd dictionary is trained on (the trace's first steps)
DICT_BYTES = 16384
_STOP = "stop"
_FLUSH = "flush"
_SET_META = "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)"  # a meta row, inserted or replaced
END_STATES_STORED = ("closed", "stopped", "interrupted", "engine_ended", "cuda_error", "error")


def connect_rw(path: str, timeout: float = 30.0) -> sqlite3.Connection:
    """A read-write connection with the pragmas every trace writer uses."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=timeout)
    conn.execute("PRAGMA journal_mode=WAL")
    # NORMAL in WAL mode: a commit survives a process crash (SIGKILL); only an OS crash may lose the tail.
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


@dataclass
class _Op:
    """One unit of a transaction: a step (with its blobs) or a batch of rows for one statement."""

    kind: str  # "step" or "rows"
    step: tables.EncodedStep | None = None
    body: bytes = b""
    blobs: list[tuple[bytes, bytes]] | None = None
    meta: list[tuple[str, str]] | None = None
    sql: str = ""
    rows: list[tuple[Any, ...]] | None = None


class TraceWriter:
    """Writes one trace file (schema 2).

    The arrays of a queued step are encoded later (threaded mode): do not modify them after `write_step`
    (hand over copies of reused buffers).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        run: RunInfo,
        *,
        queue_size: int = 1024,
        overwrite: bool = False,
        threaded: bool = True,
    ) -> None:
        self.path = os.fspath(path)
        self._error: BaseException | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._conn = self._create(run, overwrite)
        self._blobs = BlobRefs()  # which blob each large array refers to (page tables repeat and are delta-coded)
        self._last_index: int | None = None
        self._bodies = tables.BodyCompressor()
        self._samples: list[bytes] | None = []  # containers for the dictionary; None once trained or given up
        self._max_span_ns = 0
        self._dict_rows: list[tuple[int, bytes]] | None = None
        self._pending: list[_Op] = []  # sync mode: encoded, not yet committed
        # How the run ended, stored at close (`set_end` / `copy_end`; a close told nothing records "closed").
        self._end: EndState | None = None
        self._end_step_own = True  # the record's `step` is this writer's last committed step
        self._threaded = threaded
        self._thread: threading.Thread | None = None
        if threaded:
            self._queue: BatchQueue[tuple[str, Any]] = BatchQueue(queue_size)
            # A daemon thread so a forgotten close() cannot hang interpreter exit; atexit flushes it.
            name = f"specscope-writer:{os.path.basename(self.path)}"
            self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
            self._thread.start()
        atexit.register(self._close_at_exit)

    def _create(self, run: RunInfo, overwrite: bool) -> sqlite3.Connection:
        if os.path.isdir(self.path):
            raise TraceError("is a directory, not a trace file", self.path)
        if os.path.lexists(self.path):
            if not overwrite:
                raise TraceError("already exists (pass overwrite=True to replace it)", self.path)
            for p in (self.path, self.path + "-wal", self.path + "-shm", self.path + "-journal"):
                if os.path.lexists(p):
                    os.remove(p)
        conn = None
        try:
            conn = connect_rw(self.path)
            conn.execute(f"PRAGMA wal_autocheckpoint={_WAL_AUTOCHECKPOINT_PAGES}")
            conn.execute("PRAGMA cache_size=-65536")  # 64 MiB: the live requests' step_requests leaves stay hot
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
            # Leave nothing behind: a half-made file would block the next attempt ("already exists").
            if conn is not None:
                conn.close()
            for p in (self.path, self.path + "-wal", self.path + "-shm"):
                if os.path.lexists(p):
                    os.remove(p)
            raise TraceError(f"cannot create the trace ({type(e).__name__}: {e})", self.path) from e
        return conn

    # -- producer side ---------------------------------------------------------------------------

    def write_step(self, step: Step) -> None:
        """Queue a step for writing; blocks while the queue is full (never drops)."""
        if not isinstance(step, Step):
            raise TypeError(f"write_step expects a Step, got {type(step).__name__}")
        self._put(("step", step))

    def write_parts(self, parts: tables.StepParts) -> None:
        """Queue a step given as columns (the writer process's fast path, see `tables.StepParts`)."""
        self._put(("parts", parts))

    def write_columns(self, cols: tables.StepColumns) -> None:
        """Queue a step given as numpy columns (what the writer process decodes its input frames into)."""
        self._put(("columns", cols))

    def write_request(self, rec: RequestRecord) -> None:
        """Queue a request record (inserted, or replacing the record with the same request_id)."""
        if not isinstance(rec, RequestRecord):
            raise TypeError(f"write_request expects a RequestRecord, got {type(rec).__name__}")
        self._put(("request", rec))

    def write_meta(self, key: str, value: str) -> None:
        """Queue a `meta` row (inserted, or replacing the value of `key`): run-level facts learnt while recording."""
        self._put(("meta", (str(key), str(value))))

    def add_violations(self, violations: Iterable[Violation], source: str = "check") -> None:
        """Queue violations found outside the recorder (e.g. by a checker) for the violations table."""
        self._put(("violations", (list(violations), source)))

    def set_end(self, state: str, *, lost_in_flight: int | None, detail: str = "",
                error_step: int | None = None) -> None:
        """Say how the run ended; stored at close as `meta.end_state`, its `step` the last step this writer committed
        (the one that knows it). `state` is one of `schema.END_STATES` that a writer stores."""
        if state not in END_STATES_STORED:
            raise ValueError(f"unknown end state {state!r} (one of {', '.join(END_STATES_STORED)})")
        with self._lock:
            self._end = EndState(state, None, lost_in_flight, detail, error_step)
            self._end_step_own = True

    def copy_end(self, end: EndState) -> None:
        """Store `end` as it is at close (its step numbers included): a copy of a trace (a bundle, an upgrade) says
        how the run it copies ended. A record-less `end` (an older trace) leaves the copy without one too."""
        with self._lock:
            self._end = end
            self._end_step_own = False

    def commit(self) -> None:
        """Sync mode: commit everything written so far (threaded mode commits on its own)."""
        if not self._threaded:
            self._commit_pending()
            self._raise_if_failed()

    def flush(self) -> None:
        """Wait until everything queued so far is committed; raise TraceError if writing failed."""
        if self._closed:
            self._raise_if_failed()
            return
        if not self._threaded:
            self.commit()
            return
        done = threading.Event()
        self._put((_FLUSH, done))
        while not done.wait(0.5):
            if self._thread is None or not self._thread.is_alive():
                break
        self._raise_if_failed()

    def close(self) -> None:
        """Flush, stop the writer thread and close the file; raise TraceError if writing failed."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        atexit.unregister(self._close_at_exit)
        if self._thread is not None:
            if self._thread.is_alive():
                self._queue.put((_STOP, None))
                self._thread.join()
        else:
            self._commit_pending()
            self._finish()
        self._raise_if_failed()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _put(self, item: tuple[str, Any]) -> None:
        if self._closed:
            raise TraceError("the trace writer is already closed", self.path)
        self._raise_if_failed()
        if self._threaded:
            self._queue.put(item)
            return
        try:
            self._pending.append(self._op(*item))
        except BaseException as e:  # noqa: BLE001 - what came before still commits, then the error surfaces
            self._commit_pending()
            self._fail(e)
            self._raise_if_failed()
        if len(self._pending) >= GROUP_MAX:
            self._commit_pending()
            self._raise_if_failed()

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

    # -- worker thread ---------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            batch = self._queue.get_batch(_BATCH)
            for kind, payload in batch:
                # After a failure keep draining (discarding) so producers blocked on put() wake up.
                if self._error is None and kind not in (_FLUSH, _STOP):
                    try:
                        self._pending.append(self._op(kind, payload))
                    except BaseException as e:  # noqa: BLE001 - surfaced to the producer on its next call
                        self._commit_pending()
                        self._fail(e)
                if kind in (_FLUSH, _STOP):
                    self._commit_pending()
                if kind == _FLUSH:
                    payload.set()
                elif kind == _STOP:
                    self._finish()
                    return
            self._commit_pending()

    # -- encoding --------------------------------------------------------------------------------

    def _op(self, kind: str, payload: Any) -> _Op:
        if kind == "columns":
            return self._step_op(payload)
        if kind == "step":
            return self._step_op(tables.columns_from_parts(tables.parts_from_step(payload)))
        if kind == "parts":
            return self._step_op(tables.columns_from_parts(payload))
        if kind == "request":
            return _Op("rows", sql=tables.UPSERT_REQUEST, rows=[tables.request_row(payload)])
        if kind == "meta":
            return _Op("rows", sql=_SET_META, rows=[payload])
        if kind == "violations":
            vs, source = payload
            return _Op("rows", sql=tables.INSERT_VIOLATION, rows=[tables.violation_row(v, source) for v in vs])
        raise ValueError(f"unknown writer item {kind!r}")

    def _step_op(self, cols: tables.StepColumns) -> _Op:
        index = int(cols.header["index"])
        # Readers count steps incrementally (by index), so indexes must only grow.
        if self._last_index is not None and index <= self._last_index:
            if index == self._last_index:
                raise TraceError(f"step index {index} was written twice")
            raise TraceError(f"step index {index} was written after step {self._last_index} (indexes must grow)")
        new_blobs: list[tuple[bytes, codec.Pending]] = []
        enc = tables.encode_columns(cols, lambda name, values: self._blobs.ref(name, values, new_blobs))
        self._last_index = index
        meta: list[tuple[str, str]] = []
        if self._samples is not None:
            self._samples.append(enc.container)
            if len(self._samples) >= DICT_SAMPLES:
                d = tables.train_dictionary(self._samples, DICT_BYTES)
                self._samples = None
                if d is not None:
                    # Stored in the same transaction as the first body that needs it.
                    self._dict_rows = [(d.dict_id(), d.as_bytes())]
                    self._bodies = tables.BodyCompressor(d)
        if enc.max_span_ns > self._max_span_ns:
            self._max_span_ns = enc.max_span_ns
            meta.append(("max_span_ns", str(enc.max_span_ns)))
        body = self._bodies.compress(enc.container)
        op = _Op("step", step=enc, body=body, blobs=[(d, p.finish()) for d, p in new_blobs], meta=meta)
        if self._dict_rows:
            op.rows, self._dict_rows = self._dict_rows, None
        return op

    def _fail(self, e: BaseException) -> None:
        if self._error is None:
            self._error = e

    # -- SQLite ------------------------------------------------------------------------------------

    def _finish(self) -> None:
        try:
            if self._error is None:
                rows = [("closed_ns", str(time.time_ns()))]
                end = self._end_record()
                if end is not None:
                    rows.append((END_STATE_KEY, json.dumps(end)))
                # One transaction: a file is either closed with its end record or neither.
                self._conn.execute("BEGIN")
                self._conn.executemany(_SET_META, rows)
                self._conn.execute("COMMIT")
            settle(self._conn)
            self._conn.close()
        except sqlite3.Error as e:
            self._fail(e)

    def _end_record(self) -> dict[str, Any] | None:
        """`meta.end_state`'s object for this close (None: a copied trace that had none)."""
        end = self._end
        if end is None:  # nobody said how the run ended: the writer was closed on purpose
            return EndState("closed", self._last_index, None).record()
        if not self._end_step_own:
            return end.record() if end.recorded else None
        return dataclasses.replace(end, step=self._last_index).record()

    def _commit_pending(self) -> None:
        ops, self._pending = self._pending, []
        if not ops or self._error is not None:
            return
        try:
            self._transaction(ops)
        except BaseException:  # noqa: BLE001 - one bad op must not cost the good ones their commit
            for op in ops:
                try:
                    self._transaction([op])
                except BaseException as e:  # noqa: BLE001 - surfaced to the producer on its next call
                    self._fail(e)
                    return

    def _transaction(self, ops: list[_Op]) -> None:
        conn = self._conn
        conn.execute("BEGIN")
        try:
            rows = _StepRows()
            first: dict[int, int] = {}  # request id -> first / last step in this transaction
            last: dict[int, int] = {}
            for op in ops:
                if op.kind == "step":
                    rows.add(op)
                    assert op.step is not None, "a step op carries its step"
                    last.update(dict.fromkeys(op.step.request_ids, op.step.index))
                else:
                    rows.insert(conn)  # other rows go in after the steps before them, as they were queued
                    conn.executemany(op.sql, op.rows or [])
            rows.insert(conn)
            if last:
                for op in reversed(ops):
                    if op.kind == "step":
                        assert op.step is not None, "a step op carries its step"
                        first.update(dict.fromkeys(op.step.request_ids, op.step.index))
                # One row per request per transaction, not per step: a backlog of 64 steps costs ~100 upserts.
                conn.executemany(tables.UPSERT_REQUEST_LIFE, [(r, first[r], b) for r, b in last.items()])
            conn.execute("COMMIT")
        except BaseException as e:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(e, sqlite3.IntegrityError) and "steps.idx" in str(e):
                raise TraceError(f"step index {ops[0].step.index if ops[0].step else '?'} was written twice") from e
            raise


class _StepRows:
    """The rows of a run of steps, by statement: one executemany per table and transaction, not ~8 statements
    per step (each statement costs a few microseconds of Python and SQLite set-up on its own)."""

    SQL = (
        "INSERT OR IGNORE INTO zdicts (id, data) VALUES (?, ?)",
        "INSERT OR IGNORE INTO blobs (digest, data) VALUES (?, ?)",
        tables.INSERT_STEP,
        "INSERT INTO step_bodies (idx, body) VALUES (?, ?)",
        tables.INSERT_STEP_REQUEST,
        tables.INSERT_SPAN,
        tables.INSERT_FAULT,
        tables.INSERT_VIOLATION,
        _SET_META,
    )

    def __init__(self) -> None:
        self.rows: list[list[tuple[Any, ...]]] = [[] for _ in self.SQL]

    def add(self, op: _Op) -> None:
        """Queue one step's rows."""
        e = op.step
        assert e is not None
        zd, bl, st, bo, rq, sp, fa, vi, me = self.rows
        if op.rows:  # the zstd dictionary this body is the first to use
            zd.extend(op.rows)
        if op.blobs:
            bl.extend(op.blobs)
        st.append(e.row)
        bo.append((e.index, op.body))
        if e.request_row is not None:
            rq.append(e.request_row)
        sp.extend(e.span_rows)
        fa.extend(e.fault_rows)
        if e.violations:
            vi.extend(tables.violation_dict_row(v, "recorder") for v in e.violations)
        if op.meta:
            me.extend(op.meta)

    def insert(self, conn: sqlite3.Connection) -> None:
        """Insert what was queued (in table order: a step's rows are only visible at COMMIT anyway)."""
        for sql, rows in zip(self.SQL, self.rows, strict=True):
            if rows:
                conn.executemany(sql, rows)
                rows.clear()


def settle(conn: sqlite3.Connection) -> None:
    """Make a finished trace one self-contained file (no -wal/-shm needed, so read-only folders work).

    Never waits for live readers: a TUI that keeps the file open simply leaves it in WAL mode."""
    try:
        conn.execute("PRAGMA busy_timeout=0")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("PRAGMA journal_mode=DELETE")
    except sqlite3.OperationalError:
        pass
