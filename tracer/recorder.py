"""The recorder: the torch side of the tracer. The engine calls it at each step; it turns what the kernels
consumed into schema records and hands them to the trace writer.

Hot-path rule: on a GPU nothing here synchronizes. Metadata snapshots are copied device->host with
`non_blocking` copies into pinned staging buffers and timed with CUDA events; a step is turned into a
record only once its last event has completed (`poll`), and the SQLite work happens on the writer's thread.
With tracing off the engine uses `NullRecorder`, whose methods do nothing.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .schema import ArraySnapshot, ForwardMode, GraphPhase, RequestRecord, RequestState, Step, StreamSpan, Violation
from .store import TraceWriter

_NP_DTYPES = {torch.int32: "int32", torch.int64: "int64", torch.uint16: "uint16", torch.float32: "float32",
              torch.bfloat16: "bfloat16", torch.float16: "float16", torch.bool: "bool"}


@dataclass
class _PendingArray:
    name: str
    dtype: str
    shape: tuple[int, ...]
    data_ptr: int
    host: torch.Tensor  # host copy (pinned staging on a GPU), filled asynchronously


@dataclass
class _PendingSpan:
    stream: str
    name: str
    start: Any  # int ns (host) or torch.cuda.Event
    end: Any


@dataclass
class StepRecord:
    """A step under construction; the engine fills it, `Recorder.end_step` queues it."""

    index: int
    iteration: int
    mode: ForwardMode
    model: str
    step_id: int | None
    batch_size: int
    padded_batch_size: int
    graph: GraphPhase
    tokens_per_request: int
    num_draft_tokens: int
    page_size: int
    start_ns: int
    end_ns: int = 0
    scalars: dict[str, int] = field(default_factory=dict)
    requests: list[RequestState] = field(default_factory=list)
    arrays: list[_PendingArray] = field(default_factory=list)
    spans: list[_PendingSpan] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    done_event: Any = None  # CUDA event after the last async copy of this step


class NullRecorder:
    """Tracing off: every hook is a no-op, so the engine runs the plain backend."""

    enabled = False

    def begin_step(self, **kw: Any) -> None:
        """No-op."""
        return None

    def end_step(self, rec: Any) -> None:
        """No-op."""

    def snapshot(self, rec: Any, name: str, t: torch.Tensor, *, rows: int | None = None,
                 cols: int | None = None) -> None:
        """No-op."""

    @contextlib.contextmanager
    def span(self, rec: Any, stream: str, name: str, cuda_stream: Any = None) -> Iterator[None]:
        """No-op."""
        yield

    def write_request(self, rec: RequestRecord) -> None:
        """No-op."""

    def poll(self) -> None:
        """No-op."""

    def close(self) -> None:
        """No-op."""


class Recorder:
    """Builds steps and writes them to a `TraceWriter` once their device work has completed."""

    enabled = True

    def __init__(self, writer: TraceWriter, device: torch.device) -> None:
        self.writer = writer
        self.device = device
        self.is_cuda = device.type == "cuda"
        self._next_index = 0
        self._pending: deque[StepRecord] = deque()
        self._epoch = None
        if self.is_cuda:
            # One synchronized epoch event puts every stream's event times on the host clock's axis.
            torch.cuda.synchronize(device)
            self._epoch = torch.cuda.Event(enable_timing=True)
            self._epoch.record(torch.cuda.current_stream(device))
            torch.cuda.synchronize(device)
            self._epoch_ns = time.perf_counter_ns()

    def begin_step(self, *, iteration: int, mode: ForwardMode, model: str, step_id: int | None,
                   batch_size: int, padded_batch_size: int, graph: GraphPhase, tokens_per_request: int,
                   num_draft_tokens: int, page_size: int) -> StepRecord:
        """Open a step record."""
        rec = StepRecord(self._next_index, iteration, mode, model, step_id, batch_size, padded_batch_size, graph,
                         tokens_per_request, num_draft_tokens, page_size, time.perf_counter_ns())
        self._next_index += 1
        return rec

    def snapshot(self, rec: StepRecord, name: str, t: torch.Tensor, *, rows: int | None = None,
                 cols: int | None = None) -> None:
        """Record tensor `t` as the kernel sees it: address and full shape, values of `[:rows, :cols]`."""
        part = t
        if rows is not None:
            part = part[:rows]
        if cols is not None and part.dim() == 2:
            part = part[:, :cols]
        if self.is_cuda:
            host = torch.empty(part.shape, dtype=part.dtype, pin_memory=True)
            host.copy_(part, non_blocking=True)
        else:
            host = part.detach().clone()
        rec.arrays.append(_PendingArray(name, _NP_DTYPES.get(t.dtype, str(t.dtype)), tuple(t.shape),
                                        int(t.data_ptr()), host))

    @contextlib.contextmanager
    def span(self, rec: StepRecord, stream: str, name: str, cuda_stream: Any = None) -> Iterator[None]:
        """Time a region: with CUDA events on `cuda_stream` on a GPU, else with the host clock."""
        if self.is_cuda and cuda_stream is not None:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record(cuda_stream)
            yield
            end.record(cuda_stream)
            rec.spans.append(_PendingSpan(stream, name, start, end))
        else:
            t0 = time.perf_counter_ns()
            yield
            rec.spans.append(_PendingSpan(stream, name, t0, time.perf_counter_ns()))

    def end_step(self, rec: StepRecord) -> None:
        """Close the step; it is written once its device work completes."""
        rec.end_ns = time.perf_counter_ns()
        if self.is_cuda:
            ev = torch.cuda.Event()
            ev.record(torch.cuda.current_stream(self.device))
            rec.done_event = ev
        self._pending.append(rec)
        self.poll()

    def poll(self) -> None:
        """Write every pending step whose device work has completed (in order; never blocks)."""
        while self._pending:
            rec = self._pending[0]
            if rec.done_event is not None and not rec.done_event.query():
                return
            if any(isinstance(s.end, torch.cuda.Event) and not s.end.query() for s in rec.spans):
                return
            self._pending.popleft()
            self.writer.write_step(self._resolve(rec))

    def write_request(self, rec: RequestRecord) -> None:
        """A finished request's whole record."""
        self.writer.write_request(rec)

    def close(self) -> None:
        """Wait for the device, write everything pending, and close the trace."""
        if self.is_cuda:
            torch.cuda.synchronize(self.device)
        self.poll()
        self.writer.close()

    def _resolve(self, rec: StepRecord) -> Step:
        spans = []
        for s in rec.spans:
            if isinstance(s.start, torch.cuda.Event):
                start = self._epoch_ns + int(self._epoch.elapsed_time(s.start) * 1e6)
                end = self._epoch_ns + int(self._epoch.elapsed_time(s.end) * 1e6)
                spans.append(StreamSpan(s.stream, s.name, start, end))
            else:
                spans.append(StreamSpan(s.stream, s.name, int(s.start), int(s.end)))
        arrays = tuple(ArraySnapshot(a.name, a.dtype, a.shape, a.data_ptr, _to_numpy(a.host)) for a in rec.arrays)
        return Step(
            index=rec.index, iteration=rec.iteration, mode=rec.mode, model=rec.model, step_id=rec.step_id,
            batch_size=rec.batch_size, padded_batch_size=rec.padded_batch_size, graph=rec.graph,
            tokens_per_request=rec.tokens_per_request, num_draft_tokens=rec.num_draft_tokens,
            page_size=rec.page_size, start_ns=rec.start_ns, end_ns=rec.end_ns, scalars=dict(rec.scalars),
            requests=tuple(rec.requests), arrays=arrays, spans=tuple(spans), violations=tuple(rec.violations))


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        return t.float().numpy()
    if t.dtype == torch.uint16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()
