"""Compute and plan streams: real CUDA streams on a GPU, host-ordered no-ops on the CPU; NVTX ranges per phase.

The wait methods say whether they enqueued a wait, so the engine records exactly the wait edges it enqueued.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from ..tracer import user_env


class Streams:
    """The compute stream and the overlap plan stream of one engine."""

    def __init__(self, device: torch.device, plan_stream: bool) -> None:
        self.is_cuda = device.type == "cuda"
        self.device = device
        self.plan_enabled = plan_stream
        # None on the CPU, where the engine runs everything in host order.
        self.compute: torch.cuda.Stream | None = torch.cuda.current_stream(device) if self.is_cuda else None
        self.plan: torch.cuda.Stream | None = torch.cuda.Stream(device) if (self.is_cuda and plan_stream) else None
        # One event per edge, re-recorded each time: a wait takes the event's state when it is enqueued, and
        # creating an event per wait (as Stream.wait_stream does) costs the host more than recording one.
        self._producers: torch.cuda.Event | None = torch.cuda.Event() if self.is_cuda else None
        self._plan_done: torch.cuda.Event | None = torch.cuda.Event() if self.plan is not None else None

    @contextlib.contextmanager
    def on_plan(self) -> Iterator[torch.cuda.Stream | None]:
        """Run the body on the plan stream (or the compute stream when the plan stream is off)."""
        if self.plan is None:
            yield self.compute
            return
        with torch.cuda.stream(self.plan):
            yield self.plan

    def record_producers(self, stream: torch.cuda.Stream | None) -> torch.cuda.Event | None:
        """The producers' event, recorded on `stream` now (None on the CPU); valid until the next call."""
        ev = self._producers  # None exactly on the CPU
        if ev is None:
            return None
        ev.record(stream)
        return ev

    def plan_wait(self, event: torch.cuda.Event | None) -> bool:
        """Order the plan stream after `event` (the producers of seq_lens and req_to_token); True when a wait was
        enqueued (on the CPU the emulated plan stream runs in host order, so the wait is enqueued trivially)."""
        if not self.plan_enabled:
            return False
        if self.plan is not None and event is not None:
            self.plan.wait_event(event)
        return True

    def compute_wait_plan(self) -> bool:
        """Order the compute stream after everything enqueued on the plan stream; True when a wait was enqueued."""
        if not self.plan_enabled:
            return False
        if self.plan is not None:
            assert self._plan_done is not None and self.compute is not None  # made with the plan stream, on a GPU
            self._plan_done.record(self.plan)
            self.compute.wait_event(self._plan_done)
        return True


_NO_RANGE = contextlib.nullcontext()


def nvtx_wanted() -> bool:
    """Whether NVTX ranges would reach anything: a tool (Nsight Systems, Nsight Compute) injected itself, or
    SPECSCOPE_NVTX=1 asks. Without one a range is a no-op that still costs the host ~2 µs of Python."""
    asked = user_env.get(user_env.NVTX)
    if asked is not None:
        return asked not in ("", "0")
    return user_env.profiler_attached()


def nvtx(name: str, enabled: bool) -> contextlib.AbstractContextManager[None]:
    """An NVTX range, so a run lines up with Nsight Systems; a shared no-op context when not `enabled`."""
    return _nvtx_range(name) if enabled else _NO_RANGE


@contextlib.contextmanager
def _nvtx_range(name: str) -> Iterator[None]:
    torch.cuda.nvtx.range_push(name)
    try:
        yield
    finally:
        torch.cuda.nvtx.range_pop()
