"""Eager stamps as CUDA timing events, read on the stamps' clock (%globaltimer): a host-issued span's two ends cost
two driver event records instead of two stamp-kernel launches.

Why: a recorded event costs the host ~1.3-2.5 µs against a stamp launch's ~4.5-7 µs on the H200, and no kernel runs
on the stream (`scripts/event_clock.py`, benchmarks/results/event_clock-9b9cb5f.json). The eager spans were the
largest single part of the recorder's cost at the Llama-3-8B shape (benchmarks/results/README.md, session 11).

Why it is the same clock: on the H200 an event recorded right after a stamp kernel reads the stamp's %globaltimer
value +0.16 µs (band -0.7..+0.5 µs), and a chain of such pairs 2 s apart drifts 0 ppm over 20 s (event_clock). So an
event's time on the stamp axis is the time of a stamp next to it plus the events' elapsed time between them. Each
drain of the events lays such an anchor, a stamp kernel and an event right behind it on the same stream, after every
event it covers; an event's value is the anchor's stamp minus the elapsed time from the event to the anchor's event
(positive, short: `cuEventElapsedTime` is float ms, ~0.5 µs resolution). Where the previous anchor is nearer in GPU
time (the stream idled between the event and the drain), that one is used instead.

Only GPU runs use this (`Recorder.span` on a CUDA stream); on the CPU a stamp is a host time, as before. Captured
graphs keep their stamp-kernel nodes (an event record cannot stand for a timestamp inside a capture).
"""

from __future__ import annotations

import bisect
import ctypes
from collections import deque
from collections.abc import Callable

from .stamps import SLOTS, StampRing, _driver

_LONG_MS = 50.0  # elapsed to the next anchor beyond which the previous anchor is tried too (float ms loses ns)


class EventStamps:
    """The eager stamps of one CUDA stream as pooled timing events, anchored to `stamps` (the stream's StampRing).

    It numbers, drains, completes and reads stamps as a StampRing does (`stamp`, `drain`, `completed`, `wait`,
    `value`, `on_lap`), so the recorder treats both alike."""

    def __init__(self, stamps: StampRing, slots: int = SLOTS) -> None:
        self.stamps = stamps
        self.is_cuda = True
        self.stream_handle = stamps.stream_handle
        self.slots = slots
        self.count = 0  # numbers handed out
        self.drained = 0  # numbers an anchor covers
        self.on_lap: Callable[[int], None] | None = None  # called before an event of a number below it is reused
        drv = _driver()
        self._drv = drv
        self._check = drv._check
        self._record = drv.event_record
        self._elapsed = drv.event_elapsed
        self._h = ctypes.c_void_p(self.stream_handle)
        self._ms = ctypes.c_float()
        self._events: list[int] = []  # the event of number n is _events[n % slots], re-recorded `slots` numbers on
        self._read_below = 0  # on_lap has read out every number below this
        self._pending: deque[tuple[int, int, int]] = deque()  # anchors in flight: (end, event, stamp number)
        self._ends: list[int] = []  # landed anchors: numbers below `end` are covered, ...
        self._anchors: list[tuple[int, int]] = []  # ... and their (event, stamp ns)
        self._free: list[int] = []  # anchor events no longer needed
        self._done = 0

    def stamp(self) -> int:
        """Record the next event on the stream; returns its number."""
        seq = self.count
        if seq < self.slots:
            ev = self._drv.new_event(timing=True)
            self._events.append(ev)
        else:
            if seq - self.slots >= self._read_below:
                self._lap(seq)
            ev = self._events[seq % self.slots]
        rc = self._record(ev, self._h)
        if rc:
            self._check(rc, "cuEventRecord")
        self.count = seq + 1
        if self.count - self.drained >= self.slots // 2:
            self.drain()  # an anchor before the events of this half can be reused
        return seq

    def _lap(self, seq: int) -> None:
        below = seq - self.slots + self.slots // 2  # half a ring at a time
        if self.on_lap is not None:
            self.on_lap(below)
        self._read_below = below

    def drain(self) -> None:
        """Lay an anchor after every event numbered so far (a stamp and an event on the stream), and drain the
        stamp ring it is read from (no host sync)."""
        if self.drained == self.count:
            return
        self.completed()  # harvest landed anchors before their stamps' slots can be reused
        a_seq = self.stamps.stamp()
        ev = self._free.pop() if self._free else self._drv.new_event(timing=True)
        rc = self._record(ev, self._h)
        if rc:
            self._check(rc, "cuEventRecord")
        self._pending.append((self.count, ev, a_seq))
        self.drained = self.count
        self.stamps.drain()

    def completed(self) -> int:
        """Numbers below this have their values (their anchor's stamp has landed, so they have run)."""
        pending = self._pending
        if pending:
            landed = self.stamps.completed()
            while pending and pending[0][2] < landed:
                end, ev, a_seq = pending.popleft()
                self._ends.append(end)
                self._anchors.append((ev, self.stamps.value(a_seq)))
                self._done = end
            self._prune()
        return self._done

    def _prune(self) -> None:
        # Anchors of numbers whose events have been re-recorded since are of no use; keep the two newest anyway.
        stale = bisect.bisect_right(self._ends, self.count - self.slots)
        stale = min(stale, len(self._ends) - 2)
        if stale > 0:
            self._free.extend(ev for ev, _ in self._anchors[:stale])
            del self._ends[:stale], self._anchors[:stale]

    def wait(self, seq: int) -> None:
        """Block until number `seq` has its value (laying its anchor first if need be)."""
        if seq >= self.drained:
            self.drain()
        for end, _, a_seq in self._pending:
            if end > seq:
                self.stamps.wait(a_seq)
                break
        self.completed()

    def value(self, seq: int) -> int:
        """The device time (ns, the stamps' clock) of number `seq`; valid once `completed() > seq` and until its
        event is re-recorded `slots` numbers later."""
        k = bisect.bisect_right(self._ends, seq)  # the first anchor laid after it
        ev = self._events[seq % self.slots]
        a_ev, a_ns = self._anchors[k]
        ms = self._ms_between(ev, a_ev)
        if ms > _LONG_MS and k > 0:
            p_ev, p_ns = self._anchors[k - 1]
            back = self._ms_between(p_ev, ev)
            if back < ms:
                return p_ns + round(back * 1e6)
        return a_ns - round(ms * 1e6)

    def _ms_between(self, first: int, then: int) -> float:
        rc = self._elapsed(ctypes.byref(self._ms), first, then)
        if rc:
            self._check(rc, "cuEventElapsedTime")
        return self._ms.value
