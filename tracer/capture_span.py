"""A region's time on the recorder: `Recorder.span`'s context manager (device stamps on a stream's stamp ring, or
host clock times), and the step records a step-level call names."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Literal

from .probe import StepRecord, _PendingSpan

if TYPE_CHECKING:
    from .probe import Steps
    from .stamps import StampRing


class Span:
    """`Recorder.span`: on a stamp ring, a stamp on entry and on a clean exit; without one (a host region on a GPU
    run), host clock times. A small class: a generator-based context manager cost several µs per span on the launch
    path."""

    __slots__ = ("recs", "stream", "name", "ring", "a")

    def __init__(self, recs: list[StepRecord], stream: str, name: str, ring: StampRing | None) -> None:
        self.recs, self.stream, self.name, self.ring, self.a = recs, stream, name, ring, 0

    def __enter__(self) -> None:
        self.a = self.ring.stamp() if self.ring is not None else time.perf_counter_ns()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Literal[False]:
        if exc_type is None:
            ring = self.ring
            start: int | tuple[StampRing, int]
            end: int | tuple[StampRing, int]
            if ring is None:
                start, end = self.a, time.perf_counter_ns()
            else:
                start, end = (ring, self.a), (ring, ring.stamp())
            for r in self.recs:
                r.spans.append(_PendingSpan(self.stream, self.name, start, end))
        return False


def records_of(rec: Steps) -> list[StepRecord]:
    """The records a step-level call names: one, several, or none (a step not recorded)."""
    if type(rec) is StepRecord:  # the common case first: every step-level hook comes through here
        return [rec]
    if rec is None:
        return []
    if isinstance(rec, StepRecord):
        return [rec]
    return [r for r in rec if r is not None]  # a list or tuple of steps
