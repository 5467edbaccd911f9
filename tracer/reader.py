"""TraceReader: validated, read-only access to a trace file, including one that is still being written."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import pathlib
import shutil
import sqlite3
import struct
import tempfile
import threading
import zlib
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import zstandard

from . import codec, tables
from .errors import TraceError, TraceIndexError
from .query import QueryMixin, SpanBins, StepBins, StepFilter, ViolationFilter
from .schema import (
    MAGIC,
    SCHEMA_MAJOR,
    Cell,
    EndState,
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
    sqlite3.Error, zlib.error, zstandard.ZstdError, struct.error, ValueError, KeyError, TypeError, IndexError,
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


def _connect(uri: str) -> sqlite3.Connection:
    # Autocommit (no implicit transactions), and usable from the viewers' loader threads under the reader's lock.
    return sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)


class TraceReader(QueryMixin):
    """Read-only view of one trace; every query sees the steps committed when it runs."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.bundle_path: str | None = None  # set when `path` is a bug-report bundle (.zip)
        self._tmpdir: str | None = None
        self._lock = threading.RLock()
        self._arrays: collections.OrderedDict[bytes, np.ndarray] = collections.OrderedDict()
        self._count = (0, -(2**63))  # (steps counted, highest index counted) for num_steps()
        self._zdicts: dict[int, zstandard.ZstdDecompressor] = {}
        self.major = 0
        self._open_bundle()
        try:
            check_file(self.path)
            self._conn = self._open()
        except BaseException:
            self._remove_bundle_copy()
            raise
        try:
            self._conn.execute("PRAGMA busy_timeout = 10000")
            self.schema_version = self._check_meta()
            self.run = self._read_run()
        except BaseException:
            self._conn.close()
            self._remove_bundle_copy()
            raise

    def _open_bundle(self) -> None:
        # Every command opens a bug-report bundle where it opens a trace: its trace.db is read from a private
        # temporary copy, removed at close (so `check --write` on a bundle changes only that copy).
        from .export.bundle import _extract_trace, is_bundle

        if not is_bundle(self.path):
            return
        self.bundle_path = self.path
        self._tmpdir = tempfile.mkdtemp(prefix="specscope-bundle-")
        try:
            self.path = _extract_trace(self.bundle_path, self._tmpdir)
        except BaseException:
            self._remove_bundle_copy()
            raise

    def _remove_bundle_copy(self) -> None:
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def _open(self) -> sqlite3.Connection:
        uri = pathlib.Path(self.path).resolve().as_uri() + "?mode=ro"
        try:
            conn = _connect(uri)
            try:
                conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
                return conn
            except sqlite3.OperationalError:
                # A WAL-mode file in a read-only folder cannot get its -shm: read it as an immutable file.
                conn.close()
                if os.access(os.path.dirname(os.path.abspath(self.path)), os.W_OK):
                    raise
                return _connect(uri + "&immutable=1")
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
            self.major = major
        except ValueError:
            raise TraceError(f"damaged: unreadable schema version {version!r}", self.path) from None
        if major > SCHEMA_MAJOR:
            raise TraceError(
                f"written by a newer specscope (schema {version}); this reader understands {SCHEMA_MAJOR}.x",
                self.path,
            )
        if major < 1:
            raise TraceError(f"damaged: unknown schema version {version}", self.path)
        required = tables.REQUIRED_TABLES_V1 if major < 2 else tables.REQUIRED_TABLES
        missing = [t for t in required if t not in names]
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
            raise e.with_path(self.display_path) from None
        except _DAMAGE as e:
            detail = " ".join(str(e).split())[:200]
            if isinstance(e, sqlite3.Error):
                problem = f"damaged or unreadable while {what} (SQLite: {detail})"
            else:
                problem = f"damaged while {what} ({type(e).__name__}: {detail})"
            raise TraceError(problem, self.display_path) from None

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

    def last_index(self) -> int | None:
        """The highest step index committed right now (None without steps). A recorded trace holds 0..last; a
        bundle keeps the original run's indexes, so its steps can start later and skip (`step_indexes`)."""
        n = self.num_steps()
        return self._count[1] if n else None

    def is_dense(self) -> bool:
        """True when the steps are exactly 0..num_steps()-1 (every recorded trace): index == position."""
        n = self.num_steps()
        return n == 0 or self._count[1] == n - 1

    def step_indexes(self, start: int = 0, stop: int | None = None) -> list[int]:
        """The indexes of the steps with start <= index < stop, ascending (the primary key: no body is read)."""
        hi = (2**63 - 1) if stop is None else int(stop)
        with self._guard("listing step indexes"):
            rows = self._conn.execute("SELECT idx FROM steps WHERE idx >= ? AND idx < ? ORDER BY idx",
                                      (int(start), hi)).fetchall()
        return [int(r[0]) for r in rows]

    def has_step(self, i: int) -> bool:
        """Whether the trace holds a step with index `i`."""
        with self._guard(f"looking up step {i}"):
            return self._conn.execute("SELECT 1 FROM steps WHERE idx = ?", (int(i),)).fetchone() is not None

    def steps_text(self) -> str:
        """The step indexes the trace holds, for messages: `steps 0–172`, or a bundle's `steps 2, 5, 30–59`."""
        if self.is_dense():
            n = self.num_steps()
            return f"steps 0–{n - 1}" if n else "no steps"
        from .query import index_runs_text

        return "steps " + index_runs_text(self.step_indexes())

    @property
    def display_path(self) -> str:
        """The file the user named: a bundle's .zip (not its private trace.db copy), else the trace."""
        return self.bundle_path if self.bundle_path is not None else self.path

    def meta(self) -> dict[str, str]:
        """The `meta` table (magic, schema_version, created_ns, closed_ns, checked_through, upgraded_from, ...)."""
        with self._guard("reading its meta table"):
            return {str(k): str(v) for k, v in self._conn.execute("SELECT key, value FROM meta")}

    def waits_recorded(self) -> bool:
        """Whether the engine recorded wait edges (schema 2 runs; not schema 1 traces, upgraded or not): what the
        catalogue's `Checker(waits_recorded=...)` needs to judge I21 / I22."""
        return self.major >= 2 and "upgraded_from" not in self.meta()

    def is_closed(self) -> bool:
        """True once the writer closed the trace cleanly (False while live, or after a crash)."""
        with self._guard("reading its meta table"):
            return self._conn.execute("SELECT 1 FROM meta WHERE key = 'closed_ns'").fetchone() is not None

    def end_state(self) -> EndState:
        """How the run ended (`meta.end_state`; for a trace without that record, what `closed_ns` says)."""
        with self._guard("reading its end state"):
            (last,) = self._conn.execute("SELECT max(idx) FROM steps").fetchone()
        return EndState.from_meta(self.meta(), None if last is None else int(last))

    def step(self, i: int, arrays: Iterable[str] | None = None) -> Step:
        """The step with index `i` (TraceIndexError, a TraceError and IndexError, if absent).

        `arrays` names the array snapshots to decode (None: all of them; `()`: none, for headers, requests,
        spans and errors only)."""
        i = int(i)
        keep = None if arrays is None else {arrays} if isinstance(arrays, str) else set(arrays)
        with self._guard(f"reading step {i}"):
            rows = self._fetch_steps("s.idx = ?", (i,))
            if not rows:
                raise TraceIndexError(f"has no step {i} ({self.steps_text()})", self.display_path)
            return self._assemble(rows, keep)[0]

    def steps(self, start: int = 0, stop: int | None = None) -> Iterator[Step]:
        """Steps with start <= index < stop, in index order (fetched in batches)."""
        return self._steps(start, stop, None)

    def _steps(self, start: int, stop: int | None, keep: set[str] | None) -> Iterator[Step]:
        nxt = int(start)
        while stop is None or nxt < stop:
            with self._guard(f"reading steps from {nxt}"):
                hi = (2**63 - 1) if stop is None else int(stop)
                rows = self._fetch_steps("s.idx >= ? AND s.idx < ? ORDER BY s.idx LIMIT ?", (nxt, hi, _BATCH))
                batch = self._assemble(rows, keep)
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

    def _assemble(self, rows: list[tuple[Any, ...]], keep: set[str] | None = None) -> list[Step]:
        bodies = []
        for r in rows:
            if r[-1] is None:
                raise TraceError(f"damaged: the body of step {r[0]} is missing")
            bodies.append(tables.Body(r[-1], self._zdict))
        # Only the blobs of the arrays asked for are fetched and decoded.
        arrays = self._load_arrays({d for body in bodies for d in body.blob_digests(keep)})
        steps = []
        for r, body in zip(rows, bodies, strict=True):
            try:
                steps.append(tables.step_from_row(r[:-1], body, arrays, keep))
            except _DAMAGE as e:
                problem = f"damaged: step {r[0]} cannot be decoded ({type(e).__name__}: {e})"
                raise TraceError(problem) from None
        return steps

    def _zdict(self, dict_id: int) -> zstandard.ZstdDecompressor:
        d = self._zdicts.get(dict_id)
        if d is None:
            row = None
            if self.major >= 2:
                row = self._conn.execute("SELECT data FROM zdicts WHERE id = ?", (int(dict_id),)).fetchone()
            if row is None or not isinstance(row[0], bytes):
                raise TraceError(f"damaged: compression dictionary {dict_id} is missing")
            d = self._zdicts[dict_id] = zstandard.ZstdDecompressor(dict_data=zstandard.ZstdCompressionDict(row[0]))
        return d

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
                conds.append(f"v.{col} = ?")
                params.append(val)
        if severity is not None:
            conds.append("v.severity = ?")
            params.append(Severity(severity).value)
        where = (" WHERE " + " AND ".join(conds)) if conds else ""
        return self._read_violations(where, params, " ORDER BY v.step, v.id")

    def violations_page(self, filter: ViolationFilter | None = None, offset: int = 0,
                        limit: int | None = 100) -> list[Violation]:
        """The violations matching `filter`, by step (then as stored), from the `offset`-th on, at most `limit`
        (None: all): a viewer lists any page of them without reading the rest."""
        where, params = self._violation_where(filter or ViolationFilter())
        page = "" if limit is None else f" LIMIT {max(0, int(limit))} OFFSET {max(0, int(offset))}"
        return self._read_violations(where, params, " ORDER BY v.step, v.id" + page)

    def count_violations(self, filter: ViolationFilter | None = None) -> int:
        """How many violations match `filter` (one SQL count)."""
        where, params = self._violation_where(filter or ViolationFilter())
        join = " JOIN steps s ON s.idx = v.step" if "s.mode" in where else ""
        with self._guard("counting violations"):
            return int(self._conn.execute(f"SELECT count(*) FROM violations v{join}{where}", params).fetchone()[0])

    def violation_position(self, filter: ViolationFilter | None, step: int, check_id: str) -> int | None:
        """The offset in `violations_page(filter)` of the first violation of `check_id` at `step` (None: none)."""
        f = filter or ViolationFilter()
        where, params = self._violation_where(f)
        join = " JOIN steps s ON s.idx = v.step" if "s.mode" in where else ""
        with self._guard("finding a violation"):
            first = self._conn.execute(f"SELECT min(v.id) FROM violations v{join}{where}"
                                       f"{' AND' if where else ' WHERE'} v.step = ? AND v.check_id = ?",
                                       [*params, int(step), str(check_id)]).fetchone()[0]
            if first is None:
                return None
            cond = "(v.step < ? OR (v.step = ? AND v.id < ?))"
            sql = f"SELECT count(*) FROM violations v{join}{where}{' AND' if where else ' WHERE'} {cond}"
            return int(self._conn.execute(sql, [*params, int(step), int(step), int(first)]).fetchone()[0])

    @staticmethod
    def _violation_where(f: ViolationFilter) -> tuple[str, list[Any]]:
        conds: list[str] = []
        params: list[Any] = []
        if f.check_ids:
            conds.append(f"v.check_id IN ({', '.join('?' * len(f.check_ids))})")
            params += [str(c) for c in f.check_ids]
        if f.severity is not None:
            conds.append("v.severity = ?")
            params.append(Severity(f.severity).value)
        if f.mode is not None:
            conds.append("s.mode = ?")
            params.append(ForwardMode(f.mode).value)
        if f.request_id is not None:
            conds.append("v.request_id = ?")
            params.append(int(f.request_id))
        if f.start is not None:
            conds.append("v.step >= ?")
            params.append(int(f.start))
        if f.stop is not None:
            conds.append("v.step < ?")
            params.append(int(f.stop))
        if f.text:
            # LIKE is case-insensitive for ASCII; its wildcards in the text are matched literally.
            esc = f.text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            conds.append("v.message LIKE ? ESCAPE '\\'")
            params.append(f"%{esc}%")
        return (" WHERE " + " AND ".join(conds)) if conds else "", params

    def _read_violations(self, where: str, params: list[Any], tail: str) -> list[Violation]:
        join = " JOIN steps s ON s.idx = v.step" if "s.mode" in where else ""
        with self._guard("reading violations"):
            # Schema 1 has no cell columns and schema 2.0 no `related` column: they read as NULL.
            have = self._violation_columns()
            names = ("array", "row", "col", "found", "expected", "related")
            cells = ", ".join(f"v.{c}" if c in have else "NULL" for c in names)
            sql = f"SELECT v.step, v.check_id, v.severity, v.request_id, v.message, {cells} FROM violations v"
            rows = self._conn.execute(sql + join + where + tail, params).fetchall()
            return [
                Violation(check_id=str(c), severity=Severity(sev), step=int(s), message=str(m),
                          request_id=None if rq is None else int(rq), array=None if a is None else str(a),
                          row=None if row is None else int(row), col=None if col is None else int(col),
                          found=None if fo is None else str(fo), expected=None if ex is None else str(ex),
                          related=tuple(Cell.from_dict(d) for d in json.loads(rel)) if rel else ())
                for s, c, sev, rq, m, a, row, col, fo, ex, rel in rows
            ]  # fmt: skip

    @staticmethod
    def _bin_edges(start: int, stop: int, bins: int) -> tuple[int, np.ndarray]:
        n = max(1, stop - start)
        bins = max(1, min(int(bins), n))
        b = np.arange(bins + 1, dtype=np.int64)
        return bins, start + (b * n + bins - 1) // bins  # bin(idx) = (idx - start) * bins // n

    def step_bins(self, start: int, stop: int, bins: int) -> StepBins:
        """The summary rows of steps [start, stop) in `bins` equal bins of indexes, aggregated in SQL: per bin and
        mode the count and min / max / mean host duration, per bin the batch-size range, capture and replay counts
        and the violations of its steps. A 100k-step trace in a few hundred ms, no step body read."""
        start, stop = int(start), max(int(start) + 1, int(stop))
        nb, edges = self._bin_edges(start, stop, bins)
        span = stop - start
        b = f"((idx - {start}) * {nb}) / {span}"
        with self._guard("binning step summaries"):
            modes = self._conn.execute(
                f"SELECT {b} AS b, mode, count(*), min(end_ns - start_ns), max(end_ns - start_ns),"
                " avg(end_ns - start_ns) FROM steps WHERE idx >= ? AND idx < ? GROUP BY b, mode ORDER BY b, mode",
                (start, stop)).fetchall()  # fmt: skip
            per = self._conn.execute(
                f"SELECT {b} AS b, count(*), min(batch_size), max(batch_size), total(graph = 'capture'),"
                " total(graph = 'replay') FROM steps WHERE idx >= ? AND idx < ? GROUP BY b ORDER BY b",
                (start, stop)).fetchall()  # fmt: skip
            vb = b.replace("idx", "step")
            viol = self._conn.execute(
                f"SELECT {vb} AS b, severity, count(*) FROM violations WHERE step >= ? AND step < ?"
                " GROUP BY b, severity", (start, stop)).fetchall()  # fmt: skip

        def col(rows: list[Any], k: int, dtype: Any = np.int64) -> np.ndarray:
            return np.array([r[k] for r in rows], dtype=dtype)

        pb = col(per, 0)
        err, warn = np.zeros(len(pb), np.int64), np.zeros(len(pb), np.int64)
        where = {int(x): k for k, x in enumerate(pb)}
        for bb, sev, n in viol:
            k = where.get(int(bb))
            if k is not None:
                (err if sev == Severity.ERROR.value else warn)[k] += int(n)
        return StepBins(edges=edges, mode_bin=col(modes, 0), mode=col(modes, 1, object).astype(str),
                        count=col(modes, 2), dur_min_ns=col(modes, 3), dur_max_ns=col(modes, 4),
                        dur_mean_ns=col(modes, 5, np.float64), bin=pb, steps=col(per, 1), bs_min=col(per, 2),
                        bs_max=col(per, 3), captures=col(per, 4), replays=col(per, 5), errors=err, warnings=warn)

    def span_bins(self, start: int, stop: int, bins: int) -> SpanBins:
        """The stream spans of steps [start, stop) aggregated per bin of step indexes and stream, in SQL: span
        count, summed and longest duration (for windows too wide to draw span by span)."""
        start, stop = int(start), max(int(start) + 1, int(stop))
        nb, edges = self._bin_edges(start, stop, bins)
        if self.major < 2:
            rows: list[Any] = []
            acc: dict[tuple[int, str], list[int]] = {}
            for sp in self._q_spans_v1(None, None, (start, stop)):
                a = acc.setdefault(((sp.step - start) * nb // (stop - start), sp.stream), [0, 0, 0])
                d = sp.end_ns - sp.start_ns
                a[0], a[1], a[2] = a[0] + 1, a[1] + d, max(a[2], d)
            rows = [(k[0], k[1], *v) for k, v in sorted(acc.items())]
        else:
            with self._guard("binning spans"):
                rows = self._conn.execute(
                    f"SELECT ((step - {start}) * {nb}) / {stop - start} AS b, stream, count(*),"
                    " total(end_ns - start_ns),"
                    " max(end_ns - start_ns) FROM spans WHERE step >= ? AND step < ? GROUP BY b, stream ORDER BY b",
                    (start, stop)).fetchall()  # fmt: skip
        return SpanBins(edges=edges, bin=np.array([r[0] for r in rows], np.int64),
                        stream=np.array([str(r[1]) for r in rows], dtype=str),
                        count=np.array([r[2] for r in rows], np.int64),
                        busy_ns=np.array([r[3] for r in rows], np.float64).astype(np.int64),
                        max_ns=np.array([r[4] for r in rows], np.int64))

    def accept_lengths_by_request(self, start: int = 0, stop: int | None = None) -> dict[int, tuple[int, int]]:
        """Request id -> (verify rows, summed accept length) over the TARGET_VERIFY steps in [start, stop), from
        the per-step request rows (no step body is read)."""
        hi = (2**63 - 1) if stop is None else int(stop)
        out: dict[int, list[int]] = {}
        if self.major < 2:
            for st in self._steps(int(start), stop, keep=set()):
                if st.mode == ForwardMode.TARGET_VERIFY:
                    for r in st.requests:
                        if r.accept_length > 0:
                            a = out.setdefault(r.request_id, [0, 0])
                            a[0], a[1] = a[0] + 1, a[1] + r.accept_length
            return {k: (v[0], v[1]) for k, v in out.items()}
        acc_row = tables.STEP_REQUEST_FIELDS.index("accept_length")
        with self._guard("reading accept lengths"):
            rows = self._conn.execute(
                "SELECT r.num_requests, r.id_bytes, r.request_ids, r.data FROM step_requests r JOIN steps s"
                " ON s.idx = r.step WHERE r.step >= ? AND r.step < ? AND s.mode = 'TARGET_VERIFY'",
                (int(start), hi)).fetchall()  # fmt: skip
            ids_all, acc_all = [], []
            for n, w, ids, data in rows:
                ids_all.append(np.frombuffer(ids, "<i4" if w == 4 else "<i8").astype(np.int64))
                acc_all.append(tables.decode_request_data(data, int(n))[acc_row].astype(np.int64))
        if not ids_all:
            return {}
        ids_v, acc_v = np.concatenate(ids_all), np.concatenate(acc_all)
        keep = acc_v > 0
        ids_v, acc_v = ids_v[keep], acc_v[keep]
        uniq, inv = np.unique(ids_v, return_inverse=True)
        counts = np.bincount(inv, minlength=len(uniq))
        sums = np.bincount(inv, weights=acc_v, minlength=len(uniq))
        return {int(k): (int(c), int(t)) for k, c, t in zip(uniq, counts, sums, strict=True)}

    def _violation_columns(self) -> set[str]:
        # Read per call: `check --write` may run while this reader is open, but it never changes the columns.
        return {str(r[1]) for r in self._conn.execute("PRAGMA table_info(violations)")}

    def violation_sources(self) -> dict[str, int]:
        """Number of violations per source (`recorder`, `check`, ...)."""
        with self._guard("counting violations"):
            rows = self._conn.execute("SELECT source, count(*) FROM violations GROUP BY source").fetchall()
            return {str(k): int(n) for k, n in rows}

    def count_violations_by_id(self) -> dict[str, int]:
        """Number of violations per check id."""
        with self._guard("counting violations"):
            sql = "SELECT check_id, count(*) FROM violations GROUP BY check_id"
            rows = self._conn.execute(sql).fetchall()
            return {str(k): int(n) for k, n in rows}

    # -- query hooks (tracer/query.py): SQL over the schema 2 tables; body decoding only for schema 1 ------

    def _q_summary_rows(self, start: int, stop: int | None, filter: StepFilter | None, *,
                        backward: bool = False) -> Iterator[StepSummary]:
        lo, hi = max(int(start), 0), (2**63 - 1) if stop is None else int(stop)
        conds: list[str] = []
        params: list[Any] = []
        f = filter
        driver: Any = None  # a selective table that lists candidate steps in order
        slow_request: int | None = None
        if f is not None:
            for col, val in (("mode", f.mode), ("model", f.model), ("graph", f.graph), ("iteration", f.iteration)):
                if val is not None:
                    conds.append(f"s.{col} = ?")
                    params.append(val)
            subs: list[tuple[str, list[Any]]] = []
            if f.request_id is not None and self.major < 2:
                slow_request = int(f.request_id)
            if f.check_id is not None:
                subs.append(("violations WHERE check_id = ?", [str(f.check_id)]))
            if f.severity is not None:
                subs.append(("violations WHERE severity = ?", [Severity(f.severity).value]))
            if f.has_violation:
                subs.append(("violations WHERE 1", []))
            if f.request_id is not None and self.major >= 2:
                rid = int(f.request_id)
                driver = lambda lo, hi, n: self._request_steps(rid, lo, hi, n, backward)  # noqa: E731
            elif subs:
                driver = self._violation_driver(*subs.pop(0), backward)
            if subs:
                for table_where, p in subs:
                    conds.append(f"EXISTS (SELECT 1 FROM {table_where} AND step = s.idx)")
                    params.extend(p)
        cols = ", ".join(f"s.{c}" for c in tables.HEADER_COLUMNS)
        nerr = "(SELECT count(*) FROM violations v WHERE v.step = s.idx AND v.severity = 'error')"
        nwarn = "(SELECT count(*) FROM violations v WHERE v.step = s.idx AND v.severity = 'warning')"
        order = "DESC" if backward else "ASC"
        select = f"SELECT {cols}, s.accept_hist, {nerr}, {nwarn} FROM steps s WHERE "
        extra = "".join(f" AND {c}" for c in conds)
        page = _BATCH * 4
        while lo < hi:
            with self._guard(f"reading step summaries from {lo}"):
                if driver is not None:
                    cand, scanned, more = driver(lo, hi, page)
                    if scanned is None:
                        return
                    rows = []
                    if cand:
                        marks = ", ".join("?" * len(cand))
                        rows = self._conn.execute(f"{select}s.idx IN ({marks}){extra} ORDER BY s.idx {order}",
                                                  [*cand, *params]).fetchall()
                    last = scanned
                else:
                    rows = self._conn.execute(f"{select}s.idx >= ? AND s.idx < ?{extra} ORDER BY s.idx {order}"
                                              f" LIMIT {page}", [lo, hi, *params]).fetchall()
                    if not rows:
                        return
                    last, more = int(rows[-1][0]), len(rows) == page
                out = [self._summary_from_row(r) for r in rows]
            if slow_request is not None:
                out = [s for s in out if self._q_step_has_request(s.index, slow_request)]
            yield from out
            if not more:
                return
            if backward:
                hi = last
            else:
                lo = last + 1

    def _violation_driver(self, table_where: str, p: list[Any], backward: bool) -> Any:
        order = "DESC" if backward else "ASC"

        def driver(lo: int, hi: int, n: int) -> tuple[list[int], int | None, bool]:
            cand = [int(r[0]) for r in self._conn.execute(
                f"SELECT DISTINCT step FROM {table_where} AND step >= ? AND step < ? ORDER BY step {order} LIMIT ?",
                [*p, lo, hi, n])]  # fmt: skip
            return cand, (cand[-1] if cand else None), len(cand) == n

        return driver

    def _request_life(self, rid: int) -> tuple[int, int] | None:
        r = self._conn.execute("SELECT first_step, last_step FROM request_life WHERE request_id = ?",
                               (rid,)).fetchone()
        return None if r is None else (int(r[0]), int(r[1]))

    @staticmethod
    def _id_match(rid: int) -> tuple[str, list[bytes]]:
        # step_requests.request_ids holds raw little-endian ids (4 or 8 bytes each); instr() finds candidates
        # in SQLite without decoding, and the caller drops misaligned matches.
        if -(2**31) <= rid < 2**31:
            return ("((id_bytes = 4 AND instr(request_ids, ?) > 0) OR (id_bytes = 8 AND instr(request_ids, ?) > 0))",
                    [struct.pack("<i", rid), struct.pack("<q", rid)])
        return "(id_bytes = 8 AND instr(request_ids, ?) > 0)", [struct.pack("<q", rid)]

    @staticmethod
    def _rows_of(rid: int, id_bytes: int, ids: bytes) -> np.ndarray:
        return np.flatnonzero(np.frombuffer(ids, "<i4" if id_bytes == 4 else "<i8") == rid)

    def _request_steps(self, rid: int, lo: int, hi: int, n: int, backward: bool) -> tuple[list[int], int | None, bool]:
        life = self._request_life(rid)
        if life is None:
            return [], None, False
        lo, hi = max(lo, life[0]), min(hi, life[1] + 1)
        if lo >= hi:
            return [], None, False
        match, needles = self._id_match(rid)
        rows = self._conn.execute(
            f"SELECT step, id_bytes, request_ids FROM step_requests WHERE step >= ? AND step < ? AND {match}"
            f" ORDER BY step {'DESC' if backward else 'ASC'} LIMIT ?", [lo, hi, *needles, n]).fetchall()
        if not rows:
            return [], None, False
        cand = [int(st) for st, w, ids in rows if len(self._rows_of(rid, w, ids))]
        return cand, int(rows[-1][0]), len(rows) == n

    @staticmethod
    def _summary_from_row(r: tuple[Any, ...]) -> StepSummary:
        scalars = json.loads(r[13])
        if not isinstance(scalars, dict):
            raise ValueError("step scalars are not a JSON object")
        hist = r[14]
        return StepSummary(
            index=int(r[0]), iteration=int(r[1]), mode=ForwardMode(r[2]), model=str(r[3]),
            step_id=None if r[4] is None else int(r[4]), batch_size=int(r[5]), padded_batch_size=int(r[6]),
            graph=GraphPhase(r[7]), tokens_per_request=int(r[8]), num_draft_tokens=int(r[9]), page_size=int(r[10]),
            start_ns=int(r[11]), end_ns=int(r[12]), num_errors=int(r[15]), num_warnings=int(r[16]),
            scalars={str(k): int(v) for k, v in scalars.items()},
            accept_hist=tuple(int(x) for x in json.loads(hist)) if hist else (),
        )  # fmt: skip

    def _q_step_has_request(self, i: int, request_id: int) -> bool:
        return any(r.request_id == request_id for r in self.step(i, arrays=()).requests)

    def _q_spans(self, t0: int | None, t1: int | None, steps: tuple[int, int] | None) -> list[SpanRow]:
        if self.major < 2:
            return self._q_spans_v1(t0, t1, steps)
        conds, params = [], []
        if steps is not None:
            conds.append("sp.step >= ? AND sp.step < ?")
            params += [int(steps[0]), int(steps[1])]
        if t1 is not None:
            conds.append("sp.start_ns < ?")
            params.append(int(t1))
        if t0 is not None:
            # spans_start is an index on start_ns; no span is longer than meta max_span_ns, so a span that
            # ends after t0 starts after t0 - max_span_ns, and the index bounds the scan from both sides.
            conds.append("sp.start_ns >= ? AND sp.end_ns > ?")
            params += [int(t0) - self._max_span_ns(), int(t0)]
        where = (" WHERE " + " AND ".join(conds)) if conds else ""
        sql = ("SELECT sp.step, s.model, s.mode, sp.stream, sp.name, sp.start_ns, sp.end_ns FROM spans sp"
               f" JOIN steps s ON s.idx = sp.step{where} ORDER BY sp.start_ns, sp.step, sp.seq")
        with self._guard("reading spans"):
            rows = self._conn.execute(sql, params).fetchall()
            return [SpanRow(int(a), str(m), ForwardMode(md), str(st), str(n), int(b), int(e))
                    for a, m, md, st, n, b, e in rows]

    def _max_span_ns(self) -> int:
        with self._guard("reading its meta table"):
            r = self._conn.execute("SELECT value FROM meta WHERE key = 'max_span_ns'").fetchone()
        return 0 if r is None else int(r[0])

    def _q_spans_v1(self, t0: int | None, t1: int | None, steps: tuple[int, int] | None) -> list[SpanRow]:
        lo, hi = (0, None) if steps is None else (int(steps[0]), int(steps[1]))
        out = []
        for st in self._steps(lo, hi, keep=set()):
            for sp in st.spans:
                if (t0 is None or sp.end_ns > t0) and (t1 is None or sp.start_ns < t1):
                    out.append(SpanRow(st.index, st.model, st.mode, sp.stream, sp.name, sp.start_ns, sp.end_ns))
        out.sort(key=lambda s: (s.start_ns, s.step))
        return out

    def _q_request_rows(self, request_id: int) -> list[RequestRow]:
        if self.major < 2:
            out = []
            for st in self._steps(0, None, keep=set()):
                for r in st.requests:
                    if r.request_id == request_id:
                        out.append(RequestRow(st.index, st.iteration, st.mode, st.model, r.request_id, r.slot,
                                              r.seq_len_before, r.seq_len_after, r.num_q_tokens, r.accept_length))
            return out
        rid = int(request_id)
        out = []
        with self._guard(f"reading the history of request {rid}"):
            life = self._request_life(rid)
            if life is None:
                return []
            match, needles = self._id_match(rid)
            sql = ("SELECT r.step, s.iteration, s.mode, s.model, r.num_requests, r.id_bytes, r.request_ids, r.data"
                   f" FROM step_requests r JOIN steps s ON s.idx = r.step WHERE r.step >= ? AND r.step <= ? AND {match}"
                   " ORDER BY r.step")
            for st, it, md, m, n, w, ids, data in self._conn.execute(sql, [life[0], life[1], *needles]).fetchall():
                js = self._rows_of(rid, w, ids)
                if not len(js):
                    continue
                cols = tables.decode_request_data(data, int(n))[:, js].T.tolist()
                mode = ForwardMode(md)
                for sl, b, af, q, acc in cols:
                    out.append(RequestRow(int(st), int(it), mode, str(m), rid, sl, b, af, q, acc))
        return out

    def _q_capture(self, s: StepSummary) -> int | None:
        # Served by the partial index steps_capture (schema 2): only capture rows are in it.
        sql = ("SELECT max(idx) FROM steps WHERE graph = 'capture' AND model = ? AND mode = ? AND step_id IS ?"
               " AND padded_batch_size = ? AND idx < ?")
        with self._guard(f"finding the capture of step {s.index}"):
            r = self._conn.execute(sql, (s.model, s.mode.value, s.step_id, s.padded_batch_size, s.index)).fetchone()
        return None if r is None or r[0] is None else int(r[0])

    def _q_fault_report(self) -> list[FaultReport]:
        faults = self.run.config.get("faults") or []
        fired: dict[str, tuple[int, int | None]] = {str(f): (0, None) for f in faults}
        if self.major < 2:
            for st in self._steps(0, None, keep=set()):
                for f in st.faults_fired:
                    n, first = fired.get(f, (0, None))
                    fired[f] = (n + 1, st.index if first is None else first)
        else:
            with self._guard("reading fault firings"):
                for f, n, first in self._conn.execute(
                        "SELECT fault, count(*), min(step) FROM fault_firings GROUP BY fault"):
                    fired[str(f)] = (int(n), int(first))
        return [FaultReport(f, n, first) for f, (n, first) in fired.items()]

    def _q_checked_through(self) -> int | None:
        with self._guard("reading its meta table"):
            r = self._conn.execute("SELECT value FROM meta WHERE key = 'checked_through'").fetchone()
        return None if r is None else int(r[0])

    # -- lifetime --------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the file (and remove a bundle's temporary copy)."""
        with self._lock:
            self._conn.close()
            self._remove_bundle_copy()

    def __enter__(self) -> TraceReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
