"""Dashboard view models: pure functions from trace records (summary columns, spans, steps) to rows and series.

The step-level models (detail rows, request rows, the classified page-table grid, acceptance statistics) come
from `specscope.ui.views`, shared with the TUI; this module adds what only the dashboard needs: binning for
large traces, stream overlap and GPU idle gaps per step, acceptance series, violation groups.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypedDict

import numpy as np
from specscope.tracer.schema import ForwardMode, GraphPhase, SpanRow, Step, Violation
from specscope.ui.views import AcceptanceStats, CellMark, acceptance_from_histogram, check_key

from .source import GRAPHS, MODES, Columns

MAX_POINTS = 10_000  # beyond this many points a series is binned server-side
NUM_BINS = 1_000  # bins of a binned series (a plot is ~1,000 px wide)
VERIFY = MODES.index(ForwardMode.TARGET_VERIFY.value)


# -- binning -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Series:
    """A series as the browser gets it: raw points, or per-bin mean / min / max when `binned`."""

    x: np.ndarray  # step index (bin centre when binned)
    y: np.ndarray  # value (bin mean when binned)
    y_min: np.ndarray
    y_max: np.ndarray
    count: np.ndarray  # points per bin (1 when raw)
    binned: bool

    def __len__(self) -> int:
        return len(self.x)


def bin_series(x: np.ndarray, y: np.ndarray, max_points: int = MAX_POINTS, bins: int = NUM_BINS) -> Series:
    """`x, y` unchanged when there are at most `max_points`, else `bins` equal-width bins over x with the mean,
    minimum and maximum of y in each (empty bins dropped), so a spike is never lost to averaging. Binned values
    are float32 rounded to 2 decimals: what a screen can show, and short in JSON."""
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    if len(x) <= max(max_points, 0) or len(x) <= 1:
        return Series(x, y, y, y, np.ones(len(x), np.int64), False)
    lo, hi = float(x.min()), float(x.max())
    edges = np.linspace(lo, hi, bins + 1)
    which = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, bins - 1)
    count = np.bincount(which, minlength=bins)
    total = np.bincount(which, weights=y, minlength=bins)
    ymin = np.full(bins, np.inf)
    ymax = np.full(bins, -np.inf)
    np.minimum.at(ymin, which, y)
    np.maximum.at(ymax, which, y)
    keep = count > 0
    centre = (edges[:-1] + edges[1:]) / 2
    def f4(v: np.ndarray) -> np.ndarray:
        return np.round(v, 2).astype(np.float32)

    return Series(f4(centre[keep]), f4(total[keep] / count[keep]), f4(ymin[keep]), f4(ymax[keep]), count[keep], True)


# -- timeline ------------------------------------------------------------------------------------------------


def step_durations(cols: Columns, start: int = 0, stop: int | None = None) -> dict[str, Series]:
    """Host duration per step in µs over step index (`start`, `stop`: an index range), one series per forward mode;
    beyond MAX_POINTS steps in all, every mode is binned (so the overview carries at most NUM_BINS points per series
    whatever the mix of modes)."""
    sl = cols.rows(start, stop)
    idx = cols.index[sl]  # a bundle's indexes skip: x is the step's own number, never its row
    dur = (cols.end_ns[sl] - cols.start_ns[sl]) / 1e3
    mode = cols.mode[sl]
    limit = 0 if len(idx) > MAX_POINTS else MAX_POINTS
    out = {}
    for code, name in enumerate(MODES):
        sel = mode == code
        if sel.any():
            out[name] = bin_series(idx[sel], dur[sel], max_points=limit)
    return out


@dataclass(frozen=True)
class StepStreams:
    """One step's stream time: plan work and how much of it ran while the compute stream was busy."""

    step: int
    plan_ns: int
    plan_hidden_ns: int
    compute_ns: int
    idle_before_ns: int  # compute-stream gap between the previous compute span and this step's first one

    @property
    def hidden_share(self) -> float | None:
        """Share of plan time hidden under compute (None without plan work)."""
        return self.plan_hidden_ns / self.plan_ns if self.plan_ns else None


@dataclass(frozen=True)
class Gap:
    """A gap on the compute stream (the GPU idle between two compute spans)."""

    start_ns: int
    end_ns: int
    after_step: int
    before_step: int


def _union(iv: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _overlap(a: int, b: int, union: list[tuple[int, int]]) -> int:
    lo = np.searchsorted([u[1] for u in union], a, side="right")
    total = 0
    for s, e in union[lo:]:
        if s >= b:
            break
        total += max(0, min(b, e) - max(a, s))
    return total


def step_streams(spans: Sequence[SpanRow]) -> tuple[list[StepStreams], list[Gap]]:
    """Per-step plan/compute overlap and the compute-stream idle gaps, from the spans of a window of steps.

    A plan span counts as hidden while any compute span (of any step) runs, since that is what hides it. A span
    several steps share (the producers of verify and draft extend, the draft loop's metadata) counts once, for the
    first of them, so totals over the window count its time once."""
    seen: set[tuple[str, str, int, int]] = set()  # the models share the GPU streams: the model is not in the key
    steps = sorted({s.step for s in spans})  # every step keeps its row, even with all its spans counted elsewhere
    unique = []
    for s in sorted(spans, key=lambda s: s.step):
        key = (s.stream, s.name, s.start_ns, s.end_ns)
        if key not in seen:
            seen.add(key)
            unique.append(s)
    spans = unique
    compute = [s for s in spans if s.stream == "compute"]
    union = _union((s.start_ns, s.end_ns) for s in compute)
    by_step: dict[int, list[SpanRow]] = defaultdict(list)
    for s in spans:
        by_step[s.step].append(s)
    gaps: list[Gap] = []
    ordered = sorted(compute, key=lambda s: (s.start_ns, s.step))
    idle_before: dict[int, int] = {}
    end: int | None = None
    end_step = 0  # the step of the span that ends at `end` (set together with it)
    for s in ordered:
        if end is not None and s.start_ns > end:
            gaps.append(Gap(end, s.start_ns, int(end_step), s.step))
            idle_before[s.step] = idle_before.get(s.step, 0) + s.start_ns - end
        if end is None or s.end_ns > end:
            end, end_step = s.end_ns, s.step
    rows = []
    for step in steps:
        plan = [(s.start_ns, s.end_ns) for s in by_step[step] if s.stream == "plan"]
        comp = _union((s.start_ns, s.end_ns) for s in by_step[step] if s.stream == "compute")
        rows.append(StepStreams(
            step=step, plan_ns=sum(b - a for a, b in plan), plan_hidden_ns=sum(_overlap(a, b, union) for a, b in plan),
            compute_ns=sum(b - a for a, b in comp), idle_before_ns=idle_before.get(step, 0),
        ))  # fmt: skip
    return rows, gaps


class StreamTotals(TypedDict):
    """`stream_totals` of a window of steps."""

    plan_ns: int
    plan_hidden_share: float | None  # None without plan work
    compute_ns: int
    idle_ns: int
    idle_share: float | None  # of compute busy + idle time; None when both are 0
    gaps: int


def stream_totals(rows: Sequence[StepStreams], gaps: Sequence[Gap]) -> StreamTotals:
    """Totals over a window: plan time, its hidden share, compute busy time and idle share."""
    plan = sum(r.plan_ns for r in rows)
    hidden = sum(r.plan_hidden_ns for r in rows)
    busy = sum(r.compute_ns for r in rows)
    idle = sum(g.end_ns - g.start_ns for g in gaps)
    return {"plan_ns": plan, "plan_hidden_share": hidden / plan if plan else None, "compute_ns": busy,
            "idle_ns": idle, "idle_share": idle / (busy + idle) if busy + idle else None, "gaps": len(gaps)}


# -- acceptance ----------------------------------------------------------------------------------------------


def verify_mask(cols: Columns) -> np.ndarray:
    """Which steps are TARGET_VERIFY steps with an accept histogram."""
    mask: np.ndarray = (cols.mode == VERIFY) & (cols.accept_hist.sum(axis=1) > 0)
    return mask


def acceptance(cols: Columns, start: int = 0, stop: int | None = None) -> AcceptanceStats:
    """Acceptance statistics of the verify steps with start <= index < stop (views.acceptance_from_histogram)."""
    sl = cols.rows(start, stop)
    m = verify_mask(cols)[sl]
    h = cols.accept_hist[sl][m]
    rows_per_step = h.sum(axis=1)
    drafted = int((rows_per_step * np.maximum(cols.tokens_per_request[sl][m] - 1, 0)).sum())
    hist = h.sum(axis=0).tolist()
    while hist and hist[-1] == 0:
        hist.pop()
    return acceptance_from_histogram(hist, int(m.sum()), drafted)


def mean_accept_per_step(cols: Columns) -> Series:
    """Mean accept length of each verify step over step index (binned beyond MAX_POINTS)."""
    m = verify_mask(cols)
    h = cols.accept_hist[m].astype(np.float64)
    lengths = np.arange(h.shape[1])
    mean = (h * lengths).sum(axis=1) / h.sum(axis=1)
    return bin_series(cols.index[m], mean)


@dataclass(frozen=True)
class GroupRow:
    """Acceptance of the verify steps that share one key (batch size, or request)."""

    key: int
    steps: int
    rows: int
    mean_accept_length: float


def acceptance_by_batch_size(cols: Columns) -> list[GroupRow]:
    """Mean accept length of verify rows grouped by the step's live batch size."""
    m = verify_mask(cols)
    h = cols.accept_hist[m].astype(np.int64)
    bs = cols.batch_size[m]
    lengths = np.arange(h.shape[1])
    out = []
    for b in np.unique(bs):
        sel = bs == b
        rows = int(h[sel].sum())
        out.append(GroupRow(int(b), int(sel.sum()), rows, float((h[sel] * lengths).sum() / rows) if rows else 0.0))
    return out


def acceptance_by_request(verify_steps: Iterable[Step]) -> list[GroupRow]:
    """Mean accept length per request id over the given decoded verify steps."""
    acc: dict[int, list[int]] = defaultdict(list)
    for st in verify_steps:
        for r in st.requests:
            if r.accept_length > 0:
                acc[r.request_id].append(r.accept_length)
    return [GroupRow(rid, len(v), len(v), sum(v) / len(v)) for rid, v in sorted(acc.items())]


# -- violations ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ViolationGroup:
    """All violations of one invariant."""

    check_id: str
    severity: str
    description: str
    count: int
    num_steps: int
    first_step: int
    examples: tuple[Violation, ...]  # the first few, in step order


def violation_groups(violations: Iterable[Violation], max_examples: int = 50) -> list[ViolationGroup]:
    """Violations grouped by invariant (in catalogue order by id), each with its first `max_examples`."""
    from specscope.tracer.checks import BY_ID

    groups: dict[str, list[Violation]] = defaultdict(list)
    for v in violations:
        groups[v.check_id].append(v)
    out = []
    for cid in sorted(groups, key=check_key):
        vs = sorted(groups[cid], key=lambda v: v.step)
        inv = BY_ID.get(cid)
        out.append(ViolationGroup(cid, vs[0].severity.value, inv.description if inv else "", len(vs),
                                  len({v.step for v in vs}), vs[0].step, tuple(vs[:max_examples])))
    return out


def violation_target(v: Violation, request_ids: Sequence[int] | None = None) -> dict[str, int | str]:
    """Query parameters of the step-page link that highlights a violation: the cell it names, else the row
    of its request (when `request_ids`, the step's rows, are known), else just the invariant."""
    q: dict[str, int | str] = {"check": v.check_id}
    if v.row is not None:
        q["row"] = int(v.row)
        if v.col is not None:
            q["col"] = int(v.col)
        if v.array:
            q["array"] = v.array
    elif v.request_id is not None:
        q["request"] = int(v.request_id)
    return q


# -- violation marks on the step page ------------------------------------------------------------------------

# Where the step page shows each recorded value a violation can name (`Violation.array`):
# the detail panel's rows by the scalar or header field behind them ...
DETAIL_FIELDS: dict[str, tuple[str, ...]] = {
    "max_seq_len_q": ("max_seq_len_q",), "kernel q_len": ("kernel_q_len",), "max_seq_len_k": ("max_seq_len_k",),
    "captured q_len": ("captured_max_seq_len_q",), "page size": ("page_size",),
    "tokens": ("tokens_per_request", "num_draft_tokens"), "bs / padded": ("batch_size", "padded_batch_size"),
}  # fmt: skip
# ... the seqlens table's columns (row b of a per-row array; entry i of a cu_seqlens array) ...
SEQLENS_COLUMNS = {"cache_seqlens": 2, "cu_seqlens_q": 3, "cu_seqlens_k": 4, "seq_lens": 5, "req_pool_indices": 6}
# ... the page-table grid, and the request table's columns by request field.
GRID_ARRAYS = ("page_table", "req_to_token_page_starts")
REQUEST_COLUMNS = {"slot": 2, "seq_len_before": 3, "seq_len_after": 4, "num_q_tokens": 5, "accept_length": 6,
                   "draft_tokens": 7, "accepted_tokens": 8}


@dataclass
class MarkIndex:
    """One step's marks (`views.step_marks`) by where the page draws them; `unplaced` are marks on values no panel
    shows as such (a scalar the detail lacks, a per-row array such as `out_cache_loc`): the detail panel lists
    the scalars, and a per-row array's mark goes on its request row too."""

    detail: dict[str, list[CellMark]]  # detail row label -> marks
    scalars: dict[str, list[CellMark]]  # scalars the detail has no row for
    seqlens: dict[tuple[int, int], list[CellMark]]  # (table row, column) -> marks
    grid: list[CellMark]  # page-table cells (row, col), or a whole row when col is None
    requests: dict[int, list[CellMark]]  # batch row -> marks (request fields and per-row arrays)


def mark_index(marks: Sequence[CellMark], step: Step) -> MarkIndex:
    """Where each of a step's marks goes on its page."""
    label_of = {a: label for label, arrays in DETAIL_FIELDS.items() for a in arrays}
    out = MarkIndex({}, {}, {}, [], {})
    for mk in marks:
        a = mk.array
        if a in label_of:
            out.detail.setdefault(label_of[a], []).append(mk)
        elif a in GRID_ARRAYS:
            if mk.row is not None:
                out.grid.append(mk)
        elif a in SEQLENS_COLUMNS:
            i = mk.row if mk.row is not None else mk.col
            if i is not None:
                out.seqlens.setdefault((int(i), SEQLENS_COLUMNS[a]), []).append(mk)
            if mk.row is not None:
                out.requests.setdefault(int(mk.row), []).append(mk)
        elif mk.row is not None and (a in REQUEST_COLUMNS or step.array(a) is not None):
            out.requests.setdefault(int(mk.row), []).append(mk)
        else:  # a scalar, or a fact of the whole batch (every row's accept length): the detail lists it
            out.scalars.setdefault(a, []).append(mk)
    return out


def mark_text(marks: Sequence[CellMark], with_cell: bool = False) -> str:
    """`✗ I6: 4, expected 2` (`◇` for a related fact), several joined by ` · `: a mark readable without colour."""
    from specscope.ui.views import cell_name

    parts = []
    for m in marks:
        where = cell_name(m.array, m.row, m.col) + " " if with_cell else ""
        parts.append(("◇ " if m.is_related else "✗ ") + where + m.text)
    return " · ".join(parts)


# -- timeline lanes and scales -------------------------------------------------------------------------------

CAPTURE = GRAPHS.index(GraphPhase.CAPTURE.value)
REPLAY = GRAPHS.index(GraphPhase.REPLAY.value)
ROBUST_QUANTILE = 0.99  # the host-time scale covers this share of the steady steps ...
ROBUST_HEADROOM = 1.25  # ... with this much room above it


@dataclass(frozen=True)
class Lanes:
    """Per bin of steps (or per step, for a short trace): batch size range, capture / replay counts, violations."""

    x: np.ndarray  # bin centre (a step index for unbinned lanes)
    lo: np.ndarray  # first step index of the bin
    hi: np.ndarray  # last step index of the bin
    bs_min: np.ndarray
    bs_max: np.ndarray
    captures: np.ndarray
    replays: np.ndarray
    steps: np.ndarray
    errors: np.ndarray  # error violations of the bin's steps
    warnings: np.ndarray
    binned: bool


def lanes(cols: Columns, bins: int = NUM_BINS) -> Lanes:
    """The timeline's lanes over every loaded step: one entry per step up to `bins` steps, else per equal bin of
    step indexes (empty bins dropped), so a capture or a single violation is never averaged away."""
    idx = cols.index
    if len(idx) == 0:
        z = np.zeros(0, np.int64)
        return Lanes(z.astype(np.float64), z, z, z, z, z, z, z, z, z, False)
    binned = len(idx) > bins
    if binned:
        edges = np.linspace(float(idx[0]), float(idx[-1]) + 1, bins + 1)
        which = np.clip(np.searchsorted(edges, idx, side="right") - 1, 0, bins - 1)
    else:
        which = np.arange(len(idx))
        bins = len(idx)
    count = np.bincount(which, minlength=bins)
    keep = count > 0

    def agg(ufunc: np.ufunc, values: np.ndarray, init: float) -> np.ndarray:
        out = np.full(bins, init)
        ufunc.at(out, which, values)
        return out[keep]

    def total(values: np.ndarray) -> np.ndarray:
        return np.bincount(which, weights=values, minlength=bins)[keep].astype(np.int64)

    lo = agg(np.minimum, idx.astype(np.float64), np.inf).astype(np.int64)
    hi = agg(np.maximum, idx.astype(np.float64), -np.inf).astype(np.int64)
    bs = cols.batch_size.astype(np.float64)
    return Lanes(x=(lo + hi) / 2, lo=lo, hi=hi, bs_min=agg(np.minimum, bs, np.inf).astype(np.int64),
                 bs_max=agg(np.maximum, bs, -np.inf).astype(np.int64), captures=total(cols.graph == CAPTURE),
                 replays=total(cols.graph == REPLAY), steps=count[keep].astype(np.int64),
                 errors=total(cols.num_errors), warnings=total(cols.num_warnings), binned=binned)


def robust_range(cols: Columns) -> tuple[float, int]:
    """The top of the host-time scale (µs) that shows the steady steps, and how many steps lie above it: the
    ROBUST_QUANTILE of the steps that are neither graph captures nor warm-up (before the first iteration), with
    ROBUST_HEADROOM; one prefill or capture no longer sets the scale."""
    dur = (cols.end_ns - cols.start_ns) / 1e3
    if len(dur) == 0:
        return 1.0, 0
    steady = dur[(cols.graph != CAPTURE) & (cols.iteration >= 0)]
    if len(steady) == 0:
        steady = dur
    top = float(np.quantile(steady, ROBUST_QUANTILE)) * ROBUST_HEADROOM
    top = max(top, 1e-3)
    return top, int((dur > top).sum())
