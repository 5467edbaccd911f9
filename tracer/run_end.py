"""How a recorded run ends: the end record's state and detail, the stamp clock's `meta` facts bracketed at start and
close, and the device objects of a dead CUDA context kept until the process exits."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from .probe import StepRecord, is_sticky_cuda_error
from .schema import CallError

_DEAD_CONTEXT_OBJECTS: list[Any] = []

# `meta` keys of the stamp clock's offset to the host clock (the GPU's %globaltimer; on the CPU stamps are host
# times), bracketed at the recorder's start and at its clean close.
CLOCK_START, CLOCK_END = "stamp_clock_start", "stamp_clock_end"


def clock_fact(bracket_ns: int, at_ns: int, offset_ns: int) -> str:
    """One bracket of the stamp clock's offset (host ns - stamp ns, `offset_ns`) as a `meta` value: measured at host
    time `at_ns` (perf_counter_ns), good to +-`bracket_ns` / 2."""
    return json.dumps({"bracket_ns": int(bracket_ns), "at_ns": int(at_ns), "offset_ns": int(offset_ns)})


def keep_until_exit(*objs: Any) -> None:
    """Hold device objects of a dead CUDA context until the process ends: destroying them throws inside a
    destructor (the caching allocator queries the context) and aborts the process."""
    _DEAD_CONTEXT_OBJECTS.append(objs)


def end_of(exc: BaseException | None, stopped: bool = False) -> tuple[str, str]:
    """(state, detail) of the end record for a run that `exc` ended (None: it finished; `stopped`: its controller
    stopped it): "closed", "stopped", "interrupted" (Ctrl-C: "SIGINT"), "cuda_error" or "error" (the exception's
    type and the first line of its message)."""
    if stopped:
        return "stopped", " ".join(str(exc or "").split())[:300]
    if exc is None:
        return "closed", ""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted", "SIGINT"  # Python's default SIGINT handler is what raises it
    first = (str(exc).strip().splitlines() or [""])[0]
    detail = f"{type(exc).__name__}: {first}"[:300] if first else type(exc).__name__
    return ("cuda_error" if is_sticky_cuda_error(exc) else "error"), detail


class ErrorLedger:
    """The steps the latest recorded errors went on, by (type name, message): the end record names the step carrying
    the one that ended the run (a run that ends on an error records it last). By value, not the exception itself:
    holding one would hold its traceback's frames and their tensors."""

    def __init__(self) -> None:
        self._on: dict[tuple[str, str], list[StepRecord]] = {}
        self._hit: tuple[StepRecord, BaseException] | None = None  # the step a sticky error was put on, and it

    def note(self, recs: list[StepRecord], exc: BaseException) -> None:
        """`exc` was recorded on `recs` (the 8 latest errors are kept)."""
        key = (type(exc).__name__, str(exc))
        self._on.pop(key, None)
        if len(self._on) >= 8:
            self._on.pop(next(iter(self._on)))
        self._on[key] = recs

    def mark_hit(self, recs: Sequence[StepRecord], launched: Sequence[StepRecord], err: BaseException) -> None:
        """After a sticky CUDA error `err` no step carries: put it, fatal, on the step it hit. The error surfaces at
        the first host sync after the faulting launch: the step launched last and not finished (or else the last
        one issued) is where it hit."""
        if recs and not any(e.fatal for r in recs for e in r.errors):
            hit = max(launched, key=lambda r: r.index) if launched else recs[-1]
            hit.errors.append(CallError("cuda", type(err).__name__, str(err), True))
            self._hit = (hit, err)

    def step_of(self, exc: BaseException | None, failed: BaseException | None) -> int | None:
        """The index of the step that carries `exc` (or an exception it was raised from) as a CallError, if any."""
        if self._hit is not None and failed is not None and exc is failed and self._hit[1] is failed:
            return self._hit[0].index
        seen: set[int] = set()
        while exc is not None and id(exc) not in seen:
            seen.add(id(exc))
            indexes = [r.index for r in self._on.get((type(exc).__name__, str(exc)), ()) if r.index >= 0]
            if indexes:
                return max(indexes)
            exc = exc.__cause__ or exc.__context__
        return None


def host_side_only(rec: StepRecord, is_cuda: bool) -> None:
    """Strip a step of what lived on a device that failed (its copies may never have landed, its stamps are lost),
    keeping those objects alive until exit; an unended step ends now."""
    rec.end_ns = rec.end_ns or time.perf_counter_ns()
    if is_cuda:
        keep_until_exit(rec.spans, rec.packs, rec.floats, rec.done_event)
        rec.packs, rec.floats, rec.done_event = [], [], None
        rec.spans = [s for s in rec.spans if type(s.start) is int and type(s.end) is int]
