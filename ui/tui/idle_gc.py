"""Python's cyclic collector kept off the key path: its full passes run while the viewer is idle.

A full (oldest-generation) pass walks every live object: the summary blocks, decoded steps and Textual's caches,
20-30 ms on the 2-core benchmark VM, about once every 25 steps; it was the whole p99 of a step. The youngest
generations run less often (a step builds and drops thousands of objects: with CPython's 700-object trigger they
ran ~8 times per step); the full pass is postponed until the keys pause.

The settings are the process's, so the process's entry point applies them (`tuned_gc`, around `app.run()`) and
hands the collector to the app, which only says when the view moved and ticks it.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

YOUNG_EVERY = 10_000  # net new container objects between young passes (CPython's default 700: ~8 passes per step)
FULL_PASS_EVERY = 1000  # middle-generation passes between automatic full passes (CPython's default is 10)


class IdleCollector:
    """Start-up objects frozen, automatic full passes made rare, one full pass after each burst of moves."""

    def __init__(self, idle_s: float = 0.75, max_wait_s: float = 15.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.idle_s, self.max_wait_s, self.clock = idle_s, max_wait_s, clock
        self.last = self.collected = clock()
        self.due = False
        self._saved: tuple[int, int, int] | None = None

    def start(self) -> None:
        """After start-up: the objects alive now never die (Textual's, the first blocks), so the collector stops
        re-walking them; automatic full passes become rare."""
        gc.freeze()
        if self._saved is None:
            self._saved = gc.get_threshold()
            t0, t1, t2 = self._saved
            gc.set_threshold(max(t0, YOUNG_EVERY), t1, max(t2, FULL_PASS_EVERY))

    def moved(self) -> None:
        """A key moved the view: a full pass is owed once the keys pause."""
        self.last = self.clock()
        self.due = True

    def tick(self) -> bool:
        """Called on the UI's timer: run the owed full pass when idle long enough, or when the view never rests
        (a followed live run moves it every tick) after `max_wait_s` if the oldest generation grew; returns whether
        it ran."""
        now = self.clock()
        # Never resting, the pass is forced only once a middle-generation pass has moved objects into the oldest
        # generation since the last one (gc.get_count()[2]), so a long walk over the steps is not interrupted for
        # nothing.
        if self.due and (now - self.last >= self.idle_s or
                         (now - self.collected >= self.max_wait_s and gc.get_count()[2] > 0)):
            self.due = False
            self.collected = now
            gc.collect()
            return True
        return False

    def stop(self) -> None:
        """Give the process its collector settings back (tests run many apps in one process)."""
        if self._saved is not None:
            gc.set_threshold(*self._saved)
            self._saved = None
        gc.unfreeze()


@contextmanager
def tuned_gc() -> Iterator[IdleCollector]:
    """For a process's entry point: the collector tuned for the viewer while the block runs (pass it to the app as
    `SpecscopeApp(..., collector=c)`), the process's own settings back after."""
    c = IdleCollector()
    c.start()
    try:
        yield c
    finally:
        c.stop()
