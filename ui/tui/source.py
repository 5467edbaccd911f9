"""The TUI's window on a trace: bounded caches over `TraceReader`, so nothing ever loads every step.

Steps are addressed by index everywhere (what the user reads, what violations and searches name); the step list
lays them out in rows, and `positions` (tracer.query.StepIndex) maps one to the other: the identity for a recorded
trace, the held indexes for a bundle (which keeps the original run's numbers, so its indexes start late and skip).
Summaries come in blocks of `BLOCK` rows (prefetched around the current step on a thread), decoded steps
in a small LRU; the violation index holds only
violations (sparse), merged from the trace's table and from the TUI's own streaming checker for traces that
were never checked. Background work uses its own reader, so the UI thread never waits on its lock.
"""

from __future__ import annotations

import bisect
import enum
import queue
import threading
from collections import OrderedDict, defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

from specscope.tracer.query import StepFilter, StepIndex
from specscope.tracer.schema import EndState, Step, StepSummary, Violation
from specscope.tracer.store import TraceReader
from specscope.ui import views
from specscope.ui.recording_notes import recording_notes
from specscope.ui.views import is_byte_level

from .model import Grid, violation_key

if TYPE_CHECKING:
    pass

BLOCK = 64  # small: a far jump fetches one screen of summaries on the UI thread; neighbours are prefetched
_BLOCKS_KEPT = 256
_STEPS_KEPT = 48
AUTO_CHECK_MAX_STEPS = 20_000  # beyond this the TUI checks only when asked (palette: "Check the trace")


class _Missing(enum.Enum):
    MISSING = enum.auto()  # no classified grid cached (a cached grid can be None: a step with no page table)


_MISSING: Final = _Missing.MISSING


class ViolationIndex:
    """Violations by step and by check id, with next/previous lookups by bisection. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: set[tuple[str, int, int | None, str]] = set()
        self.by_step: dict[int, list[Violation]] = defaultdict(list)
        self.by_check: dict[str, list[Violation]] = defaultdict(list)
        self._steps: list[int] = []
        self.version = 0  # bumped on every change, so panels redraw only when needed

    def add(self, violations: Iterable[Violation]) -> list[Violation]:
        """Add violations not seen before; returns the new ones."""
        new = []
        with self._lock:
            for v in violations:
                k = violation_key(v)
                if k in self._keys:
                    continue
                self._keys.add(k)
                if v.step not in self.by_step:
                    bisect.insort(self._steps, v.step)
                self.by_step[v.step].append(v)
                self.by_check[v.check_id].append(v)
                new.append(v)
            if new:
                self.version += 1
        return new

    def at(self, step: int) -> list[Violation]:
        """Violations of one step."""
        with self._lock:
            return list(self.by_step.get(step, ()))

    def next_step(self, after: int, backward: bool = False) -> int | None:
        """The first step with a violation after `after` (or the last before it, backward)."""
        with self._lock:
            if backward:
                k = bisect.bisect_left(self._steps, after)
                return self._steps[k - 1] if k > 0 else None
            k = bisect.bisect_right(self._steps, after)
            return self._steps[k] if k < len(self._steps) else None

    def total(self) -> int:
        """Number of violations."""
        with self._lock:
            return len(self._keys)

    def groups(self) -> list[tuple[str, list[Violation]]]:
        """(check id, violations in step order) per invariant, by check id."""
        with self._lock:
            return [(c, sorted(vs, key=lambda v: v.step))
                    for c, vs in sorted(self.by_check.items(), key=lambda kv: views.check_key(kv[0]))]




class TraceSource:
    """Cached, bounded access to one trace for the UI thread."""

    def __init__(self, path: str, display: str | None = None) -> None:
        self.path = path
        self.display = path if display is None else display  # the name the status line shows
        self.reader = TraceReader(path)
        # The background readers open the same file: a bundle's trace.db copy, not the .zip (extracted again each).
        self._db = self.reader.path
        self.run = self.reader.run
        self.byte_level = is_byte_level(self.run)
        # What the recording could not record (problems, untested release, absent fields, replays without
        # metadata): the notice line, the help screen, and the detail and grid panes of the steps it concerns.
        self.notes = recording_notes(self.reader.meta(), self.run.config)
        self.positions = StepIndex(self.reader)
        self._n = len(self.positions)
        self._blocks: OrderedDict[int, list[StepSummary]] = OrderedDict()
        self._steps: OrderedDict[int, Step] = OrderedDict()
        self._grids: dict[int, Grid | None] = {}  # classified page tables of the steps in `_steps`
        self._step_want: list[int] = []
        self._step_wake = threading.Event()
        self._stepper: threading.Thread | None = None
        self._closed = False
        self._end: EndState | None = None
        self._captures: dict[int, int | None] = {}
        self.violations = ViolationIndex()
        self.checked_through: int | None = None  # steps the table's verdicts cover (None: never checked)
        self.tui_checked_through = -1  # steps the TUI's own checker has judged
        self.loading_violations = True
        self.run_hist: list[int] | None = None  # accept-length histogram of the whole run (loaded in background)
        self._lock = threading.Lock()
        self._want: queue.SimpleQueue[int | None] = queue.SimpleQueue()  # None: stop
        self._prefetcher: threading.Thread | None = None

    # -- counts ----------------------------------------------------------------------------------

    def num_steps(self) -> int:
        """Steps known to the UI (see `refresh`): rows of the step list, not the highest index."""
        return self._n

    def first_index(self) -> int:
        """The lowest step index (0 without steps)."""
        return self.positions.first() or 0

    def last_index(self) -> int:
        """The highest step index known (-1 without steps)."""
        last = self.positions.last()
        return -1 if last is None else last

    def has(self, i: int) -> bool:
        """Whether the trace holds step `i` (as of the last refresh)."""
        return self.positions.position(i) is not None

    def row_of(self, i: int) -> int:
        """The step list row of step `i` (of the nearest held step when it is not held)."""
        return self.positions.nearest(i)

    def index_at(self, row: int) -> int | None:
        """The index of the step in list row `row` (None outside the list)."""
        return self.positions.at(row) if 0 <= row < self._n else None

    def snap(self, i: int) -> int:
        """`i` when held, else the nearest held index (clamped to the trace)."""
        return self.positions.snap(i)

    def offset(self, i: int, k: int) -> int:
        """The index `k` steps (rows) after step `i` (k < 0: before), clamped to the trace."""
        return self.positions.offset(i, k)

    def around(self, i: int, half: int, *, contiguous: bool = False) -> list[int]:
        """The indexes of up to `half` steps either side of step `i` and itself, in order; `contiguous` keeps to
        the run of consecutive indexes around it (steps across a bundle's gap lie far apart in time)."""
        if not self._n:
            return []
        p = self.positions.nearest(i)
        out = [self.positions.at(q) for q in range(max(0, p - half), min(self._n, p + half + 1))]
        if contiguous:
            lo, hi = self.positions.run_of(self.positions.at(p))
            out = [j for j in out if lo <= j <= hi]
        return out

    def steps_text(self) -> str:
        """`steps 0–172`, or for a bundle `steps 2, 5, 30–59` (for messages)."""
        return self.positions.text()

    def refresh(self) -> int:
        """Re-count the steps of a growing trace; returns how many arrived."""
        n = self.positions.refresh()
        grew = n - self._n
        if grew > 0:
            last_block = (self._n - 1) // BLOCK if self._n else 0
            with self._lock:
                for b in [b for b in self._blocks if b >= last_block]:
                    del self._blocks[b]  # a partial block grew
            self._n = n
            # A recorder writes its problems and late-found features as it goes: read them again with new steps.
            self.notes = recording_notes(self.reader.meta(), self.run.config)
        return max(0, grew)

    def is_closed(self) -> bool:
        """Whether the writer closed the trace."""
        return self.reader.is_closed()

    def end_state(self) -> EndState:
        """How the run ended: closed, stopped, interrupted, ended by an error, or not closed yet (a live trace)."""
        if self._end is None or self._end.state == "unclosed":  # final once written; the status bar asks often
            self._end = self.reader.end_state()
        return self._end

    # -- summaries and steps ----------------------------------------------------------------------

    def summary(self, i: int) -> StepSummary | None:
        """Summary of step `i` from the block cache (None when the trace does not hold it)."""
        p = self.positions.position(i)
        if p is None or p >= self._n:
            return None
        b = p // BLOCK
        with self._lock:
            rows = self._blocks.get(b)
            if rows is not None:
                self._blocks.move_to_end(b)
        if rows is None:
            rows = self._block_rows(self.reader, b, self._n)
            self._store_block(b, rows)
        k = p - b * BLOCK
        return rows[k] if k < len(rows) else None

    def _block_rows(self, reader: TraceReader, b: int, n: int) -> list[StepSummary]:
        # Block b is rows b*BLOCK .. of the step list: the summaries of the indexes those rows hold.
        lo, hi = b * BLOCK, min((b + 1) * BLOCK, n)
        if hi <= lo:
            return []
        return reader.summaries(self.positions.at(lo), self.positions.at(hi - 1) + 1)

    def _store_block(self, b: int, rows: list[StepSummary]) -> None:
        with self._lock:
            self._blocks[b] = rows
            self._blocks.move_to_end(b)
            while len(self._blocks) > _BLOCKS_KEPT:
                self._blocks.popitem(last=False)

    def _rows(self, start: int, stop: int) -> tuple[int, int]:
        """The step list rows [lo, hi) of the steps with start <= index < stop."""
        return self.positions.first_at_or_after(start), self.positions.first_at_or_after(stop)

    def prefetch(self, lo: int, hi: int) -> None:
        """Fetch the summary blocks covering steps lo <= index < hi on a background thread (with its own reader),
        so moving across a block boundary finds them cached."""
        if self._prefetcher is None:
            self._prefetcher = threading.Thread(target=self._prefetch_loop, name="specscope-tui-prefetch",
                                                daemon=True)
            self._prefetcher.start()
        lo, hi = self._rows(lo, hi)
        for b in range(max(0, lo) // BLOCK, (max(0, min(hi, self._n)) - 1) // BLOCK + 1):
            with self._lock:
                have = b in self._blocks
            if not have:
                self._want.put(b)

    def _prefetch_loop(self) -> None:
        with TraceReader(self._db) as r:
            while True:
                b = self._want.get()
                if b is None or self._closed:
                    return  # stop_neighbours: the app is going away
                n = self._n
                with self._lock:
                    if b in self._blocks:
                        continue
                full = (b + 1) * BLOCK <= n  # a partial last block is left to the UI thread (it grows)
                if full:
                    self._store_block(b, self._block_rows(r, b, n))

    def cached_summaries(self, start: int, stop: int) -> list[StepSummary] | None:
        """Summaries of the steps start <= index < stop if every block is cached already; else None (and they are
        prefetched)."""
        lo, hi = self._rows(start, stop)
        hi = min(hi, self._n)
        if hi <= lo:
            return []
        with self._lock:
            missing = [b for b in range(lo // BLOCK, (hi - 1) // BLOCK + 1) if b not in self._blocks]
        full_missing = [b for b in missing if (b + 1) * BLOCK <= self._n]
        if full_missing:
            self.prefetch(start, stop)
            return None
        return self.summaries(start, stop)

    def summaries(self, start: int, stop: int) -> list[StepSummary]:
        """Summaries of the steps start <= index < stop the trace holds, through the block cache."""
        out = []
        for i in self.positions.between(start, stop):
            s = self.summary(i)
            if s is not None:
                out.append(s)
        return out

    def step(self, i: int) -> Step:
        """Decoded step `i` (all arrays), from a small LRU (which the neighbour thread fills ahead of a move)."""
        with self._lock:
            st = self._steps.get(i)
            if st is not None:
                self._steps.move_to_end(i)
        if st is None:
            st = self.reader.step(i)
            self._store_step(i, st, _MISSING)
        return st

    def grid(self, i: int) -> Grid | None:
        """Step `i`'s page table, classified (`views.page_classes`), cached beside the decoded step."""
        with self._lock:
            g = self._grids.get(i, _MISSING)
        if g is _MISSING:
            g = views.page_classes(self.step(i))
            with self._lock:
                if i in self._steps:
                    self._grids[i] = g
        return g

    def _store_step(self, i: int, st: Step, grid: Grid | None | _Missing) -> None:
        with self._lock:
            self._steps[i] = st
            self._steps.move_to_end(i)
            if grid is not _MISSING:
                self._grids[i] = grid
            while len(self._steps) > _STEPS_KEPT:
                old, _ = self._steps.popitem(last=False)
                self._grids.pop(old, None)

    def prefetch_steps(self, indices: Iterable[int]) -> None:
        """Decode and classify these steps on the neighbour thread (its own reader), replacing any older wish:
        after a move the next key's step is usually ready when it comes. SQLite, zstd and numpy let go of the
        GIL, so most of it overlaps the UI thread's drawing."""
        with self._lock:
            self._step_want = [j for j in indices if self.has(j) and j not in self._grids]
            if not self._step_want:
                return
        if self._closed:
            return
        if self._stepper is None:
            self._stepper = threading.Thread(target=self._step_loop, name="specscope-tui-neighbours", daemon=True)
            self._stepper.start()
        self._step_wake.set()

    def _step_loop(self) -> None:
        with TraceReader(self._db) as r:
            while not self._closed:
                self._step_wake.wait()
                with self._lock:
                    if self._closed:
                        break
                    if not self._step_want:
                        self._step_wake.clear()
                        continue
                    j = self._step_want.pop(0)
                    if j in self._grids:
                        continue
                st = r.step(j)
                self._store_step(j, st, views.page_classes(st))

    def capture_of(self, i: int) -> int | None:
        """The capture step a replay step came from (a query per replay step: cached)."""
        if i not in self._captures:
            if len(self._captures) > 4096:
                self._captures.clear()
            self._captures[i] = self.reader.capture_of(i)
        return self._captures[i]

    def num_violations(self, s: StepSummary) -> int:
        """Violations of a step: the table's count plus the TUI checker's own finds for unchecked steps."""
        return max(len(self.violations.at(s.index)), s.num_violations)

    # -- moves -----------------------------------------------------------------------------------

    def iteration_step(self, i: int, backward: bool = False) -> int | None:
        """First step of the next iteration after step i's (backward: of the iteration before it)."""
        cur = self.summary(i)
        if cur is None:
            return None
        it = cur.iteration
        # Walk the rows (a bundle's indexes skip), then answer with the index of the row reached.
        at = self.positions.at
        j = self.positions.nearest(i)
        if not backward:
            while True:
                j += 1
                if j >= self._n:
                    return None
                s = self.summary(at(j))
                if s is None:
                    return None
                if s.iteration != it:
                    return at(j)
        # Backward: walk to the start of the previous iteration.
        start = j
        while j > 0 and (s := self.summary(at(j - 1))) is not None and s.iteration == it:
            j -= 1
        if j == 0:
            return None if j == start else at(0)
        prev = self.summary(at(j - 1))
        assert prev is not None, "every row of the list holds a summary"
        prev_it = prev.iteration
        j -= 1
        while j > 0 and (s := self.summary(at(j - 1))) is not None and s.iteration == prev_it:
            j -= 1
        return at(j)

    def find(self, f: StepFilter, after: int, backward: bool = False) -> int | None:
        """The next (previous) step matching a search, through the reader's query."""
        if f.has_violation and not f.check_id and not f.severity:
            return self.violations.next_step(after, backward)
        hits = self.reader.find_steps(f, after=after, limit=1, backward=backward)
        return hits[0] if hits else None

    def stop_neighbours(self) -> None:
        """End the neighbour thread (the app is going away); `step` keeps working on the UI thread's reader."""
        self._closed = True
        self._step_wake.set()
        self._want.put(None)  # ends the block prefetcher too (and closes its reader)

    def close(self) -> None:
        """Close the reader (and end the neighbour thread)."""
        self.stop_neighbours()
        self.reader.close()
