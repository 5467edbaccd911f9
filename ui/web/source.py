"""One trace as the dashboard sees it: the reader, summary columns kept in numpy, a small step cache, violations.

The app holds one `TraceSource` per trace named on the command line and never opens any other file. Summary
columns are loaded in the background, in chunks, by a loader thread with a reader of its own (so opening a 100k-step
trace is instant and a step page never waits behind the load), and extended when a live trace grows; figures over
the whole trace are numpy work over those columns, not queries. Step bodies are decoded only for the steps a page
shows.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from specscope.tracer.errors import TraceError
from specscope.tracer.query import SpanBins, StepIndex, ViolationFilter
from specscope.tracer.schema import EndState, ForwardMode, GraphPhase, Step, StepSummary, Violation
from specscope.tracer.store import TraceReader
from specscope.ui.recording_notes import recording_notes

if TYPE_CHECKING:
    from specscope.tracer.checks import Checker
    from specscope.tracer.schema import RequestRecord, SpanRow

MODES: tuple[str, ...] = tuple(m.value for m in ForwardMode)
GRAPHS: tuple[str, ...] = tuple(g.value for g in GraphPhase)
MAX_ACCEPT = 64  # accept-length histogram columns kept per step (K is a handful in practice)
_STEP_CACHE = 64
LOAD_CHUNK = 8192  # summary rows the loader reads per query (a few hundred ms of work on a slow machine)
WAIT_S = 0.5  # how long a page waits for summaries still loading (a small trace is complete well before)
CONTEXT_STEPS = 24  # steps (a few iterations) the per-step checker replays before the step it judges


@dataclass
class Columns:
    """Summary table of a trace as numpy columns, one row per step in index order. `index` is each row's step
    index: row i is step i in a recorded trace, not in a bundle (it keeps the original run's numbers)."""

    index: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    iteration: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    mode: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))  # index into MODES
    model: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))  # 0 target, 1 draft, 2 other
    batch_size: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    padded_batch_size: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    graph: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))  # index into GRAPHS
    tokens_per_request: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    num_draft_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    start_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    end_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    num_errors: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    num_warnings: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    accept_hist: np.ndarray = field(default_factory=lambda: np.zeros((0, 1), np.int32))  # [step, L]

    def __post_init__(self) -> None:
        if len(self.index) != len(self.iteration):  # built without indexes: a dense trace's rows are its indexes
            self.index = np.arange(len(self.iteration), dtype=np.int64)

    def __len__(self) -> int:
        return len(self.iteration)

    @classmethod
    def from_summaries(cls, rows: list[StepSummary]) -> Columns:
        """Columns of a list of summary rows (in index order)."""
        width = max([len(s.accept_hist) for s in rows] + [1])
        width = min(width, MAX_ACCEPT)
        hist = np.zeros((len(rows), width), np.int32)
        for i, s in enumerate(rows):
            if s.accept_hist:
                h = s.accept_hist[:width]
                hist[i, : len(h)] = h
        model = {"target": 0, "draft": 1}
        return cls(
            index=np.array([s.index for s in rows], np.int64),
            iteration=np.array([s.iteration for s in rows], np.int64),
            mode=np.array([MODES.index(s.mode.value) for s in rows], np.int8),
            model=np.array([model.get(s.model, 2) for s in rows], np.int8),
            batch_size=np.array([s.batch_size for s in rows], np.int32),
            padded_batch_size=np.array([s.padded_batch_size for s in rows], np.int32),
            graph=np.array([GRAPHS.index(s.graph.value) for s in rows], np.int8),
            tokens_per_request=np.array([s.tokens_per_request for s in rows], np.int32),
            num_draft_tokens=np.array([s.num_draft_tokens for s in rows], np.int32),
            start_ns=np.array([s.start_ns for s in rows], np.int64),
            end_ns=np.array([s.end_ns for s in rows], np.int64),
            num_errors=np.array([s.num_errors for s in rows], np.int32),
            num_warnings=np.array([s.num_warnings for s in rows], np.int32),
            accept_hist=hist,
        )

    def extend(self, more: Columns) -> Columns:
        """These columns followed by `more` (accept histograms padded to the wider of the two)."""
        w = max(self.accept_hist.shape[1], more.accept_hist.shape[1])

        def pad(h: np.ndarray) -> np.ndarray:
            return np.pad(h, ((0, 0), (0, w - h.shape[1])))

        out = {f: np.concatenate([getattr(self, f), getattr(more, f)]) for f in _COLUMN_FIELDS}
        return Columns(**out, accept_hist=np.concatenate([pad(self.accept_hist), pad(more.accept_hist)]))


    def rows(self, start: int, stop: int | None = None) -> slice:
        """The rows of the steps with start <= index < stop."""
        a = int(np.searchsorted(self.index, start, side="left"))
        b = len(self) if stop is None else int(np.searchsorted(self.index, stop, side="left"))
        return slice(a, max(a, b))


_COLUMN_FIELDS = ("index", "iteration", "mode", "model", "batch_size", "padded_batch_size", "graph",
                  "tokens_per_request", "num_draft_tokens", "start_ns", "end_ns", "num_errors", "num_warnings")


@dataclass(frozen=True)
class ViolationState:
    """The violations a page can show, and how far they are complete."""

    violations: tuple[Violation, ...]
    checked_steps: int  # how many steps are covered (the first ones, in index order)
    num_steps: int
    source: str  # "trace" (stored by the recorder or `check --write`) or "dashboard" (the checker run here)


class TraceSource:
    """A trace named on the command line, opened read-only; thread-safe (Dash serves callbacks on threads).

    `num_steps()` is what the trace holds now (counted by the reader); `cols` is the prefix of it whose summary
    rows are loaded so far. Pages that summarize the whole trace take `columns()`, which waits briefly for the
    loader and says how far it got; the step explorer needs no summaries at all."""

    def __init__(self, path: str, key: str, *, background: bool = True, chunk: int = LOAD_CHUNK) -> None:
        self.key = key
        self.reader = TraceReader(path)
        self.path = self.reader.path  # a bundle's private trace.db copy: the loader opens the same file
        self.name = self.reader.display_path  # what pages call it: the .zip of a bundle, not that copy
        self.run = self.reader.run
        self.notes = recording_notes(self.reader.meta(), self.run.config)  # what the recording could not record
        # Step URLs and ranges are indexes; this maps them to positions (a bundle's start late and skip).
        self.positions = StepIndex(self.reader)
        self._lock = threading.RLock()
        self._steps: collections.OrderedDict[int, Step] = collections.OrderedDict()
        self.cols = Columns()
        self._reader_closed = False
        self._n = len(self.positions)
        self._closed = self.reader.is_closed()
        self._end: EndState | None = None
        self._chunk = max(1, int(chunk))
        self._cv = threading.Condition()  # guards cols / _n / _stop / _load_error for the loader
        self._stop = False
        self._load_error: str | None = None
        self._partial_served = False  # a page was built from an incomplete prefix: refresh() says so once done
        self._loader: threading.Thread | None = None
        self._checker_lock = threading.Lock()
        self._checker: Checker | None = None
        self._checked: list[Violation] = []
        self._checked_steps = 0  # steps the dashboard's checker has judged ...
        self._checked_next = 0  # ... all of those with an index below this
        self._window: tuple[Checker, int] | None = None  # (checker, last step fed) of the per-step checks
        if background:
            self._loader = threading.Thread(target=self._load_loop, name=f"specscope-web-load-{key}", daemon=True)
            self._loader.start()
        else:
            with self._lock:
                self._load_with(self.reader, self._n)

    # -- summaries ------------------------------------------------------------------------------

    def _append(self, rows: list[StepSummary], have: int) -> None:
        more = Columns.from_summaries(rows)
        with self._cv:
            self.cols = more if have == 0 else self.cols.extend(more)
            self._cv.notify_all()

    def _next_rows(self, reader: TraceReader, have: int, want: int) -> list[StepSummary]:
        """Up to want - have summary rows after the last one loaded (by index: a bundle's skip)."""
        after = int(self.cols.index[-1]) + 1 if have else 0
        return list(itertools.islice(reader.iter_summaries(after), max(0, want - have)))

    def _load_with(self, reader: TraceReader, want: int) -> None:
        """Load summary rows up to `want` in chunks (the caller holds whatever lock `reader` needs)."""
        while len(self.cols) < want:
            have = len(self.cols)
            rows = self._next_rows(reader, have, min(want, have + self._chunk))
            if not rows:
                raise TraceError(f"has no summary rows from step {have} on ({want} steps counted)", self.path)
            self._append(rows, have)

    def _load_loop(self) -> None:
        # The loader's own reader: SQLite reads on a second connection do not queue behind the page's queries.
        reader: TraceReader | None = None
        try:
            while True:
                with self._cv:
                    while not self._stop and len(self.cols) >= self._n:
                        self._cv.wait()
                    if self._stop:
                        return
                    have, want = len(self.cols), min(self._n, len(self.cols) + self._chunk)
                if reader is None:
                    reader = TraceReader(self.path)
                rows = self._next_rows(reader, have, want)
                if not rows:
                    raise TraceError(f"has no summary rows from step {have} on ({want} steps counted)", self.path)
                self._append(rows, have)
        except TraceError as e:
            with self._cv:
                self._load_error = str(e)
                self._cv.notify_all()
        except Exception as e:  # noqa: BLE001 - a dying loader must leave a reason, not a silent half-load
            with self._cv:
                self._load_error = f"loading step summaries failed ({type(e).__name__}: {e})"
                self._cv.notify_all()
        finally:
            if reader is not None:
                reader.close()

    def columns(self, wait: float = WAIT_S) -> Columns:
        """The summary columns loaded so far, after waiting up to `wait` seconds for the rest."""
        with self._cv:
            self._cv.wait_for(lambda: len(self.cols) >= self._n or self._load_error is not None or self._stop,
                              timeout=max(0.0, wait))
            cols = self.cols
            if len(cols) < self._n:
                self._partial_served = True
            return cols

    def loading(self) -> bool:
        """True while summary rows are still being loaded (and the loader has not failed)."""
        with self._cv:
            return len(self.cols) < self._n and self._load_error is None and not self._stop

    def load_error(self) -> str | None:
        """Why loading the summaries stopped, if it failed."""
        return self._load_error

    def loaded_steps(self) -> int:
        """Steps whose summary rows are loaded."""
        return len(self.cols)

    def wait_loaded(self, timeout: float | None = None) -> bool:
        """Block until every counted step's summary is loaded (or loading failed); True when complete."""
        with self._cv:
            self._cv.wait_for(lambda: len(self.cols) >= self._n or self._load_error is not None or self._stop,
                              timeout=timeout)
            return len(self.cols) >= self._n

    def refresh(self) -> bool:
        """Count the steps committed since the last call (the loader fetches their summaries); True when the
        trace grew, or when loading finished after a page was built from part of it."""
        with self._lock:
            if self._reader_closed:
                return False
            n = self.positions.refresh()
            closed = self.reader.is_closed()
            if n > self._n or closed != self._closed:  # a live SGLang recording adds its problems as it goes
                self.notes = recording_notes(self.reader.meta(), self.run.config)
        with self._cv:
            grew = n > self._n
            self._n = max(self._n, n)
            self._closed = closed
            self._cv.notify_all()  # the loader fetches the new rows
        if self._loader is None and len(self.cols) < self._n:
            with self._lock:
                self._load_with(self.reader, self._n)
        with self._cv:
            done = len(self.cols) >= self._n
            finished = done and self._partial_served
            if done:
                self._partial_served = False
        return grew or finished

    def locked(self) -> threading.RLock:
        """The lock to hold while using `reader` directly (a context manager)."""
        return self._lock

    def num_steps(self) -> int:
        """Steps the trace holds (as of the last refresh)."""
        return self._n

    def first_index(self) -> int:
        """The lowest step index (0 without steps)."""
        return self.positions.first() or 0

    def last_index(self) -> int:
        """The highest step index (-1 without steps)."""
        last = self.positions.last()
        return -1 if last is None else last

    def has(self, i: int) -> bool:
        """Whether the trace holds step `i` (as of the last refresh)."""
        return self.positions.position(i) is not None

    def neighbour(self, i: int, k: int) -> int:
        """The index of the step `k` steps after step `i` (k < 0: before), clamped to the trace."""
        return self.positions.offset(i, k)

    def position(self, i: int) -> int:
        """The 0-based position of step `i` among the steps (of the nearest held one when not held)."""
        return self.positions.nearest(i)

    def index_at(self, pos: int) -> int:
        """The index of the step at position `pos`, clamped to the trace."""
        return self.positions.at(max(0, min(len(self.positions) - 1, pos)))

    def steps_text(self) -> str:
        """`steps 0–172`, or for a bundle `steps 2, 5, 30–59` (for messages)."""
        return self.positions.text()

    def is_live(self) -> bool:
        """True while the writer has not closed the trace."""
        return not self._closed

    def end_state(self) -> EndState:
        """How the run ended (closed, stopped, interrupted, ended by an error; `unclosed` while live)."""
        if self._end is None or self._end.state == "unclosed":  # final once written; every page asks
            with self._lock:
                self._end = self.reader.end_state()
        return self._end

    def summary(self, i: int) -> StepSummary:
        """The summary row of step i."""
        with self._lock:
            return self.reader.summary(i)

    def summaries(self, start: int, stop: int) -> list[StepSummary]:
        """Summary rows of [start, stop)."""
        with self._lock:
            return self.reader.summaries(start, stop)

    # -- steps ----------------------------------------------------------------------------------

    def step(self, i: int) -> Step:
        """Step i with all its arrays (decoded once, then cached)."""
        with self._lock:
            s = self._steps.get(i)
            if s is None:
                s = self.reader.step(i)
                self._steps[i] = s
                while len(self._steps) > _STEP_CACHE:
                    self._steps.popitem(last=False)
            else:
                self._steps.move_to_end(i)
            return s

    def spans(self, start: int, stop: int) -> list[SpanRow]:
        """Stream spans of steps [start, stop)."""
        with self._lock:
            return self.reader.spans(steps=(start, stop))

    def span_bins(self, start: int, stop: int, bins: int) -> SpanBins:
        """Stream spans of steps [start, stop) aggregated per bin of steps (SQL)."""
        with self._lock:
            return self.reader.span_bins(start, stop, bins)

    def capture_of(self, i: int) -> int | None:
        """The capture step a replay came from."""
        with self._lock:
            return self.reader.capture_of(i)

    def requests(self) -> list[RequestRecord]:
        """Every RequestRecord."""
        with self._lock:
            return self.reader.requests()

    # -- violations -----------------------------------------------------------------------------

    def step_violations(self, i: int) -> list[Violation]:
        """Violations of step i: the stored ones; else those the dashboard's checker found when it has got that
        far; else the checker run here over the steps from the step's capture to it (at most CONTEXT_STEPS of
        them), because capture/replay invariants compare a step with the graph state before it."""
        with self._lock:
            stored = self.reader.violations(step=i)
            through = self.reader.checked_through()
        if stored or (through is not None and through >= i):
            return stored
        with self._checker_lock:
            if self._checked_next > i:
                return [v for v in self._checked if v.step == i]
        from specscope.tracer.checks import Checker

        with self._checker_lock:
            win = self._window
            if win is not None and self.has(win[1]) and win[1] < i and self.neighbour(win[1], 1) == i:
                checker = win[0]  # stepping forward: the checker already holds the state up to the step before
                lo = i
            else:
                checker = Checker()
                cap = self.capture_of(i)
                # CONTEXT_STEPS steps, not indexes: a bundle's skip (the checker starts afresh after a gap)
                lo = max(0 if cap is None else cap, self.neighbour(i, -CONTEXT_STEPS))
                if cap is not None and cap < lo:
                    checker.feed(self.step(cap))
            found: list[Violation] = []
            for j in self.positions.between(lo, i + 1):
                found = checker.feed(self.step(j))
            self._window = (checker, i)
        return [v for v in found if v.step == i]

    def violation_state(self, budget_steps: int = 400, budget_s: float | None = None) -> ViolationState:
        """All violations found so far. A trace whose violations are stored answers from the trace; otherwise
        the streaming checker runs here, `budget_steps` more steps per call (and for `budget_s` seconds at most),
        so a page can show progress."""
        n = self.num_steps()
        with self._lock:
            through = self.reader.checked_through()
            stored = self.reader.violations()
        if through is not None or stored:
            # `through` is an index; the steps up to it are counted by position (a bundle's indexes skip).
            covered = n if through is None else min(n, len(self.positions.between(0, through + 1)))
            return ViolationState(tuple(stored), covered, n, "trace")
        with self._checker_lock:
            from specscope.tracer.checks import Checker

            if self._checker is None:
                self._checker = Checker()
            budget = max(0, min(budget_steps, n - self._checked_steps))
            with self._lock:
                until = None if budget_s is None else time.monotonic() + budget_s
                for st in itertools.islice(self.reader.steps(self._checked_next, None), budget):
                    if until is not None and time.monotonic() > until:
                        break
                    self._checked.extend(self._checker.feed(st))
                    self._checked_steps += 1
                    self._checked_next = st.index + 1
            return ViolationState(tuple(self._checked), self._checked_steps, n, "dashboard")

    def _stored(self) -> bool:
        """Whether the trace answers for its violations (a checker stored its verdicts, or it holds some)."""
        with self._lock:
            return self.reader.checked_through() is not None or self.reader.count_violations() > 0

    def violation_step(self, i: int, forward: bool = True) -> int | None:
        """The nearest step after (or before) step `i` with a violation: from the trace's table, else from what the
        dashboard's checker has found so far."""
        if self._stored():
            with self._lock:
                lo, hi = (i + 1, None) if forward else (None, i)
                f = ViolationFilter(start=lo, stop=hi)
                if forward:
                    got = self.reader.violations_page(f, 0, 1)
                    return got[0].step if got else None
                n = self.reader.count_violations(f)
                got = self.reader.violations_page(f, n - 1, 1) if n else []
                return got[0].step if got else None
        with self._checker_lock:
            steps = [v.step for v in self._checked if (v.step > i if forward else v.step < i)]
        return (min(steps) if forward else max(steps)) if steps else None

    def violation_rows(self, f: ViolationFilter, offset: int, limit: int) -> tuple[list[Violation], int]:
        """One page of the violations matching `f` and how many match: SQL over the trace's table, else the
        dashboard checker's findings so far, filtered here."""
        if self._stored():
            with self._lock:
                return self.reader.violations_page(f, offset, limit), self.reader.count_violations(f)
        st = self.violation_state(budget_steps=0)
        cols = self.cols
        text = (f.text or "").lower()

        def keep(v: Violation) -> bool:
            if f.check_ids and v.check_id not in f.check_ids:
                return False
            if f.severity is not None and v.severity.value != f.severity:
                return False
            if f.request_id is not None and v.request_id != f.request_id:
                return False
            if (f.start is not None and v.step < f.start) or (f.stop is not None and v.step >= f.stop):
                return False
            if text and text not in v.message.lower():
                return False
            if f.mode is not None:
                r = cols.rows(v.step, v.step + 1)
                if r.stop == r.start or MODES[int(cols.mode[r.start])] != f.mode:
                    return False
            return True

        rows = sorted((v for v in st.violations if keep(v)), key=lambda v: v.step)
        return rows[offset:offset + limit], len(rows)

    def violation_counts(self) -> dict[str, int]:
        """Violations per invariant: the trace's table, else the dashboard checker's findings so far."""
        if self._stored():
            with self._lock:
                return self.reader.count_violations_by_id()
        with self._checker_lock:
            return dict(collections.Counter(v.check_id for v in self._checked))

    def close(self) -> None:
        """Stop the loader and close the reader."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._loader is not None and self._loader is not threading.current_thread():
            self._loader.join(timeout=5)
        with self._lock:
            self._reader_closed = True
            self.reader.close()
