"""The streaming checker: `Checker.feed(step)` runs the per-step checks and the trackers that keep state between
steps, in a fixed order; `check_steps` is a loop over it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar, overload

from ..differential import differential_check
from ..schema import GraphPhase, RunInfo, Step, Violation
from .acceptance import Acceptance
from .across_rows import check_capture, check_ownership, check_padding, check_row_ownership
from .capture import GraphState, PageBuffers
from .catalogue import CATALOGUE, METADATA_FACTS
from .context import Ctx
from .form import (
    check_context_boundaries,
    check_finite,
    check_mirror,
    check_query_tokens,
    check_shapes,
    check_values,
    check_verify_and_extend,
)
from .order import check_errors, check_streams
from .requests import Requests
from .within_row import check_identity, check_pages, check_row_pages, check_tokens

if TYPE_CHECKING:
    from ..reader import TraceReader


class Checker:
    """The streaming checker: feed steps in index order; it keeps the state between them (capture/replay,
    page-table buffers, committed lengths, acceptance stretches).

    A live viewer (or the checker process beside a run's writer) calls `feed` as each step is committed and
    can break on the violations it returns; `check_steps` is a loop over it. Pass the trace's `run` so the
    greedy-only part of I31 knows the sampling temperature (without it that part is skipped). A schema-1 trace
    records no wait edges: `Checker.for_trace(reader)` passes both, and I21/I22 then judge timestamps only.
    """

    def __init__(self, run: RunInfo | None = None, *, waits_recorded: bool = True) -> None:
        temp = None if run is None else run.config.get("temperature")
        self._waits_recorded = waits_recorded
        self._graphs = GraphState()
        self._pages = PageBuffers()
        self._accept = Acceptance(None if temp is None else float(temp) <= 0)
        self._requests = Requests()
        self._last: int | None = None  # index of the step fed last
        # Facts the backend does not record (run.config["not_recorded"]): the invariants that need one are skipped
        # rather than judged on a made-up value. A trace without the key skips nothing.
        nr = (run.config.get("not_recorded") if run is not None else None) or {}
        fields = {str(k): str(v) for k, v in (nr.get("fields") or {}).items()}
        self._replay_reason: str | None = nr.get("replay_metadata")
        self._absent: dict[str, str] = {}  # invariant -> the fields it lacks and why
        for inv in CATALOGUE:
            lack = [f for f in inv.facts if f in fields]
            if lack:
                self._absent[inv.check_id] = "; ".join(f"{f}: {fields[f]}" for f in lack)
        self._skip = frozenset(self._absent)
        self._replay_skip = self._skip | {i.check_id for i in CATALOGUE if METADATA_FACTS & set(i.facts)}
        self._skipped: dict[str, int] = {}  # invariant -> steps it was skipped on
        self._replays_skipped = 0

    @classmethod
    def for_trace(cls, reader: TraceReader) -> Checker:
        """A checker for the steps of `reader`'s trace: its run settings and whether it recorded wait edges."""
        return cls(reader.run, waits_recorded=reader.waits_recorded())

    def not_recorded(self) -> list[tuple[str, str, int]]:
        """(invariant, why, steps skipped) for each invariant skipped because the backend did not record a fact it
        needs: named fields, or the metadata of CUDA-graph replays. Empty for a trace that records everything."""
        out = []
        for inv in CATALOGUE:
            cid = inv.check_id
            if cid in self._absent:
                out.append((cid, self._absent[cid], self._skipped.get(cid, 0)))
            elif cid in self._replay_skip and self._replays_skipped:
                out.append((cid, f"replay metadata: {self._replay_reason}", self._replays_skipped))
        return out

    def feed(self, step: Step) -> list[Violation]:
        """Every violation of `step` (a step whose arrays cannot be checked is an I2 violation, never a crash).

        Steps whose indexes skip (a bundle keeps the original run's numbers, with the captures it adds before its
        range) leave a gap: what the steps in it committed is unknown, so the relations between consecutive steps
        (I32's committed lengths, I35's stretches, I40's iteration) start afresh after it. Captures stay (I15 / I16
        compare a replay with its capture wherever it is), and so do the graph buffers (I19 fires only on a page the
        step's own req_to_token contradicts) and committed pages (I41: a committed slot never moves)."""
        if self._last is not None and step.index > self._last + 1:
            self._accept.gap()
            self._requests.gap()
        self._last = step.index
        skip = self._skip
        if self._replay_reason and step.graph == GraphPhase.REPLAY and not step.arrays and not step.scalars:
            skip = self._replay_skip  # metadata computed inside the graph: nothing recorded to judge
            self._replays_skipped += 1
        for cid in self._absent:
            self._skipped[cid] = self._skipped.get(cid, 0) + 1
        c = Ctx(step, skip)
        rows_ok = True
        if step.arrays:
            rows_ok = _guard(c, check_shapes, default=False)
            _guard(c, check_query_tokens)
            if rows_ok:
                for f in (check_values, check_verify_and_extend, check_context_boundaries, check_mirror,
                          check_pages, check_ownership, check_tokens, check_padding, check_row_pages,
                          check_row_ownership, check_identity):
                    _guard(c, f)
                if step.graph == GraphPhase.CAPTURE:
                    _guard(c, check_capture)
            _guard(c, self._graphs.check)
            _guard(c, lambda c: self._pages.check(c, rows_ok))
            if rows_ok and step.array("attn_q") is not None:
                _guard(c, check_finite)
                _guard(c, lambda c: c.out.extend(v for v in differential_check([step]) if v.check_id not in c.skip))
        _guard(c, lambda c: check_streams(c, self._waits_recorded))
        _guard(c, check_errors)
        _guard(c, self._accept.check)
        if rows_ok:
            _guard(c, self._requests.check)
        return c.out


_T = TypeVar("_T")


@overload
def _guard(c: Ctx, f: Callable[[Ctx], _T], default: _T) -> _T: ...
@overload
def _guard(c: Ctx, f: Callable[[Ctx], None]) -> None: ...
def _guard(c: Ctx, f: Callable[[Ctx], Any], default: Any = None) -> Any:
    """Run one check; arrays too inconsistent for it are reported as I2 instead of crashing the checker."""
    try:
        return f(c)
    except (IndexError, ValueError, KeyError, TypeError) as e:
        name = getattr(f, "__name__", "a check").lstrip("_")
        c.v("I2", f"the recorded arrays are inconsistent; {name} could not run ({type(e).__name__}: {e})")
        return default


def check_steps(steps: Iterable[Step], run: RunInfo | None = None, *,
                waits_recorded: bool = True) -> Iterator[Violation]:
    """Every violation, in step order (a loop over `Checker.feed`)."""
    checker = Checker(run, waits_recorded=waits_recorded)
    for step in steps:
        yield from checker.feed(step)
