"""TraceReader: validated, read-only access to a trace file, including one that is still being written."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import pathlib
import sqlite3
import struct
import threading
import zlib
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from . import codec, tables
from .errors import TraceError, TraceIndexError
from .query import QueryMixin, StepFilter
from .schema import (
    MAGIC,
    SCHEMA_MAJOR,
    FaultReport,
    ForwardMode,
    GraphPhase,
    RequestRecord,
    RequestRow,
    RunInfo,
    Severity,
    SpanRow,
    Step,
    StepSummary,
    Violation,
)

_BATCH = 128  # rows per query when streaming, so no statement stays open across yields
_MAX_BASE_DEPTH = 64  # writers chain at most 8; anything deeper (or a cycle) is damage
_ARRAY_CACHE_SIZE = 512
# What damaged bytes can raise on their way through sqlite3, zlib, json, numpy and the schema types.
_DAMAGE = (
    sqlite3.Error, zlib.error, struct.error, ValueError, KeyError, TypeError, IndexError,
    AttributeError, OverflowError, RecursionError, MemoryError,
)  # fmt: skip


def check_file(path: str) -> None:
    """Raise TraceError unless `path` is an existing, non-empty, complete-looking SQLite file."""
    try:
        with open(path, "rb") as f:
            head = f.read(100)
            size = os.fstat(f.fileno()).st_size
    except FileNotFoundError:
        raise TraceError("no such file", path) from None
    except IsADirectoryError:
        raise TraceError("is a directory, not a trace file", path) from None
    except OSError as e:
        raise TraceError(f"cannot be read ({e.strerror or e})", path) from None
    if size == 0:
        raise TraceError("empty file (0 bytes), not a specscope trace", path)
    if not head.startswith(tables.SQLITE_HEADER):
        raise TraceError("not a specscope trace (not an SQLite database)", path)
    if len(head) < 100:
        raise TraceError(f"truncated SQLite file ({size} bytes, shorter than its header)", path)
    page_size = int.from_bytes(head[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    num_pages = int.from_bytes(head[28:32], "big")
    size_valid = head[24:28] == head[92:96]  # the in-header size is only trusted when these match
    # A live writer's WAL can hold pages the main file lacks; only judge the size of a settled file.
    try:
        settled = os.path.getsize(path + "-wal") == 0
    except OSError:
        settled = True  # no WAL beside it
    if size_valid and settled and size < num_pages * page_size:
        raise TraceError(f"truncated ({size} of {num_pages * page_size} bytes present)", path)


class TraceReader(QueryMixin):
    """Read-only view of one trace; every query sees the steps committed when it runs."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._lock = threading.RLock()
        self._arrays: collections.OrderedDict[bytes, np.ndarray] = collections.OrderedDict()
        self._count = (0, -(2**63))  # (steps counted, highest index counted) for num_steps()
        check_file(self.path)
        self._conn = self._open()
        try:
            self._conn.execute("PRAGMA busy_timeout = 10000")
            self.schema_version = self._check_meta()
            self.run = self._read_run()
        except BaseException:
            self._conn.close()
            raise

    def _open(self) -> sqlite3.Connection:
        uri = pathlib.Path(self.path).resolve().as_uri() + "?mode=ro"
        opts = {"uri": True, "isolation_level": None, "check_same_thread": False}
        try:
            conn = sqlite3.connect(uri, **opts)
            try:
                conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
                return conn
            except sqlite3.OperationalError:
                # A WAL-mode file in a read-only folder cannot get its -shm: read it as an immutable file.
                conn.close()
                if os.access(os.path.dirname(os.path.abspath(self.path)), os.W_OK):
                    raise
                return sqlite3.connect(uri + "&immutable=1", **opts)
        except sqlite3.OperationalError as e:
            raise TraceError(f"cannot be opened (SQLite: {' '.join(str(e).split())})", self.path) from None
        except sqlite3.Error as e:
            raise TraceError(f"damaged or unreadable (SQLite: {' '.join(str(e).split())})", self.path) from None
        except ValueError as e:  # e.g. UnicodeDecodeError from a damaged schema text
            raise TraceError(f"damaged or unreadable ({type(e).__name__})", self.path) from None

    # -- validation ------------------------------------------------------------------------------

    def _check_meta(self) -> str:
        with self._guard("reading its table list"):
            names = {r[0] for r in self._conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "meta" not in names:
            problem = "not a specscope trace (SQLite database without the specscope tables)"
            raise TraceError(problem, self.path)
        with self._guard("reading its meta table"):
            meta = dict(self._conn.execute("SELECT key, value FROM meta").fetchall())
        if meta.get("magic") != MAGIC:
            raise TraceError("not a specscope trace (its meta table lacks the specscope magic)", self.path)
        version = meta.get("schema_version")
        try:
            major, _minor = (int(p) for p in str(version).split("."))
        except ValueError:
            raise TraceError(f"damaged: unreadable schema version {version!r}", self.path) from None
        if major > SCHEMA_MAJOR:
            raise TraceError(
                f"written by a newer specscope (schema {version}); this reader understands {SCHEMA_MAJOR}.x",
                self.path,
            )
        if major < 1:
            raise TraceError(f"damaged: unknown schema version {version}", self.path)
        missing = [t for t in tables.REQUIRED_TABLES if t not in names]
        if missing:
            raise TraceError(f"damaged: table {missing[0]!r} is missing", self.path)
        return str(version)

    def _read_run(self) -> RunInfo:
        with self._guard("reading its run record"):
            row = self._conn.execute("SELECT info FROM run WHERE id = 1").fetchone()
            if row is None:
                raise TraceError("damaged: the run record is missing")
            d = json.loads(row[0])
            run = RunInfo.from_dict(d)
            if not isinstance(run.config, dict) or not isinstance(run.versions, dict):
                raise TypeError("run config and versions must be objects")
            return run

    @contextlib.contextmanager
    def _guard(self, what: str) -> Iterator[None]:
        # One boundary turns every way damaged bytes can fail into one sentence naming the file.
        try:
            with self._lock:
                yield
        except TraceError as e:
            raise e.with_path(self.path) from None
        except _DAMAGE as e:
            detail = " ".join(str(e).split())[:200]
            if isinstance(e, sqlite3.Error):
                problem = f"damaged or unreadable while {what} (SQLite: {detail})"
            else:
                problem = f"damaged while {what} ({type(e).__name__}: {detail})"
            raise TraceError(problem, self.path) from None

    # -- steps -----------------------------------------------------------------------------------

    def num_steps(self) -> int:
        """Steps committed right now (re-queried on every call, so a live trace grows)."""
        with self._guard("counting steps"):
            # Steps are append-only with increasing indexes, so only rows past the last one seen need
            # counting: a poll of a live 100k-step trace stays O(new steps), not a full table scan.
            n, last = self._count
            more, top = self._conn.execute("SELECT count(*), max(idx) FROM steps WHERE idx > ?", (last,)).fetchone()
            if more:
                self._count = (n + int(more), int(top))
            return self._count[0]

    def is_closed(self) -> bool:
        """True once the writer closed the trace cleanly (False while live, or after a crash)."""
        with self._guard("reading its meta table"):
            return self._conn.execute("SELECT 1 FROM meta WHERE key = 'closed_ns'").fetchone() is not None

    def step(self, i: int, arrays: Iterable[str] | None = None) -> Step:
        """The step with index `i` (TraceIndexError, a TraceError and IndexError, if absent).

        `arrays` names the array snapshots to decode (None: all of them; `()`: none, for headers, requests,
        spans and errors only)."""
        i = int(i)
        with self._guard(f"reading step {i}"):
            rows = self._fetch_steps("s.idx = ?", (i,))
            if not rows:
                raise TraceIndexError(f"has no step {i} ({self.num_steps()} steps)", self.path)
            step = self._assemble(rows)[0]
        if arrays is not None:
            keep = set(arrays)
            step = dataclasses.replace(step, arrays=tuple(a for a in step.arrays if a.name in keep))
        return step

    def steps(self, start: int = 0, stop: int | None = None) -> Iterator[Step]:
        """Steps with start <= index < stop, in index order (fetched in batches)."""
        nxt = int(start)
        while stop is None or nxt < stop:
            with self._guard(f"reading steps from {nxt}"):
                hi = (2**63 - 1) if stop is None else int(stop)
                rows = self._fetch_steps("s.idx >= ? AND s.idx < ? ORDER BY s.idx LIMIT ?", (nxt, hi, _BATCH))
                batch = self._assemble(rows)
            if not batch:
                return
            yield from batch
            nxt = batch[-1].index + 1

    def step_headers(
        self, start: int = 0, stop: int | None = None, *, mode: str | None = None
    ) -> Iterator[dict[str, Any]]:
        """Header dicts (`Step.header_dict()` keys plus `num_violations`), no arrays: for list views."""
        cols = ", ".join(f"s.{c}" for c in tables.HEADER_COLUMNS)
        nv = "(SELECT count(*) FROM violations v WHERE v.step = s.idx)"
        where = "s.idx >= ? AND s.idx < ?" + (" AND s.mode = ?" if mode is not None else "")
        nxt = int(start)
        while stop is None or nxt < stop:
            hi = (2**63 - 1) if stop is None else int(stop)
            params: tuple[Any, ...] = (nxt, hi) + ((str(mode),) if mode is not None else ())
            with self._guard(f"reading step headers from {nxt}"):
                sql = f"SELECT {cols}, {nv} FROM steps s WHERE {where} ORDER BY s.idx LIMIT {_BATCH * 8}"
                rows = self._conn.execute(sql, params).fetchall()
                out = []
                for r in rows:
                    h = tables.header_from_row(r)
                    h["num_violations"] = int(r[-1])
                    out.append(h)
            if not out:
                return
            yield from out
            nxt = int(out[-1]["index"]) + 1

    def _fetch_steps(self, where: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        cols = ", ".join(f"s.{c}" for c in tables.HEADER_COLUMNS)
        sql = f"SELECT {cols}, b.body FROM steps s LEFT JOIN step_bodies b ON b.idx = s.idx WHERE {where}"
        return self._conn.execute(sql, params).fetchall()

    def _assemble(self, rows: list[tuple[Any, ...]]) -> list[Step]:
        bodies = []
        for r in rows:
            if r[-1] is None:
                raise TraceError(f"damaged: the body of step {r[0]} is missing")
            bodies.append(tables.Body(r[-1]))
        arrays = self._load_arrays({d for body in bodies for d in body.blob_digests()})
        steps = []
        for r, body in zip(rows, bodies, strict=True):
            try:
                steps.append(tables.step_from_row(r[:-1], body, arrays))
            except _DAMAGE as e:
                problem = f"damaged: step {r[0]} cannot be decoded ({type(e).__name__}: {e})"
                raise TraceError(problem) from None
        return steps

    def _load_arrays(self, digests: set[bytes]) -> dict[bytes, np.ndarray]:
        cache = self._arrays
        out = {d: cache[d] for d in digests if d in cache}
        want = sorted(digests - out.keys())
        blobs: dict[bytes, bytes] = {}
        for k in range(0, len(want), 500):  # stay under SQLite's bound-parameter limit
            chunk = want[k : k + 500]
            q = f"SELECT digest, data FROM blobs WHERE digest IN ({', '.join('?' * len(chunk))})"
            blobs.update(self._conn.execute(q, chunk).fetchall())
        for d in want:
            out[d] = self._decode_blob(d, blobs, 0)
        for d in digests:
            cache[d] = out[d]
            cache.move_to_end(d)
        # Decoded bases stay cached too: the next steps of a sequential read chain onto them.
        while len(cache) > _ARRAY_CACHE_SIZE:
            cache.popitem(last=False)
        return out

    def _decode_blob(self, digest: bytes, blobs: dict[bytes, bytes], depth: int) -> np.ndarray:
        """Decode one blob, first decoding the chain of bases it was compressed against."""
        if digest in self._arrays:
            return self._arrays[digest]
        if depth > _MAX_BASE_DEPTH:
            raise TraceError(f"damaged: array blob {digest.hex()} has a base chain deeper than {_MAX_BASE_DEPTH}")
        data = blobs.get(digest)
        if data is None:
            row = self._conn.execute("SELECT data FROM blobs WHERE digest = ?", (digest,)).fetchone()
            data = None if row is None else row[0]
        if data is None:
            raise TraceError(f"damaged: array blob {digest.hex()} is missing")
        if not isinstance(data, bytes):
            raise TraceError(f"damaged: array blob {digest.hex()} is not binary")
        try:
            b = codec.base_digest(data)
            base = None if b is None else self._decode_blob(b, blobs, depth + 1)
            arr = codec.decode(data, base)
        except TraceError as e:
            if e.problem.startswith("damaged: array blob"):
                raise
            raise TraceError(f"damaged: array blob {digest.hex()} cannot be decoded ({e.problem})") from None
        self._arrays[digest] = arr
        return arr

    # -- aggregates (cheap SQL over header columns, for summaries on 100k-step traces) ---------------

    def count_steps_by(self, column: str) -> dict[str, int]:
        """Number of steps per value of a header column (mode, graph, model, batch_size, ...)."""
        if column not in tables.STEP_COLUMNS or column in ("scalars", "accept_hist"):
            raise ValueError(f"cannot group steps by {column!r}")
        with self._guard(f"counting steps by {column}"):
            rows = self._conn.execute(f"SELECT {column}, count(*) FROM steps GROUP BY {column}").fetchall()
            return {str(k): int(n) for k, n in rows}

    def step_stats(self) -> dict[str, int | None]:
        """Totals over all steps: steps, iterations, query/drafted tokens, max K, first start, last end."""
        with self._guard("summing steps"):
            r = self._conn.execute(
                "SELECT count(*), count(DISTINCT iteration), total(num_query_tokens),"
                " total(num_drafted_tokens),"
                " (SELECT max(num_draft_tokens) FROM steps WHERE mode = 'TARGET_VERIFY'),"
                " min(start_ns), max(end_ns) FROM steps"
            ).fetchone()
            keys = (
                "steps", "iterations", "num_query_tokens", "num_drafted_tokens", "max_verify_draft_tokens",
                "first_start_ns", "last_end_ns",
            )  # fmt: skip
            return {k: None if v is None else int(v) for k, v in zip(keys, r, strict=True)}

    def accept_histogram(self) -> list[int]:
        """Element L = number of TARGET_VERIFY request rows (all steps) whose accept_length is L."""
        total: list[int] = []
        last = -1
        while True:
            with self._guard("reading acceptance counts"):
                rows = self._conn.execute(
                    "SELECT idx, accept_hist FROM steps WHERE idx > ? AND accept_hist IS NOT NULL"
                    " AND mode = 'TARGET_VERIFY' ORDER BY idx LIMIT 4096",
                    (last,),
                ).fetchall()
                for _, h in rows:
                    counts = json.loads(h)
                    if len(counts) > len(total):
                        total.extend([0] * (len(counts) - len(total)))
                    for n, c in enumerate(counts):
                        total[n] += int(c)
            if not rows:
                return total
            last = int(rows[-1][0])

    # -- requests and violations -----------------------------------------------------------------

    def requests(self) -> list[RequestRecord]:
        """Every request record, by request id."""
        with self._guard("reading requests"):
            rows = self._conn.execute("SELECT record FROM requests ORDER BY request_id").fetchall()
            return [RequestRecord.from_dict(json.loads(r[0])) for r in rows]

    def violations(
        self,
        *,
        step: int | None = None,
        check_id: str | None = None,
        severity: str | Severity | None = None,
        source: str | None = None,
    ) -> list[Violation]:
        """Violations (recorded and appended by checkers), by step; filters combine with AND."""
        conds, params = [], []
        for col, val in (("step", step), ("check_id", check_id), ("source", source)):
            if val is not None:
                conds.append(f"{col} = ?")
                params.append(val)
        if severity is not None:
            conds.append("severity = ?")
            params.append(Severity(severity).value)
        where = (" WHERE " + " AND ".join(conds)) if conds else ""
        with self._guard("reading violations"):
            sql = f"SELECT step, check_id, severity, request_id, message FROM violations{where}"
            rows = self._conn.execute(sql + " ORDER BY step, id", params).fetchall()
            return [
                Violation(check_id=str(c), severity=Severity(sev), step=int(s), message=str(m),
                          request_id=None if rq is None else int(rq))
                for s, c, sev, rq, m in rows
            ]  # fmt: skip

    def count_violations_by_id(self) -> dict[str, int]:
        """Number of violations per check id."""
        with self._guard("counting violations"):
            sql = "SELECT check_id, count(*) FROM violations GROUP BY check_id"
            rows = self._conn.execute(sql).fetchall()
            return {str(k): int(n) for k, n in rows}

    # -- query hooks (tracer/query.py); first implementation over the v1 tables ------------------------

    def _q_summary_rows(self, start: int, stop: int | None, filter: StepFilter | None, *,
                        backward: bool = False) -> Iterator[StepSummary]:
        conds, params = ["s.idx >= ?", "s.idx < ?"], [int(start), (2**63 - 1) if stop is None else int(stop)]
        f = filter
        if f is not None:
            for col, val in (("mode", f.mode), ("model", f.model), ("graph", f.graph), ("iteration", f.iteration)):
                if val is not None:
                    conds.append(f"s.{col} = ?")
                    params.append(val)
            if f.check_id is not None:
                conds.append("EXISTS (SELECT 1 FROM violations v WHERE v.step = s.idx AND v.check_id = ?)")
                params.append(f.check_id)
            if f.severity is not None:
                conds.append("EXISTS (SELECT 1 FROM violations v WHERE v.step = s.idx AND v.severity = ?)")
                params.append(Severity(f.severity).value)
            if f.has_violation:
                conds.append("EXISTS (SELECT 1 FROM violations v WHERE v.step = s.idx)")
        cols = ", ".join(f"s.{c}" for c in tables.HEADER_COLUMNS)
        nerr = "(SELECT count(*) FROM violations v WHERE v.step = s.idx AND v.severity = 'error')"
        nwarn = "(SELECT count(*) FROM violations v WHERE v.step = s.idx AND v.severity = 'warning')"
        order = "DESC" if backward else "ASC"
        lo, hi = params[0], params[1]
        while lo < hi:
            p = [lo, hi] + params[2:]
            sql = (f"SELECT {cols}, s.accept_hist, {nerr}, {nwarn} FROM steps s WHERE {' AND '.join(conds)}"
                   f" ORDER BY s.idx {order} LIMIT {_BATCH * 8}")
            with self._guard(f"reading step summaries from {lo}"):
                rows = self._conn.execute(sql, p).fetchall()
                out = [self._summary_from_row(r) for r in rows]
            if f is not None and f.request_id is not None:
                out = [s for s in out if self._q_step_has_request(s.index, f.request_id)]
            yield from out
            if len(rows) < _BATCH * 8:
                return
            last = int(rows[-1][0])
            if backward:
                hi = last
            else:
                lo = last + 1

    def _summary_from_row(self, r: tuple[Any, ...]) -> StepSummary:
        h = tables.header_from_row(r)
        hist = r[len(tables.HEADER_COLUMNS)]
        return StepSummary(
            index=int(h["index"]), iteration=int(h["iteration"]), mode=ForwardMode(h["mode"]), model=str(h["model"]),
            step_id=None if h["step_id"] is None else int(h["step_id"]), batch_size=int(h["batch_size"]),
            padded_batch_size=int(h["padded_batch_size"]), graph=GraphPhase(h["graph"]),
            tokens_per_request=int(h["tokens_per_request"]), num_draft_tokens=int(h["num_draft_tokens"]),
            page_size=int(h["page_size"]), start_ns=int(h["start_ns"]), end_ns=int(h["end_ns"]),
            num_errors=int(r[-2]), num_warnings=int(r[-1]),
            scalars={str(k): int(v) for k, v in h["scalars"].items()},
            accept_hist=tuple(int(x) for x in json.loads(hist)) if hist else (),
        )  # fmt: skip

    def _q_step_has_request(self, i: int, request_id: int) -> bool:
        return any(r.request_id == request_id for r in self.step(i, arrays=()).requests)

    def _q_spans(self, t0: int | None, t1: int | None, steps: tuple[int, int] | None) -> list[SpanRow]:
        lo, hi = (0, None) if steps is None else (int(steps[0]), int(steps[1]))
        out = []
        for st in self.steps(lo, hi):
            for sp in st.spans:
                if (t0 is None or sp.end_ns > t0) and (t1 is None or sp.start_ns < t1):
                    out.append(SpanRow(st.index, st.model, st.mode, sp.stream, sp.name, sp.start_ns, sp.end_ns))
        out.sort(key=lambda s: (s.start_ns, s.step))
        return out

    def _q_request_rows(self, request_id: int) -> list[RequestRow]:
        out = []
        for st in self.steps():
            for r in st.requests:
                if r.request_id == request_id:
                    out.append(RequestRow(st.index, st.iteration, st.mode, st.model, r.request_id, r.slot,
                                          r.seq_len_before, r.seq_len_after, r.num_q_tokens, r.accept_length))
        return out

    def _q_capture(self, s: StepSummary) -> int | None:
        sql = ("SELECT max(idx) FROM steps WHERE graph = 'capture' AND model = ? AND mode = ? AND step_id IS ?"
               " AND padded_batch_size = ? AND idx < ?")
        with self._guard(f"finding the capture of step {s.index}"):
            r = self._conn.execute(sql, (s.model, s.mode.value, s.step_id, s.padded_batch_size, s.index)).fetchone()
        return None if r is None or r[0] is None else int(r[0])

    def _q_fault_report(self) -> list[FaultReport]:
        faults = self.run.config.get("faults") or []
        fired: dict[str, list[int]] = {str(f): [] for f in faults}
        for st in self.steps():
            for f in st.faults_fired:
                fired.setdefault(f, []).append(st.index)
        return [FaultReport(f, len(v), v[0] if v else None) for f, v in fired.items()]

    def _q_checked_through(self) -> int | None:
        with self._guard("reading its meta table"):
            r = self._conn.execute("SELECT value FROM meta WHERE key = 'checked_through'").fetchone()
        return None if r is None else int(r[0])

    # -- lifetime --------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the file."""
        with self._lock:
            self._conn.close()

    def __enter__(self) -> TraceReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
