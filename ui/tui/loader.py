"""The background loader: the trace's violations (and a check of an unchecked trace, and of each step a followed
trace gains), loaded with its own reader off the UI thread; the app runs it in a thread worker."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from specscope.tracer.schema import Violation
from specscope.tracer.store import TraceReader

from .source import AUTO_CHECK_MAX_STEPS, TraceSource

if TYPE_CHECKING:
    from specscope.tracer.checks import Checker


class BackgroundLoader:
    """Loads the violation index (and checks an unchecked trace) with its own reader: `run` is the work, which the
    app runs in a thread worker; `on_change` is called (from that thread) whenever what it loaded changed."""

    def __init__(self, source: TraceSource, auto_check: bool = True, max_steps: int = AUTO_CHECK_MAX_STEPS,
                 follow: bool = False, on_change: Callable[[], None] | None = None) -> None:
        self.source = source
        self.on_change = on_change
        self.follow = follow
        self.auto_check = auto_check
        self.max_steps = max_steps
        self.done = threading.Event()  # finished (a following loader finishes when its trace is closed)
        self.initial = threading.Event()  # the violations present at start are loaded (and checked)
        self.stop = threading.Event()
        self.error: str | None = None
        self._checker: Checker | None = None
        self._fed = -1

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def run(self) -> None:
        """Load (and check), then, following, check each new step until the trace closes or `stop` is set."""
        src = self.source
        try:
            with TraceReader(src._db) as r:
                src.checked_through = r.checked_through()
                src.violations.add(r.violations())
                src.loading_violations = False
                src.run_hist = r.accept_histogram()  # a pass over every verify row: off the UI thread
                # Bounds are step indexes (a bundle's start late and skip): the last one, not the count, ends a walk.
                n, last = r.num_steps(), _last(r)
                if self.auto_check and n <= self.max_steps and not (
                        src.checked_through is not None and src.checked_through >= last):
                    self.check(r, last + 1)
                self.initial.set()
                self._changed()
                while self.follow and not self.stop.is_set():
                    # A trace another process writes: check each new step as it is committed.
                    closed = r.is_closed()
                    r.wait_for_steps(self._fed, 0.3)
                    last = _last(r)
                    # The writer (or a `check --write`) may have judged more steps since: the status line says
                    # how far the verdicts reach, so it must not keep the count it read at start.
                    src.checked_through = r.checked_through()
                    if self.auto_check and src.checked_through is None:
                        self.check(r, last + 1)
                    else:
                        src.violations.add(r.violations())
                    self._changed()
                    if closed and self._fed >= last:
                        break
        except Exception as e:  # noqa: BLE001 - shown in the status line; the viewer keeps working
            self.error = f"{type(e).__name__}: {e}"
        finally:
            src.loading_violations = False
            self.initial.set()
            self.done.set()
            self._changed()

    def check(self, r: TraceReader, stop: int) -> list[Violation]:
        """Feed the steps with index < `stop` to the streaming checker; returns the violations it added."""
        from specscope.tracer.checks import Checker

        if self._checker is None:
            # As `specscope check` does: the run's settings, and schema 1 recorded no wait edges.
            self._checker = Checker.for_trace(r)
        src = self.source
        new: list[Violation] = []
        for st in r.steps(self._fed + 1, stop):
            if self.stop.is_set():
                break
            found = self._checker.feed(st)
            ct = src.checked_through
            new += src.violations.add(v for v in found if ct is None or v.step > ct)
            self._fed = st.index
            src.tui_checked_through = st.index
        return new


def _last(r: TraceReader) -> int:
    """The highest step index committed (-1 without steps)."""
    last = r.last_index()
    return -1 if last is None else last
