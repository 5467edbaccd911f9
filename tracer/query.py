"""The vocabulary of the reader's query API for viewers: what a search or a violation list asks for (`StepFilter`,
`ViolationFilter`), what binned overviews return (`StepBins`, `SpanBins`), the fields a condition sees, and
`StepIndex`, which maps a trace's step indexes to row positions.

The queries themselves run in `trace_queries.py`, `violation_queries.py` and `step_aggregates.py`, which
`TraceReader` owns. This module defines the contract the TUI, the dashboard and the exports build on; keep
signatures stable.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from .schema import ForwardMode, GraphPhase, Severity, StepSummary

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


class StepSource(Protocol):
    """What `StepIndex` reads of a trace (a `TraceReader` is one)."""

    def num_steps(self) -> int:
        """Steps committed right now."""
        ...

    def is_dense(self) -> bool:
        """True when index == position for every step."""
        ...

    def step_indexes(self, start: int = 0, stop: int | None = None) -> list[int]:
        """The indexes of the steps with start <= index < stop, ascending."""
        ...


class StepIndex:
    """Positions 0..n-1 of a trace's steps <-> their indexes, for viewers that lay steps out in rows.

    A recorded trace is dense (index == position) and costs nothing here; a bundle keeps the original run's
    indexes (its range, plus the captures it adds before it), so it skips. `refresh` follows a growing trace
    (indexes only grow). Lookups never query: they read the list `refresh` keeps."""

    def __init__(self, reader: StepSource) -> None:
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


def severity_of(name: str) -> Severity:
    """`Severity` from its value."""
    return Severity(name)


__all__ = ["SpanBins", "StepBins", "StepFilter", "StepIndex", "StepSource", "ViolationFilter", "index_runs",
           "index_runs_text", "summary_fields", "replace"]
