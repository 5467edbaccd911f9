"""The reader's query API for viewers: step summaries, searches, spans, request histories, captures, live follow.

Everything here is torch-free and answers from the trace's queryable tables (docs/trace-format.md, "Reader
API"), so a viewer never decodes step bodies it does not show. `TraceReader` inherits `QueryMixin`.

This module defines the contract the TUI, the dashboard and the exports build on; keep signatures stable.
"""

from __future__ import annotations

import bisect
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from .schema import (
    FaultReport,
    ForwardMode,
    GraphPhase,
    RequestRow,
    Severity,
    SpanRow,
    Step,
    StepSummary,
)

if TYPE_CHECKING:
    from .condition import Condition

_MODES = {m.value: m.value for m in ForwardMode} | {
    "VERIFY": "TARGET_VERIFY", "DRAFT": "DRAFT_DECODE", "PREFILL": "EXTEND",
}  # fmt: skip
_GRAPHS = {g.value for g in GraphPhase}
_CHECK_ID = re.compile(r"^[A-Z]\d+$")
_REQUEST = re.compile(r"^(?:req(?:uest)?\s*|r)(\d+)$", re.IGNORECASE)


@dataclass(frozen=True)
class StepFilter:
    """Which steps a summary or a search wants; every field that is set must hold (AND).

    `condition` is an expression over summary fields in the small syntax of `tracer/condition.py`, e.g.
    `mode == TARGET_VERIFY and bs != prev.bs`. `bs_change` selects steps whose batch size differs from the
    previous step of the same model and mode.
    """

    mode: str | None = None
    model: str | None = None
    graph: str | None = None
    iteration: int | None = None
    request_id: int | None = None  # steps whose batch holds this request
    check_id: str | None = None  # steps with a violation of this check
    severity: str | None = None  # steps with a violation of this severity
    has_violation: bool = False
    bs_change: bool = False
    condition: str | None = None

    @classmethod
    def parse(cls, text: str) -> StepFilter:
        """A search-box text: `request 12` / `r12`, a check id (`I6`), a mode (`TARGET_VERIFY`, `verify`),
        a graph phase (`replay`), `violation` / `error` / `warning`, `bs change`, or else a condition.

        Raises `ConditionError` (a ValueError with a one-line message) when the text is none of these.
        """
        t = " ".join(text.split())
        if not t:
            raise _condition_error("empty search")
        m = _REQUEST.match(t)
        if m:
            return cls(request_id=int(m.group(1)))
        up = t.upper()
        if _CHECK_ID.match(up):
            return cls(check_id=up)
        if up in _MODES:
            return cls(mode=_MODES[up])
        if t.lower() in _GRAPHS:
            return cls(graph=t.lower())
        if t.lower() in ("violation", "violations"):
            return cls(has_violation=True)
        if t.lower() in ("error", "errors", "warning", "warnings"):
            return cls(severity=t.lower().rstrip("s"))
        if t.lower() in ("bs change", "bs-change", "batch change"):
            return cls(bs_change=True)
        from .condition import parse_condition

        parse_condition(t)  # validates now, so a bad search fails at once with its one-line message
        return cls(condition=t)


@dataclass(frozen=True)
class ViolationFilter:
    """Which violations a list wants; every field that is set must hold (AND). Steps are indexes, [start, stop)."""

    check_ids: tuple[str, ...] = ()  # any of these invariants (empty: all)
    severity: str | None = None
    mode: str | None = None  # the forward mode of the violation's step
    request_id: int | None = None
    start: int | None = None
    stop: int | None = None
    text: str | None = None  # a case-insensitive substring of the message


@dataclass(frozen=True)
class StepBins:
    """Summary rows aggregated per bin of step indexes (`TraceReader.step_bins`): numpy arrays, one entry per
    non-empty (bin, mode) pair for the duration fields and one per non-empty bin for the others."""

    edges: Any  # int64 [bins + 1]: bin b holds steps edges[b] <= index < edges[b + 1]
    mode_bin: Any  # int64: the bin of each (bin, mode) row
    mode: Any  # str: its forward mode
    count: Any  # int64: steps of that mode in the bin
    dur_min_ns: Any  # int64
    dur_max_ns: Any  # int64
    dur_mean_ns: Any  # float64
    bin: Any  # int64: the bins with steps, for the fields below
    steps: Any  # int64
    bs_min: Any  # int64
    bs_max: Any  # int64
    captures: Any  # int64: capture steps in the bin
    replays: Any  # int64
    errors: Any  # int64: error violations of the bin's steps
    warnings: Any  # int64


@dataclass(frozen=True)
class SpanBins:
    """Stream spans aggregated per bin of step indexes (`TraceReader.span_bins`), one entry per (bin, stream)."""

    edges: Any  # int64 [bins + 1], as in StepBins
    bin: Any  # int64
    stream: Any  # str
    count: Any  # int64: spans
    busy_ns: Any  # int64: summed span durations (spans of one stream within a step do not overlap)
    max_ns: Any  # int64: the longest span


def _condition_error(msg: str) -> Exception:
    from .condition import ConditionError

    return ConditionError(msg)


def summary_fields(s: StepSummary) -> dict[str, Any]:
    """The names a condition can use for one summary row (aliases included; scalars by their own names)."""
    d: dict[str, Any] = dict(s.scalars)
    d.update(
        index=s.index, step=s.index, iteration=s.iteration, mode=s.mode.value, model=s.model,
        step_id=s.step_id, batch_size=s.batch_size, bs=s.batch_size, padded_batch_size=s.padded_batch_size,
        padded_bs=s.padded_batch_size, graph=s.graph.value, tokens_per_request=s.tokens_per_request,
        T=s.tokens_per_request, num_draft_tokens=s.num_draft_tokens, K=s.num_draft_tokens, page_size=s.page_size,
        start_ns=s.start_ns, end_ns=s.end_ns, duration_ns=s.duration_ns, duration_us=s.duration_ns // 1000,
        errors=s.num_errors, warnings=s.num_warnings, violations=s.num_violations,
    )  # fmt: skip
    return d


class QueryMixin:
    """Viewer queries over a trace. The methods below are the public contract; `_q_*` hooks are internal."""

    # Provided by TraceReader, which overrides every one of these.
    def num_steps(self) -> int:
        raise NotImplementedError

    def step(self, i: int, arrays: Iterable[str] | None = None) -> Step:
        raise NotImplementedError

    def is_dense(self) -> bool:
        raise NotImplementedError

    def last_index(self) -> int | None:
        raise NotImplementedError

    def step_indexes(self, start: int = 0, stop: int | None = None) -> list[int]:
        raise NotImplementedError

    def steps_text(self) -> str:
        raise NotImplementedError

    def is_closed(self) -> bool:
        raise NotImplementedError

    # -- summaries and searches ------------------------------------------------------------------

    def summaries(self, start: int = 0, stop: int | None = None, filter: StepFilter | None = None) -> list[StepSummary]:
        """Summary rows with start <= index < stop (all steps when stop is None) that match `filter`, by index."""
        return list(self.iter_summaries(start, stop, filter))

    def iter_summaries(
        self, start: int = 0, stop: int | None = None, filter: StepFilter | None = None, *, backward: bool = False
    ) -> Iterator[StepSummary]:
        """Like `summaries`, streamed in batches; `backward` walks from stop-1 down to start."""
        cond = None if filter is None or filter.condition is None else _parse(filter.condition)
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
        for s in self._q_summary_rows(start, stop, filter, backward=backward):
            if needs_prev:
                p, pk = self._q_previous(s, backward or restricted, prev, prev_by_kind)
            else:
                p = pk = None
            prev = s
            prev_by_kind[(s.model, s.mode.value)] = s
            if filter is not None and filter.bs_change and (pk is None or pk.batch_size == s.batch_size):
                continue
            if cond is not None and not cond.evaluate(summary_fields(s), None if p is None else summary_fields(p)):
                continue
            yield s

    def _q_previous(self, s: StepSummary, look_up: bool, prev: StepSummary | None,
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
            p = next(iter(self._q_summary_rows(s.index - 1, s.index, None)), None)
        pk = None if look_up else prev_by_kind.get(kind)
        if pk is None and s.index > 0:
            f = StepFilter(mode=s.mode.value, model=s.model)
            pk = next(iter(self._q_summary_rows(0, s.index, f, backward=True)), None)
        if pk is not None and not self._q_contiguous(pk.index, s.index):
            pk = None
        return p, pk

    def _q_contiguous(self, a: int, b: int) -> bool:
        # Every index a..b is present: free for a dense trace (every recorded one), one count query otherwise.
        if self.is_dense():
            return True
        return len(self.step_indexes(a, b + 1)) == b - a + 1

    def summary(self, i: int) -> StepSummary:
        """The summary row of step `i` (TraceIndexError when absent)."""
        rows = self.summaries(i, i + 1)
        if not rows:
            from .errors import TraceIndexError

            raise TraceIndexError(f"has no step {i} ({self.steps_text()})", getattr(self, "display_path", None))
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

    # -- spans, requests, captures ---------------------------------------------------------------

    def spans(
        self, t0_ns: int | None = None, t1_ns: int | None = None, *, steps: tuple[int, int] | None = None
    ) -> list[SpanRow]:
        """Stream spans overlapping [t0_ns, t1_ns) (either bound may be None), or of the steps in
        [steps[0], steps[1]) when `steps` is given; ordered by start time."""
        return self._q_spans(t0_ns, t1_ns, steps)

    def request_history(self, request_id: int) -> list[RequestRow]:
        """Every step row of one request, in step order."""
        return self._q_request_rows(request_id)

    def capture_of(self, step: int) -> int | None:
        """For a replay step, the index of the capture its graph came from (the last capture of the same model,
        mode, draft step and padded batch size before it); for a capture, itself; None otherwise."""
        s = self.summary(step)
        if s.graph == GraphPhase.CAPTURE:
            return s.index
        if s.graph != GraphPhase.REPLAY:
            return None
        return self._q_capture(s)

    def fault_report(self) -> list[FaultReport]:
        """For each fault the run injected (run.config["faults"]): how often it fired and first where."""
        return self._q_fault_report()

    def checked_through(self) -> int | None:
        """The last step index whose violations the catalogue has written (-1: none yet), or None when the
        trace was never checked (a v1 trace, or one recorded with checking off)."""
        return self._q_checked_through()

    # -- live traces -----------------------------------------------------------------------------

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

    # -- internal hooks, implemented by TraceReader --------------------------------------------------

    def _q_summary_rows(self, start: int, stop: int | None, filter: StepFilter | None, *,
                        backward: bool = False) -> Iterable[StepSummary]:
        raise NotImplementedError

    def _q_spans(self, t0: int | None, t1: int | None, steps: tuple[int, int] | None) -> list[SpanRow]:
        raise NotImplementedError

    def _q_request_rows(self, request_id: int) -> list[RequestRow]:
        raise NotImplementedError

    def _q_capture(self, s: StepSummary) -> int | None:
        raise NotImplementedError

    def _q_fault_report(self) -> list[FaultReport]:
        raise NotImplementedError

    def _q_checked_through(self) -> int | None:
        raise NotImplementedError


def index_runs(indexes: Sequence[int]) -> list[tuple[int, int]]:
    """Ascending indexes as runs of consecutive ones, (first, last) inclusive: [2, 5, 6, 7] -> [(2, 2), (5, 7)]."""
    runs: list[tuple[int, int]] = []
    for i in indexes:
        if runs and i == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs


def index_runs_text(indexes: Sequence[int], max_runs: int = 8) -> str:
    """`2, 5, 30–59` for a message (the first `max_runs` runs, then `…`); `none` when empty."""
    runs = index_runs(indexes)
    parts = [str(a) if a == b else f"{a}–{b}" for a, b in runs[:max_runs]]
    return ", ".join(parts) + (", …" if len(runs) > max_runs else "") if parts else "none"


class StepIndex:
    """Positions 0..n-1 of a trace's steps <-> their indexes, for viewers that lay steps out in rows.

    A recorded trace is dense (index == position) and costs nothing here; a bundle keeps the original run's
    indexes (its range, plus the captures it adds before it), so it skips. `refresh` follows a growing trace
    (indexes only grow). Lookups never query: they read the list `refresh` keeps."""

    def __init__(self, reader: QueryMixin) -> None:
        self.reader = reader
        self._n = 0
        self._idx: list[int] | None = None  # None while dense: position p is index p
        self.refresh()

    def refresh(self) -> int:
        """Count the steps committed since the last call; returns how many there are now."""
        n = self.reader.num_steps()
        if n == self._n:
            return n
        if self._idx is None and self.reader.is_dense():
            self._n = n
            return n
        if self._idx is None:
            self._idx = self.reader.step_indexes()
        else:
            self._idx.extend(self.reader.step_indexes(self._idx[-1] + 1 if self._idx else 0))
        self._n = len(self._idx)
        return self._n

    def __len__(self) -> int:
        return self._n

    @property
    def dense(self) -> bool:
        """True when index == position for every step."""
        return self._idx is None

    def at(self, pos: int) -> int:
        """The index of the step at position `pos` (IndexError outside 0..n-1)."""
        if not 0 <= pos < self._n:
            raise IndexError(f"position {pos} outside 0..{self._n - 1}")
        return pos if self._idx is None else self._idx[pos]

    def position(self, index: int) -> int | None:
        """The position of the step with this index (None when the trace does not hold it)."""
        if self._idx is None:
            return index if 0 <= index < self._n else None
        k = bisect.bisect_left(self._idx, index, 0, self._n)
        return k if k < self._n and self._idx[k] == index else None

    def nearest(self, index: int) -> int:
        """The position of the held step nearest to `index` (the later one on a tie; 0 without steps)."""
        if self._n == 0:
            return 0
        if self._idx is None:
            return max(0, min(self._n - 1, index))
        k = bisect.bisect_left(self._idx, index, 0, self._n)
        if k >= self._n:
            return self._n - 1
        if k > 0 and index - self._idx[k - 1] < self._idx[k] - index:
            return k - 1
        return k

    def first_at_or_after(self, index: int) -> int:
        """The position of the first step with index >= `index` (n when there is none)."""
        if self._idx is None:
            return max(0, min(self._n, index))
        return bisect.bisect_left(self._idx, index, 0, self._n)

    def snap(self, index: int) -> int:
        """`index` when held, else the index of the nearest held step."""
        return self.at(self.nearest(index))

    def offset(self, index: int, k: int) -> int:
        """The index of the step `k` positions after (k < 0: before) the step at `index`, clamped to the trace."""
        p = self.nearest(index)
        return self.at(max(0, min(self._n - 1, p + k)))

    def first(self) -> int | None:
        """The lowest index (None without steps)."""
        return self.at(0) if self._n else None

    def last(self) -> int | None:
        """The highest index (None without steps)."""
        return self.at(self._n - 1) if self._n else None

    def between(self, start: int, stop: int) -> list[int]:
        """The held indexes with start <= index < stop."""
        if self._idx is None:
            return list(range(max(0, start), min(stop, self._n)))
        a = bisect.bisect_left(self._idx, start, 0, self._n)
        b = bisect.bisect_left(self._idx, stop, 0, self._n)
        return self._idx[a:b]

    def run_of(self, index: int) -> tuple[int, int]:
        """The (first, last) indexes of the run of consecutive held indexes around `index` (a held one)."""
        if self._idx is None:
            return 0, self._n - 1
        idx, p = self._idx, self.nearest(index)
        d = idx[p] - p  # index - position never falls, and stays the same along a run: bisect on it
        lo, hi = 0, p
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (mid + 1, hi) if idx[mid] - mid < d else (lo, mid)
        a, lo, hi = lo, p, self._n - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if idx[mid] - mid == d else (lo, mid - 1)
        return idx[a], idx[lo]

    def text(self) -> str:
        """`steps 0–172`, or for a trace that skips `steps 2, 5, 30–59` (for messages)."""
        if self._n == 0:
            return "no steps"
        if self._idx is None:
            return f"steps 0–{self._n - 1}"
        return "steps " + index_runs_text(self._idx[: self._n])


def _parse(text: str) -> Condition:
    from .condition import parse_condition

    return parse_condition(text)


def severity_of(name: str) -> Severity:
    """`Severity` from its value."""
    return Severity(name)


__all__ = ["QueryMixin", "SpanBins", "StepBins", "StepFilter", "StepIndex", "ViolationFilter", "index_runs",
           "index_runs_text", "summary_fields", "replace"]
