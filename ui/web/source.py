"""One trace as the dashboard sees it: the reader, summary columns kept in numpy, a small step cache, violations.

The app holds one `TraceSource` per trace named on the command line and never opens any other file. Summary
columns are loaded once (and extended when a live trace grows), so figures over 100k steps are numpy work, not
queries; step bodies are decoded only for the steps a page shows.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field

import numpy as np
from specscope.tracer.schema import ForwardMode, GraphPhase, Severity, Step, StepSummary, Violation
from specscope.tracer.store import TraceReader

MODES: tuple[str, ...] = tuple(m.value for m in ForwardMode)
GRAPHS: tuple[str, ...] = tuple(g.value for g in GraphPhase)
MAX_ACCEPT = 64  # accept-length histogram columns kept per step (K is a handful in practice)
_STEP_CACHE = 64
CONTEXT_STEPS = 24  # steps (a few iterations) the per-step checker replays before the step it judges


@dataclass
class Columns:
    """Summary table of a trace as numpy columns (row i is step i; steps are dense from 0)."""

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


_COLUMN_FIELDS = ("iteration", "mode", "model", "batch_size", "padded_batch_size", "graph", "tokens_per_request",
                  "num_draft_tokens", "start_ns", "end_ns", "num_errors", "num_warnings")


@dataclass(frozen=True)
class ViolationState:
    """The violations a page can show, and how far they are complete."""

    violations: tuple[Violation, ...]
    checked_steps: int  # steps 0 .. checked_steps-1 are covered
    num_steps: int
    source: str  # "trace" (stored by the recorder or `check --write`) or "dashboard" (the checker run here)


class TraceSource:
    """A trace named on the command line, opened read-only; thread-safe (Dash serves callbacks on threads)."""

    def __init__(self, path: str, key: str) -> None:
        self.key = key
        self.reader = TraceReader(path)
        self.path = self.reader.path
        self.run = self.reader.run
        self._lock = threading.RLock()
        self._steps: collections.OrderedDict[int, Step] = collections.OrderedDict()
        self.cols = Columns()
        self._closed = False
        self._checker_lock = threading.Lock()
        self._checker: object | None = None
        self._checked: list[Violation] = []
        self._checked_steps = 0
        self._window: tuple[object, int] | None = None  # (checker, last step fed) of the per-step checks
        self.refresh()

    # -- summaries ------------------------------------------------------------------------------

    def refresh(self) -> bool:
        """Load summary rows committed since the last call; True when the trace grew."""
        with self._lock:
            if self._closed:
                return False
            n = self.reader.num_steps()
            have = len(self.cols)
            grew = False
            if n > have:
                rows = self.reader.summaries(have, n)
                if rows:
                    more = Columns.from_summaries(rows)
                    self.cols = more if have == 0 else self.cols.extend(more)
                    grew = True
            self._closed = self.reader.is_closed()
            return grew

    def locked(self) -> threading.RLock:
        """The lock to hold while using `reader` directly (a context manager)."""
        return self._lock

    def num_steps(self) -> int:
        """Steps loaded so far (what every page shows)."""
        return len(self.cols)

    def is_live(self) -> bool:
        """True while the writer has not closed the trace."""
        return not self._closed

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

    def spans(self, start: int, stop: int) -> list:
        """Stream spans of steps [start, stop)."""
        with self._lock:
            return self.reader.spans(steps=(start, stop))

    def capture_of(self, i: int) -> int | None:
        """The capture step a replay came from."""
        with self._lock:
            return self.reader.capture_of(i)

    def requests(self) -> list:
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
            if self._checked_steps > i:
                return [v for v in self._checked if v.step == i]
        from specscope.tracer.checks import Checker

        with self._checker_lock:
            win = self._window
            if win is not None and win[1] == i - 1:
                checker = win[0]  # stepping forward: the checker already holds the state up to i-1
                lo = i
            else:
                checker = Checker()
                cap = self.capture_of(i)
                lo = max(0 if cap is None else cap, i - CONTEXT_STEPS)
                if cap is not None and cap < lo:
                    checker.feed(self.step(cap))
            found: list[Violation] = []
            for j in range(lo, i + 1):
                found = checker.feed(self.step(j))  # type: ignore[attr-defined]
            self._window = (checker, i)
        return [v for v in found if v.step == i]

    def violation_state(self, budget_steps: int = 400) -> ViolationState:
        """All violations found so far. A trace whose violations are stored answers from the trace; otherwise
        the streaming checker runs here, `budget_steps` more steps per call, so a page can show progress."""
        n = self.num_steps()
        with self._lock:
            through = self.reader.checked_through()
            stored = self.reader.violations()
        if through is not None or stored:
            covered = n if through is None else min(n, through + 1)
            return ViolationState(tuple(stored), covered, n, "trace")
        with self._checker_lock:
            from specscope.tracer.checks import Checker

            if self._checker is None:
                self._checker = Checker()
            stop = min(n, self._checked_steps + budget_steps)
            with self._lock:
                for st in self.reader.steps(self._checked_steps, stop):
                    self._checked.extend(self._checker.feed(st))  # type: ignore[attr-defined]
            self._checked_steps = stop
            return ViolationState(tuple(self._checked), self._checked_steps, n, "dashboard")

    def close(self) -> None:
        """Close the reader."""
        with self._lock:
            self.reader.close()


def severity_rank(v: Violation) -> int:
    """0 for errors, 1 for warnings (sort key)."""
    return 0 if v.severity == Severity.ERROR else 1
