"""TraceReader: validated, read-only access to a trace file (or a bug-report bundle), including one that is still
being written.

The reader opens and validates the file (`trace_file.py`, a bundle's trace through `bundle_file.py`) and composes
what answers the reads: `StepTable` (step indexes, decoded steps), `TraceQueries` (summaries, searches, spans,
requests, captures), `ViolationQueries` and `StepAggregates`. Its public methods are the API every viewer, check
and export reads through; those that a component answers delegate to it.

A bundle's recorded attention calls store their KV pages as changes against earlier calls (`kv_delta.py`); those
calls are in the same trace, so the reader is what resolves them: `kv_base` is the fetch `recorded_call` takes, and
`step` / `steps` resolve each such call as they hand it out (`kv_bases.resolve_ahead`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from typing import Any

from .bundle_file import extract_trace, is_bundle
from .kv_bases import resolve_ahead
from .kv_delta import KV_ARRAYS
from .query import SpanBins, StepBins, StepFilter, ViolationFilter
from .schema import (
    EndState,
    FaultReport,
    RequestRecord,
    RequestRow,
    RunInfo,
    Severity,
    SpanRow,
    Step,
    StepSummary,
    Violation,
)
from .step_aggregates import StepAggregates
from .step_table import StepTable
from .trace_file import TraceDb, check_file, check_meta, open_read_only, read_run
from .trace_queries import TraceQueries
from .violation_queries import ViolationQueries

__all__ = ["TraceReader"]


class TraceReader:
    """Read-only view of one trace; every query sees the steps committed when it runs."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.bundle_path: str | None = None  # set when `path` is a bug-report bundle (.zip)
        self._tmpdir: str | None = None
        self.major = 0
        self._open_bundle()
        try:
            check_file(self.path)
            conn = open_read_only(self.path)
        except BaseException:
            self._remove_bundle_copy()
            raise
        self.db = TraceDb(conn, self.display_path)
        try:
            conn.execute("PRAGMA busy_timeout = 10000")
            self.schema_version, self.major = check_meta(self.db, self.path)
            self.run: RunInfo = read_run(self.db)
        except BaseException:
            self.db.close()
            self._remove_bundle_copy()
            raise
        self.step_table = StepTable(self.db, self.major)
        self.queries = TraceQueries(self.db, self.major, self.step_table, list(self.run.config.get("faults") or []))
        self.violation_queries = ViolationQueries(self.db)
        self.aggregates = StepAggregates(self.db, self.major, self.step_table.iter_steps, self.queries.spans)

    def _open_bundle(self) -> None:
        # Every command opens a bug-report bundle where it opens a trace: its trace.db is read from a private
        # temporary copy, removed at close (so `check --write` on a bundle changes only that copy).
        if not is_bundle(self.path):
            return
        self.bundle_path = self.path
        self._tmpdir = tempfile.mkdtemp(prefix="specscope-bundle-")
        try:
            self.path = extract_trace(self.bundle_path, self._tmpdir)
        except BaseException:
            self._remove_bundle_copy()
            raise

    def _remove_bundle_copy(self) -> None:
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    @property
    def display_path(self) -> str:
        """The file the user named: a bundle's .zip (not its private trace.db copy), else the trace."""
        return self.bundle_path if self.bundle_path is not None else self.path

    # -- the trace -------------------------------------------------------------------------------

    def meta(self) -> dict[str, str]:
        """The `meta` table (magic, schema_version, created_ns, closed_ns, checked_through, upgraded_from, ...)."""
        with self.db.guard("reading its meta table") as conn:
            return {str(k): str(v) for k, v in conn.execute("SELECT key, value FROM meta")}

    def waits_recorded(self) -> bool:
        """Whether the engine recorded wait edges (schema 2 runs; not schema 1 traces, upgraded or not): what the
        catalogue's `Checker(waits_recorded=...)` needs to judge I21 / I22."""
        return self.major >= 2 and "upgraded_from" not in self.meta()

    def is_closed(self) -> bool:
        """True once the writer closed the trace cleanly (False while live, or after a crash)."""
        with self.db.guard("reading its meta table") as conn:
            return conn.execute("SELECT 1 FROM meta WHERE key = 'closed_ns'").fetchone() is not None

    def end_state(self) -> EndState:
        """How the run ended (`meta.end_state`; for a trace without that record, what `closed_ns` says)."""
        with self.db.guard("reading its end state") as conn:
            (last,) = conn.execute("SELECT max(idx) FROM steps").fetchone()
        return EndState.from_meta(self.meta(), None if last is None else int(last))

    def requests(self) -> list[RequestRecord]:
        """Every request record, by request id."""
        with self.db.guard("reading requests") as conn:
            rows = conn.execute("SELECT record FROM requests ORDER BY request_id").fetchall()
            return [RequestRecord.from_dict(json.loads(r[0])) for r in rows]

    # -- steps (StepTable) -----------------------------------------------------------------------

    def num_steps(self) -> int:
        """Steps committed right now (re-queried on every call, so a live trace grows)."""
        return self.step_table.num_steps()

    def last_index(self) -> int | None:
        """The highest step index committed right now (None without steps). A recorded trace holds 0..last; a
        bundle keeps the original run's indexes, so its steps can start later and skip (`step_indexes`)."""
        return self.step_table.last_index()

    def is_dense(self) -> bool:
        """True when the steps are exactly 0..num_steps()-1 (every recorded trace): index == position."""
        return self.step_table.is_dense()

    def step_indexes(self, start: int = 0, stop: int | None = None) -> list[int]:
        """The indexes of the steps with start <= index < stop, ascending (the primary key: no body is read)."""
        return self.step_table.step_indexes(start, stop)

    def has_step(self, i: int) -> bool:
        """Whether the trace holds a step with index `i`."""
        return self.step_table.has_step(i)

    def steps_text(self) -> str:
        """The step indexes the trace holds, for messages: `steps 0–172`, or a bundle's `steps 2, 5, 30–59`."""
        return self.step_table.steps_text()

    def step(self, i: int, arrays: Iterable[str] | None = None) -> Step:
        """The step with index `i` (TraceIndexError, a TraceError and IndexError, if absent).

        `arrays` names the array snapshots to decode (None: all of them; `()`: none, for headers, requests,
        spans and errors only)."""
        st = self.step_table.step(i, arrays)
        resolve_ahead(st, self.kv_base)  # a bundle's delta-coded KV: its base calls are in this trace
        return st

    def steps(self, start: int = 0, stop: int | None = None) -> Iterator[Step]:
        """Steps with start <= index < stop, in index order (fetched in batches)."""
        for st in self.step_table.iter_steps(start, stop, None):
            resolve_ahead(st, self.kv_base)
            yield st

    def step_headers(
        self, start: int = 0, stop: int | None = None, *, mode: str | None = None
    ) -> Iterator[dict[str, Any]]:
        """Header dicts (`Step.header_dict()` keys plus `num_violations`), no arrays: for list views."""
        return self.step_table.step_headers(start, stop, mode=mode)

    def kv_base(self, i: int) -> Step:
        """Step `i` with only the arrays that resolving a bundle's delta-coded KV pages reads: the `fetch` that
        `attention_call.recorded_call` and `kv_bases.stored_kv` take (the base calls are in this same trace)."""
        return self.step_table.step(i, KV_ARRAYS)

    def wait_for_steps(self, after: int, timeout: float) -> int:
        """Block until a step with index > `after` is committed, the writer closes the trace, or `timeout`
        seconds pass; returns `num_steps()`."""
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            n = self.num_steps()
            last = self.last_index()  # an index, not the count: a bundle's indexes start late and skip
            if (last is not None and last > after) or self.is_closed() or time.monotonic() >= deadline:
                return n
            time.sleep(min(0.02, max(0.0, deadline - time.monotonic())))

    # -- summaries, searches, spans, requests, captures (TraceQueries) ----------------------------

    def summaries(self, start: int = 0, stop: int | None = None, filter: StepFilter | None = None) -> list[StepSummary]:
        """Summary rows with start <= index < stop (all steps when stop is None) that match `filter`, by index."""
        return self.queries.summaries(start, stop, filter)

    def iter_summaries(
        self, start: int = 0, stop: int | None = None, filter: StepFilter | None = None, *, backward: bool = False
    ) -> Iterator[StepSummary]:
        """Like `summaries`, streamed in batches; `backward` walks from stop-1 down to start."""
        return self.queries.iter_summaries(start, stop, filter, backward=backward)

    def summary(self, i: int) -> StepSummary:
        """The summary row of step `i` (TraceIndexError when absent)."""
        return self.queries.summary(i)

    def find_steps(
        self, filter: StepFilter | str, after: int = -1, limit: int | None = 1, *, backward: bool = False
    ) -> list[int]:
        """Indexes of matching steps: forward, the first `limit` with index > after (ascending); with
        `backward=True`, the last `limit` with index < after (descending). `limit=None` means all."""
        return self.queries.find_steps(filter, after, limit, backward=backward)

    def spans(
        self, t0_ns: int | None = None, t1_ns: int | None = None, *, steps: tuple[int, int] | None = None
    ) -> list[SpanRow]:
        """Stream spans overlapping [t0_ns, t1_ns) (either bound may be None), or of the steps in
        [steps[0], steps[1]) when `steps` is given; ordered by start time."""
        return self.queries.spans(t0_ns, t1_ns, steps=steps)

    def request_history(self, request_id: int) -> list[RequestRow]:
        """Every step row of one request, in step order."""
        return self.queries.request_history(request_id)

    def capture_of(self, step: int) -> int | None:
        """For a replay step, the index of the capture its graph came from; for a capture, itself; else None."""
        return self.queries.capture_of(step)

    def fault_report(self) -> list[FaultReport]:
        """For each fault the run injected (run.config["faults"]): how often it fired and first where."""
        return self.queries.fault_report()

    def checked_through(self) -> int | None:
        """The last step index whose violations the catalogue has written (-1: none yet), or None when the
        trace was never checked (a v1 trace, or one recorded with checking off)."""
        return self.queries.checked_through()

    # -- violations (ViolationQueries) -----------------------------------------------------------

    def violations(self, *, step: int | None = None, check_id: str | None = None,
                   severity: str | Severity | None = None, source: str | None = None) -> list[Violation]:
        """Violations (recorded and appended by checkers), by step; filters combine with AND."""
        return self.violation_queries.violations(step=step, check_id=check_id, severity=severity, source=source)

    def violations_page(self, filter: ViolationFilter | None = None, offset: int = 0,
                        limit: int | None = 100) -> list[Violation]:
        """The violations matching `filter`, by step, from the `offset`-th on, at most `limit` (None: all)."""
        return self.violation_queries.violations_page(filter, offset, limit)

    def count_violations(self, filter: ViolationFilter | None = None) -> int:
        """How many violations match `filter` (one SQL count)."""
        return self.violation_queries.count_violations(filter)

    def violation_position(self, filter: ViolationFilter | None, step: int, check_id: str) -> int | None:
        """The offset in `violations_page(filter)` of the first violation of `check_id` at `step` (None: none)."""
        return self.violation_queries.violation_position(filter, step, check_id)

    def violation_sources(self) -> dict[str, int]:
        """Number of violations per source (`recorder`, `check`, ...)."""
        return self.violation_queries.violation_sources()

    def count_violations_by_id(self) -> dict[str, int]:
        """Number of violations per check id."""
        return self.violation_queries.count_violations_by_id()

    # -- aggregates (StepAggregates) -------------------------------------------------------------

    def count_steps_by(self, column: str) -> dict[str, int]:
        """Number of steps per value of a header column (mode, graph, model, batch_size, ...)."""
        return self.aggregates.count_steps_by(column)

    def step_stats(self) -> dict[str, int | None]:
        """Totals over all steps: steps, iterations, query/drafted tokens, max K, first start, last end."""
        return self.aggregates.step_stats()

    def accept_histogram(self) -> list[int]:
        """Element L = number of TARGET_VERIFY request rows (all steps) whose accept_length is L."""
        return self.aggregates.accept_histogram()

    def step_bins(self, start: int, stop: int, bins: int) -> StepBins:
        """The summary rows of steps [start, stop) aggregated in `bins` equal bins of indexes (in SQL)."""
        return self.aggregates.step_bins(start, stop, bins)

    def span_bins(self, start: int, stop: int, bins: int) -> SpanBins:
        """The stream spans of steps [start, stop) aggregated per bin of step indexes and stream (in SQL)."""
        return self.aggregates.span_bins(start, stop, bins)

    def accept_lengths_by_request(self, start: int = 0, stop: int | None = None) -> dict[int, tuple[int, int]]:
        """Request id -> (verify rows, summed accept length) over the TARGET_VERIFY steps in [start, stop)."""
        return self.aggregates.accept_lengths_by_request(start, stop)

    # -- lifetime --------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the file (and remove a bundle's temporary copy)."""
        with self.db.lock:
            self.db.close()
            self._remove_bundle_copy()

    def __enter__(self) -> TraceReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
