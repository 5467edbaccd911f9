"""Aggregates over an open trace's steps, in SQL over the header columns (no step body read on schema 2): counts by
a column, run totals, the acceptance histogram, per-bin step and span statistics for overviews of 100k-step runs,
and accept lengths per request."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from . import tables
from .query import SpanBins, StepBins
from .schema import ForwardMode, Severity, SpanRow, Step
from .trace_file import TraceDb

# Steps [start, stop) (stop None: to the end) with the named arrays decoded: the schema 1 fallbacks' source.
StepsReader = Callable[[int, int | None, set[str] | None], Iterator[Step]]


class StepAggregates:
    """Step aggregates of one trace (`TraceReader` exposes each method under the same name)."""

    def __init__(self, db: TraceDb, major: int, read_steps: StepsReader,
                 spans: Callable[..., list[SpanRow]]) -> None:
        self.db = db
        self.major = major
        self.read_steps = read_steps  # schema 1 lacks the request and span tables: decoded steps answer
        self.spans = spans  # TraceQueries.spans (steps=...), for span_bins on schema 1

    def count_steps_by(self, column: str) -> dict[str, int]:
        """Number of steps per value of a header column (mode, graph, model, batch_size, ...)."""
        if column not in tables.STEP_COLUMNS or column in ("scalars", "accept_hist"):
            raise ValueError(f"cannot group steps by {column!r}")
        with self.db.guard(f"counting steps by {column}") as conn:
            rows = conn.execute(f"SELECT {column}, count(*) FROM steps GROUP BY {column}").fetchall()
            return {str(k): int(n) for k, n in rows}

    def step_stats(self) -> dict[str, int | None]:
        """Totals over all steps: steps, iterations, query/drafted tokens, max K, first start, last end."""
        with self.db.guard("summing steps") as conn:
            r = conn.execute(
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
            with self.db.guard("reading acceptance counts") as conn:
                rows = conn.execute(
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

    def step_bins(self, start: int, stop: int, bins: int) -> StepBins:
        """The summary rows of steps [start, stop) in `bins` equal bins of indexes, aggregated in SQL: per bin and
        mode the count and min / max / mean host duration, per bin the batch-size range, capture and replay counts
        and the violations of its steps. A 100k-step trace in a few hundred ms, no step body read."""
        start, stop = int(start), max(int(start) + 1, int(stop))
        nb, edges = _bin_edges(start, stop, bins)
        span = stop - start
        b = f"((idx - {start}) * {nb}) / {span}"
        with self.db.guard("binning step summaries") as conn:
            modes = conn.execute(
                f"SELECT {b} AS b, mode, count(*), min(end_ns - start_ns), max(end_ns - start_ns),"
                " avg(end_ns - start_ns) FROM steps WHERE idx >= ? AND idx < ? GROUP BY b, mode ORDER BY b, mode",
                (start, stop)).fetchall()  # fmt: skip
            per = conn.execute(
                f"SELECT {b} AS b, count(*), min(batch_size), max(batch_size), total(graph = 'capture'),"
                " total(graph = 'replay') FROM steps WHERE idx >= ? AND idx < ? GROUP BY b ORDER BY b",
                (start, stop)).fetchall()  # fmt: skip
            vb = b.replace("idx", "step")
            viol = conn.execute(
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
        nb, edges = _bin_edges(start, stop, bins)
        if self.major < 2:
            rows: list[Any] = []
            acc: dict[tuple[int, str], list[int]] = {}
            for sp in self.spans(steps=(start, stop)):
                a = acc.setdefault(((sp.step - start) * nb // (stop - start), sp.stream), [0, 0, 0])
                d = sp.end_ns - sp.start_ns
                a[0], a[1], a[2] = a[0] + 1, a[1] + d, max(a[2], d)
            rows = [(k[0], k[1], *v) for k, v in sorted(acc.items())]
        else:
            with self.db.guard("binning spans") as conn:
                rows = conn.execute(
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
            for st in self.read_steps(int(start), stop, set()):
                if st.mode == ForwardMode.TARGET_VERIFY:
                    for r in st.requests:
                        if r.accept_length > 0:
                            a = out.setdefault(r.request_id, [0, 0])
                            a[0], a[1] = a[0] + 1, a[1] + r.accept_length
            return {k: (v[0], v[1]) for k, v in out.items()}
        acc_row = tables.STEP_REQUEST_FIELDS.index("accept_length")
        with self.db.guard("reading accept lengths") as conn:
            rows = conn.execute(
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


def _bin_edges(start: int, stop: int, bins: int) -> tuple[int, np.ndarray]:
    n = max(1, stop - start)
    bins = max(1, min(int(bins), n))
    b = np.arange(bins + 1, dtype=np.int64)
    return bins, start + (b * n + bins - 1) // bins  # bin(idx) = (idx - start) * bins // n
