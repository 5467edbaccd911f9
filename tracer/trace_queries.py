"""The viewers' step queries over an open trace: summary rows and searches, stream spans, a request's history, the
capture a replay came from, fault firings, and how far the trace was checked.

Schema 2 traces answer from their queryable tables in SQL (docs/trace-format.md, "Reader API"), so a viewer never
decodes step bodies it does not show; schema 1 traces, which lack those tables, fall back to decoding step headers.
`TraceReader` owns one `TraceQueries` and delegates its public query methods to it.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from . import tables
from .condition import parse_condition
from .errors import TraceIndexError
from .query import StepFilter, summary_fields
from .schema import FaultReport, ForwardMode, GraphPhase, RequestRow, Severity, SpanRow, StepSummary
from .step_table import BATCH, StepTable
from .trace_file import TraceDb

# Lists candidate step indexes in order: (lo, hi, n) -> (candidates, last index scanned or None when none, more?).
_Driver = Callable[[int, int, int], tuple[list[int], int | None, bool]]


class TraceQueries:
    """Summaries, searches, spans, request histories and captures of one trace (the public contract the TUI, the
    dashboard and the exports build on; `TraceReader` exposes each method under the same name)."""

    def __init__(self, db: TraceDb, major: int, steps: StepTable, faults: list[str]) -> None:
        self.db = db
        self.major = major
        self.steps = steps  # step indexes, and decoded headers for the schema 1 fallbacks
        self.faults = faults  # the faults the run injected (run.config["faults"])

    # -- summaries and searches ------------------------------------------------------------------

    def summaries(self, start: int = 0, stop: int | None = None, filter: StepFilter | None = None) -> list[StepSummary]:
        """Summary rows with start <= index < stop (all steps when stop is None) that match `filter`, by index."""
        return list(self.iter_summaries(start, stop, filter))

    def iter_summaries(
        self, start: int = 0, stop: int | None = None, filter: StepFilter | None = None, *, backward: bool = False
    ) -> Iterator[StepSummary]:
        """Like `summaries`, streamed in batches; `backward` walks from stop-1 down to start."""
        cond = None if filter is None or filter.condition is None else parse_condition(filter.condition)
        prev_by_kind: dict[tuple[str, str], StepSummary] = {}
        prev: StepSummary | None = None
        needs_prev = filter is not None and (filter.bs_change or (filter.condition is not None and "prev" in
                                                                    filter.condition))
        # With a filter that SQL applies, the walk skips steps, so the row before in the walk is not the step
        # before in the trace: then the previous steps are looked up.
        restricted = filter is not None and any(
            v not in (None, False) for v in (filter.mode, filter.model, filter.graph, filter.iteration,
                                             filter.request_id, filter.check_id, filter.severity,
                                             filter.has_violation))  # fmt: skip
        for s in self._summary_rows(start, stop, filter, backward=backward):
            if needs_prev:
                p, pk = self._previous(s, backward or restricted, prev, prev_by_kind)
            else:
                p = pk = None
            prev = s
            prev_by_kind[(s.model, s.mode.value)] = s
            if filter is not None and filter.bs_change and (pk is None or pk.batch_size == s.batch_size):
                continue
            if cond is not None and not cond.evaluate(summary_fields(s), None if p is None else summary_fields(p)):
                continue
            yield s

    def summary(self, i: int) -> StepSummary:
        """The summary row of step `i` (TraceIndexError when absent)."""
        rows = self.summaries(i, i + 1)
        if not rows:
            raise TraceIndexError(f"has no step {i} ({self.steps.steps_text()})", self.db.display_path)
        return rows[0]

    def find_steps(
        self, filter: StepFilter | str, after: int = -1, limit: int | None = 1, *, backward: bool = False
    ) -> list[int]:
        """Indexes of matching steps: forward, the first `limit` with index > after (ascending); with
        `backward=True`, the last `limit` with index < after (descending). `limit=None` means all."""
        f = StepFilter.parse(filter) if isinstance(filter, str) else filter
        if backward:
            rows = self.iter_summaries(0, max(after, 0), f, backward=True)
        else:
            rows = self.iter_summaries(after + 1, None, f)
        out: list[int] = []
        for s in rows:
            out.append(s.index)
            if limit is not None and len(out) >= limit:
                break
        return out

    def _previous(self, s: StepSummary, look_up: bool, prev: StepSummary | None,
                  prev_by_kind: dict[tuple[str, str], StepSummary]) -> tuple[StepSummary | None, StepSummary | None]:
        # `prev` in a condition is the step just before in the trace, whatever the walk direction; `pk` the last
        # step of the same model and mode before it. A forward walk over every step knows both, except for the
        # first rows of the walk (and of each kind), which are looked up.
        # A trace whose indexes skip (a bundle: its steps keep the original run's numbers) knows nothing of the
        # steps in a gap, so neither is taken from across one: `prev` is the step at index - 1 or none (a condition
        # on it is then false, as at the first step), and `pk` only counts with no step missing in between.
        kind = (s.model, s.mode.value)
        p = prev if not look_up and prev is not None and prev.index == s.index - 1 else None
        if p is None and s.index > 0:
            p = next(iter(self._summary_rows(s.index - 1, s.index, None)), None)
        pk = None if look_up else prev_by_kind.get(kind)
        if pk is None and s.index > 0:
            f = StepFilter(mode=s.mode.value, model=s.model)
            pk = next(iter(self._summary_rows(0, s.index, f, backward=True)), None)
        if pk is not None and not self._contiguous(pk.index, s.index):
            pk = None
        return p, pk

    def _contiguous(self, a: int, b: int) -> bool:
        # Every index a..b is present: free for a dense trace (every recorded one), one count query otherwise.
        if self.steps.is_dense():
            return True
        return len(self.steps.step_indexes(a, b + 1)) == b - a + 1

    def _summary_rows(self, start: int, stop: int | None, filter: StepFilter | None, *,
                      backward: bool = False) -> Iterator[StepSummary]:
        lo, hi = max(int(start), 0), (2**63 - 1) if stop is None else int(stop)
        conds: list[str] = []
        params: list[Any] = []
        f = filter
        driver: _Driver | None = None  # a selective table that lists candidate steps in order
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
        page = BATCH * 4
        while lo < hi:
            with self.db.guard(f"reading step summaries from {lo}") as conn:
                if driver is not None:
                    cand, scanned, more = driver(lo, hi, page)
                    if scanned is None:
                        return
                    rows = []
                    if cand:
                        marks = ", ".join("?" * len(cand))
                        rows = conn.execute(f"{select}s.idx IN ({marks}){extra} ORDER BY s.idx {order}",
                                            [*cand, *params]).fetchall()
                    last = scanned
                else:
                    rows = conn.execute(f"{select}s.idx >= ? AND s.idx < ?{extra} ORDER BY s.idx {order}"
                                        f" LIMIT {page}", [lo, hi, *params]).fetchall()
                    if not rows:
                        return
                    last, more = int(rows[-1][0]), len(rows) == page
                out = [_summary_from_row(r) for r in rows]
            if slow_request is not None:
                out = [s for s in out if self._step_has_request(s.index, slow_request)]
            yield from out
            if not more:
                return
            if backward:
                hi = last
            else:
                lo = last + 1

    def _violation_driver(self, table_where: str, p: list[Any], backward: bool) -> _Driver:
        order = "DESC" if backward else "ASC"

        def driver(lo: int, hi: int, n: int) -> tuple[list[int], int | None, bool]:
            cand = [int(r[0]) for r in self.db.conn.execute(
                f"SELECT DISTINCT step FROM {table_where} AND step >= ? AND step < ? ORDER BY step {order} LIMIT ?",
                [*p, lo, hi, n])]  # fmt: skip
            return cand, (cand[-1] if cand else None), len(cand) == n

        return driver

    def _request_life(self, rid: int) -> tuple[int, int] | None:
        r = self.db.conn.execute("SELECT first_step, last_step FROM request_life WHERE request_id = ?",
                                 (rid,)).fetchone()
        return None if r is None else (int(r[0]), int(r[1]))

    def _request_steps(self, rid: int, lo: int, hi: int, n: int, backward: bool) -> tuple[list[int], int | None, bool]:
        life = self._request_life(rid)
        if life is None:
            return [], None, False
        lo, hi = max(lo, life[0]), min(hi, life[1] + 1)
        if lo >= hi:
            return [], None, False
        match, needles = _id_match(rid)
        rows = self.db.conn.execute(
            f"SELECT step, id_bytes, request_ids FROM step_requests WHERE step >= ? AND step < ? AND {match}"
            f" ORDER BY step {'DESC' if backward else 'ASC'} LIMIT ?", [lo, hi, *needles, n]).fetchall()
        if not rows:
            return [], None, False
        cand = [int(st) for st, w, ids in rows if len(_rows_of(rid, w, ids))]
        return cand, int(rows[-1][0]), len(rows) == n

    def _step_has_request(self, i: int, request_id: int) -> bool:
        return any(r.request_id == request_id for r in self.steps.step(i, arrays=()).requests)

    # -- spans, requests, captures ---------------------------------------------------------------

    def spans(
        self, t0_ns: int | None = None, t1_ns: int | None = None, *, steps: tuple[int, int] | None = None
    ) -> list[SpanRow]:
        """Stream spans overlapping [t0_ns, t1_ns) (either bound may be None), or of the steps in
        [steps[0], steps[1]) when `steps` is given; ordered by start time."""
        if self.major < 2:
            return self._spans_v1(t0_ns, t1_ns, steps)
        conds, params = [], []
        if steps is not None:
            conds.append("sp.step >= ? AND sp.step < ?")
            params += [int(steps[0]), int(steps[1])]
        if t1_ns is not None:
            conds.append("sp.start_ns < ?")
            params.append(int(t1_ns))
        if t0_ns is not None:
            # spans_start is an index on start_ns; no span is longer than meta max_span_ns, so a span that
            # ends after t0 starts after t0 - max_span_ns, and the index bounds the scan from both sides.
            conds.append("sp.start_ns >= ? AND sp.end_ns > ?")
            params += [int(t0_ns) - self._max_span_ns(), int(t0_ns)]
        where = (" WHERE " + " AND ".join(conds)) if conds else ""
        sql = ("SELECT sp.step, s.model, s.mode, sp.stream, sp.name, sp.start_ns, sp.end_ns FROM spans sp"
               f" JOIN steps s ON s.idx = sp.step{where} ORDER BY sp.start_ns, sp.step, sp.seq")
        with self.db.guard("reading spans") as conn:
            rows = conn.execute(sql, params).fetchall()
            return [SpanRow(int(a), str(m), ForwardMode(md), str(st), str(n), int(b), int(e))
                    for a, m, md, st, n, b, e in rows]

    def _max_span_ns(self) -> int:
        with self.db.guard("reading its meta table") as conn:
            r = conn.execute("SELECT value FROM meta WHERE key = 'max_span_ns'").fetchone()
        return 0 if r is None else int(r[0])

    def _spans_v1(self, t0: int | None, t1: int | None, steps: tuple[int, int] | None) -> list[SpanRow]:
        lo, hi = (0, None) if steps is None else (int(steps[0]), int(steps[1]))
        out = []
        for st in self.steps.iter_steps(lo, hi, keep=set()):
            for sp in st.spans:
                if (t0 is None or sp.end_ns > t0) and (t1 is None or sp.start_ns < t1):
                    out.append(SpanRow(st.index, st.model, st.mode, sp.stream, sp.name, sp.start_ns, sp.end_ns))
        out.sort(key=lambda s: (s.start_ns, s.step))
        return out

    def request_history(self, request_id: int) -> list[RequestRow]:
        """Every step row of one request, in step order."""
        if self.major < 2:
            out = []
            for st in self.steps.iter_steps(0, None, keep=set()):
                for r in st.requests:
                    if r.request_id == request_id:
                        out.append(RequestRow(st.index, st.iteration, st.mode, st.model, r.request_id, r.slot,
                                              r.seq_len_before, r.seq_len_after, r.num_q_tokens, r.accept_length))
            return out
        rid = int(request_id)
        out = []
        with self.db.guard(f"reading the history of request {rid}") as conn:
            life = self._request_life(rid)
            if life is None:
                return []
            match, needles = _id_match(rid)
            sql = ("SELECT r.step, s.iteration, s.mode, s.model, r.num_requests, r.id_bytes, r.request_ids, r.data"
                   f" FROM step_requests r JOIN steps s ON s.idx = r.step WHERE r.step >= ? AND r.step <= ? AND {match}"
                   " ORDER BY r.step")
            for st, it, md, m, n, w, ids, data in conn.execute(sql, [life[0], life[1], *needles]).fetchall():
                js = _rows_of(rid, w, ids)
                if not len(js):
                    continue
                cols = tables.decode_request_data(data, int(n))[:, js].T.tolist()
                mode = ForwardMode(md)
                for sl, b, af, q, acc in cols:
                    out.append(RequestRow(int(st), int(it), mode, str(m), rid, sl, b, af, q, acc))
        return out

    def capture_of(self, step: int) -> int | None:
        """For a replay step, the index of the capture its graph came from (the last capture of the same model,
        mode, draft step and padded batch size before it); for a capture, itself; None otherwise."""
        s = self.summary(step)
        if s.graph == GraphPhase.CAPTURE:
            return s.index
        if s.graph != GraphPhase.REPLAY:
            return None
        # Served by the partial index steps_capture (schema 2): only capture rows are in it.
        sql = ("SELECT max(idx) FROM steps WHERE graph = 'capture' AND model = ? AND mode = ? AND step_id IS ?"
               " AND padded_batch_size = ? AND idx < ?")
        with self.db.guard(f"finding the capture of step {s.index}") as conn:
            r = conn.execute(sql, (s.model, s.mode.value, s.step_id, s.padded_batch_size, s.index)).fetchone()
        return None if r is None or r[0] is None else int(r[0])

    def fault_report(self) -> list[FaultReport]:
        """For each fault the run injected (run.config["faults"]): how often it fired and first where."""
        fired: dict[str, tuple[int, int | None]] = {str(f): (0, None) for f in self.faults}
        if self.major < 2:
            for st in self.steps.iter_steps(0, None, keep=set()):
                for f in st.faults_fired:
                    n, first = fired.get(f, (0, None))
                    fired[f] = (n + 1, st.index if first is None else first)
        else:
            with self.db.guard("reading fault firings") as conn:
                for f, n, first in conn.execute(
                        "SELECT fault, count(*), min(step) FROM fault_firings GROUP BY fault"):
                    fired[str(f)] = (int(n), int(first))
        return [FaultReport(f, n, first) for f, (n, first) in fired.items()]

    def checked_through(self) -> int | None:
        """The last step index whose violations the catalogue has written (-1: none yet), or None when the
        trace was never checked (a v1 trace, or one recorded with checking off)."""
        with self.db.guard("reading its meta table") as conn:
            r = conn.execute("SELECT value FROM meta WHERE key = 'checked_through'").fetchone()
        return None if r is None else int(r[0])


def _id_match(rid: int) -> tuple[str, list[bytes]]:
    # step_requests.request_ids holds raw little-endian ids (4 or 8 bytes each); instr() finds candidates
    # in SQLite without decoding, and the caller drops misaligned matches.
    if -(2**31) <= rid < 2**31:
        return ("((id_bytes = 4 AND instr(request_ids, ?) > 0) OR (id_bytes = 8 AND instr(request_ids, ?) > 0))",
                [struct.pack("<i", rid), struct.pack("<q", rid)])
    return "(id_bytes = 8 AND instr(request_ids, ?) > 0)", [struct.pack("<q", rid)]


def _rows_of(rid: int, id_bytes: int, ids: bytes) -> np.ndarray:
    return np.flatnonzero(np.frombuffer(ids, "<i4" if id_bytes == 4 else "<i8") == rid)


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
