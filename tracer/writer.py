"""TraceWriter: appends steps to a trace file from a background thread, one transaction per step.

One worker thread encodes each step (rows, body, new blobs), compresses it and commits it in its own
transaction. A second thread splitting encoding from committing measured no faster: the encoding is
Python that holds the GIL, so the committer starved waiting for it, and the hand-offs cost more CPU
than the overlap saved. The input queue is bounded, so a slow disk blocks `write_step`
(backpressure) instead of dropping steps or growing memory.
"""

from __future__ import annotations

import atexit
import collections
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Iterable
from typing import Any

import numpy as np

from . import codec, tables
from .batch_queue import BatchQueue
from .errors import TraceError
from .schema import RequestRecord, RunInfo, Step, Violation

_SEEN_DIGESTS = 8192  # blobs the encoder knows are stored; page tables repeat across nearby steps
# A changed page table is compressed against the last stand-alone version of the same array (a "key"),
# and every KEY_INTERVAL-th version is a new key. Bases are always keys, so a random read decodes at most
# one base per array, and a damaged key spoils at most KEY_INTERVAL versions.
KEY_INTERVAL = 16
_WAL_AUTOCHECKPOINT_PAGES = 16384  # 64 MiB: fewer checkpoints (each one fsyncs) on long runs
_BATCH = 64  # items the worker takes from the queue per lock round-trip
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
    """Writes one trace file; steps are queued and committed by background threads.

    The arrays of a queued step are encoded later, on the encoder thread: do not modify them after
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
        self._queue: BatchQueue[tuple[str, Any]] = BatchQueue(queue_size)
        self._seen: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self._last: dict[str, tuple[np.ndarray, bytes]] = {}  # array name -> last values and digest
        self._keys: dict[str, tuple[codec.Base, int]] = {}  # array name -> current key, versions based on it
        self._last_index: int | None = None
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

    # -- worker thread ---------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            for kind, payload in self._queue.get_batch(_BATCH):
                try:
                    # After a failure keep draining (discarding) so producers blocked on put() wake up.
                    if self._error is None:
                        if kind == "step":
                            self._commit_step(*self._compress(self._encode_step(payload)))
                        elif kind == "request":
                            self._transaction(tables.UPSERT_REQUEST, [tables.request_row(payload)])
                        elif kind == "violations":
                            vs, source = payload
                            self._transaction(tables.INSERT_VIOLATION, [tables.violation_row(v, source) for v in vs])
                except BaseException as e:  # noqa: BLE001 - surfaced to the producer on its next call
                    self._fail(e)
                if kind == _FLUSH:
                    payload.set()
                elif kind == _STOP:
                    self._finish()
                    return

    def _encode_step(self, step: Step) -> tuple[Any, ...]:
        # Readers count steps incrementally (by index), so indexes must only grow.
        if self._last_index is not None and step.index <= self._last_index:
            if step.index == self._last_index:
                raise TraceError(f"step index {step.index} was written twice")
            raise TraceError(f"step index {step.index} was written after step {self._last_index} (indexes must grow)")
        self._last_index = int(step.index)
        new_blobs: list[tuple[bytes, codec.Pending]] = []

        def blob_ref(name: str, values: np.ndarray) -> str:
            prev = self._last.get(name)
            # Page tables mostly equal the previous step's: comparing is ~4x cheaper than hashing.
            if prev is not None and prev[0].shape == values.shape and prev[0].dtype == values.dtype:
                if prev[0] is values or np.array_equal(prev[0], values):
                    return prev[1].hex()
            d = codec.digest(values)
            self._last[name] = (values, d)
            if d in self._seen:
                self._seen.move_to_end(d)
                return d.hex()
            key = self._keys.get(name)
            if key is not None and key[1] < KEY_INTERVAL - 1:
                new_blobs.append((d, codec.prepare(values, key[0])))
                self._keys[name] = (key[0], key[1] + 1)
            else:
                new_blobs.append((d, codec.prepare(values)))
                self._keys[name] = (codec.Base(values, d), 0)
            self._seen[d] = None
            if len(self._seen) > _SEEN_DIGESTS:
                self._seen.popitem(last=False)
            return d.hex()

        row, body = tables.encode_step(step, blob_ref)
        vrows = [tables.violation_row(v, "recorder") for v in step.violations]
        return row, body, new_blobs, vrows

    def _fail(self, e: BaseException) -> None:
        if self._error is None:
            self._error = e

    # -- SQLite ------------------------------------------------------------------------------------

    def _finish(self) -> None:
        try:
            if self._error is None:
                self._conn.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES ('closed_ns', ?)", (str(time.time_ns()),)
                )
            # A finished trace becomes one self-contained file: readers then need no -wal/-shm beside it
            # (so read-only folders work). If a live reader still holds it, it simply stays in WAL mode.
            try:
                # Never wait for live readers here: close() must not stall on a TUI that keeps the file open.
                self._conn.execute("PRAGMA busy_timeout=0")
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                self._conn.execute("PRAGMA journal_mode=DELETE")
            except sqlite3.OperationalError:
                pass
            self._conn.close()
        except sqlite3.Error as e:
            self._fail(e)

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

    @staticmethod
    def _compress(encoded: tuple[Any, ...]) -> tuple[Any, ...]:
        row, container, new_blobs, vrows = encoded
        return row, tables.compress_body(container), [(d, p.finish()) for d, p in new_blobs], vrows

    def _commit_step(
        self,
        row: tuple[Any, ...],
        body: bytes,
        blobs: list[tuple[bytes, bytes]],
        vrows: list[tuple[Any, ...]],
    ) -> None:
        conn = self._conn
        conn.execute("BEGIN")
        try:
            if blobs:
                conn.executemany("INSERT OR IGNORE INTO blobs (digest, data) VALUES (?, ?)", blobs)
            conn.execute(tables.INSERT_STEP, row)
            conn.execute("INSERT INTO step_bodies (idx, body) VALUES (?, ?)", (row[0], body))
            if vrows:
                conn.executemany(tables.INSERT_VIOLATION, vrows)
            conn.execute("COMMIT")
        except BaseException as e:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(e, sqlite3.IntegrityError) and "steps.idx" in str(e):
                raise TraceError(f"step index {row[0]} was written twice") from e
            raise
