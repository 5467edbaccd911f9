"""The recorder: the torch side of the tracer. The engine calls it at each step; it turns what the kernels
consumed into schema records and hands them to the trace writer.

Hot-path rule: on a GPU nothing here synchronizes. Metadata snapshots are copied device->host with
`non_blocking` copies into pinned staging buffers and timed with CUDA events; a step is turned into a
record only once its last event has completed (`poll`), and the SQLite work happens on the writer's thread.
With tracing off the engine uses `NullRecorder`, whose methods do nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from .process_writer import ProcessTraceWriter
from .schema import ForwardMode, GraphPhase, RequestRecord, Violation

_NP_DTYPES = {torch.int32: "int32", torch.int64: "int64", torch.int16: "int16", torch.uint8: "uint8",
              torch.bool: "bool", torch.float32: "float32"}


@dataclass
class _PendingPack:
    host: torch.Tensor  # int64 host copy of the packed snapshot (a pinned-ring slice on a GPU)
    layout: list[tuple[str, torch.dtype, tuple[int, ...], int]]  # name, dtype, full shape, data_ptr
    crop_cols: dict[str, int]
    slot: tuple[int, int] | None = None  # pinned-ring slot (GPU)


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
    requests: dict[str, list[Any]] = field(default_factory=dict)  # columns, see process_writer
    packs: list[_PendingPack] = field(default_factory=list)
    floats: list[tuple[str, torch.Tensor]] = field(default_factory=list)  # sampled attention inputs/outputs
    spans: list[_PendingSpan] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)  # step=-1 and "{step}" until the step ends
    done_event: Any = None  # CUDA event after the last async copy of this step


class NullRecorder:
    """Tracing off: every hook is a no-op, so the engine runs the plain backend."""

    enabled = False

    def begin_step(self, **kw: Any) -> None:
        """No-op."""
        return None

    def end_step(self, rec: Any) -> None:
        """No-op."""

    def snapshot_pack(self, rec: Any, packed: torch.Tensor, layout: list[Any], crop_cols: dict[str, int]) -> None:
        """No-op."""

    def snapshot_float(self, rec: Any, name: str, t: torch.Tensor) -> None:
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

    def __init__(self, writer: ProcessTraceWriter, device: torch.device, ring_int64: int = 8 << 20) -> None:
        self.writer = writer
        self.device = device
        self.is_cuda = device.type == "cuda"
        self._next_index = 0
        self._pending: deque[StepRecord] = deque()
        self._ring = PinnedRing(ring_int64) if self.is_cuda else None
        self._free_events: list[Any] = []
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
        # The index is given when the step ends: steps are numbered in the order their forwards were issued
        # (a verify prepared on the plan stream before the draft still comes after it).
        return StepRecord(-1, iteration, mode, model, step_id, batch_size, padded_batch_size, graph,
                          tokens_per_request, num_draft_tokens, page_size, time.perf_counter_ns())

    def snapshot_pack(self, rec: StepRecord, packed: torch.Tensor,
                      layout: list[tuple[str, torch.dtype, tuple[int, ...], int]], crop_cols: dict[str, int]) -> None:
        """Record a step's metadata: `packed` int64 `[n]` holds the tensors of `layout` flattened in order.

        On a GPU this is one non-blocking copy into the pinned ring; values are read when the step resolves.
        `crop_cols` keeps only the live columns of 2-D tables.
        """
        if self.is_cuda:
            host, slot = self._ring.take(packed.numel(), self._drain_oldest)
            host.copy_(packed, non_blocking=True)
        else:
            host, slot = packed.detach().clone(), None
        rec.packs.append(_PendingPack(host, layout, crop_cols, slot))

    def snapshot_float(self, rec: StepRecord, name: str, t: torch.Tensor) -> None:
        """Record a float tensor as float32 (sampled attention inputs/outputs for the differential check).

        Only sampled steps come here, so a fresh pinned buffer per call is acceptable."""
        if self.is_cuda:
            host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            host.copy_(t, non_blocking=True)
        else:
            host = t.detach().clone()
        rec.floats.append((name, host))

    @contextlib.contextmanager
    def span(self, rec: StepRecord, stream: str, name: str, cuda_stream: Any = None) -> Iterator[None]:
        """Time a region: with CUDA events on `cuda_stream` on a GPU, else with the host clock."""
        if self.is_cuda and cuda_stream is not None:
            start, end = self._event(), self._event()
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
        rec.index = self._next_index
        self._next_index += 1
        rec.violations = [dataclasses.replace(v, step=rec.index, message=v.message.replace("{step}", str(rec.index)))
                          for v in rec.violations]
        if self.is_cuda:
            ev = self._event()
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
            self.writer.write_raw_step(self._resolve(rec))

    def _event(self) -> Any:
        # Events are reused once their step is written: creating one costs more than recording it.
        return self._free_events.pop() if self._free_events else torch.cuda.Event(enable_timing=True)

    def _drain_oldest(self) -> None:
        rec = self._pending[0]
        if rec.done_event is not None:
            rec.done_event.synchronize()
        self.poll()

    def write_request(self, rec: RequestRecord) -> None:
        """A finished request's whole record."""
        self.writer.write_request(rec)

    def close(self) -> None:
        """Wait for the device, write everything pending, and close the trace."""
        if self.is_cuda:
            torch.cuda.synchronize(self.device)
        self.poll()
        self.writer.close()

    def _resolve(self, rec: StepRecord) -> dict[str, Any]:
        """The step in the compact form the writer process turns into a schema Step (`step_from_raw`).

        Kept cheap on purpose: this runs on the engine's thread; unpacking and encoding happen in the writer."""
        spans = []
        for s in rec.spans:
            if isinstance(s.start, torch.cuda.Event):
                start = self._epoch_ns + int(self._epoch.elapsed_time(s.start) * 1e6)
                end = self._epoch_ns + int(self._epoch.elapsed_time(s.end) * 1e6)
                spans.append((s.stream, s.name, start, end))
            else:
                spans.append((s.stream, s.name, int(s.start), int(s.end)))
        packs = [(p.host.numpy().copy(), [(n, _NP_DTYPES[d], sh, ptr) for n, d, sh, ptr in p.layout], p.crop_cols)
                 for p in rec.packs]
        floats = [(name, "float32" if t.is_floating_point() else _NP_DTYPES[t.dtype], tuple(t.shape), 0,
                   t.float().numpy() if t.is_floating_point() else t.numpy()) for name, t in rec.floats]
        for p in rec.packs:
            if p.slot is not None:
                self._ring.release(p.slot)
        if self.is_cuda:
            self._free_events.extend(e for sp in rec.spans for e in (sp.start, sp.end)
                                     if isinstance(e, torch.cuda.Event))
            if rec.done_event is not None:
                self._free_events.append(rec.done_event)
        header = dict(index=rec.index, iteration=rec.iteration, mode=rec.mode.value, model=rec.model,
                      step_id=rec.step_id, batch_size=rec.batch_size, padded_batch_size=rec.padded_batch_size,
                      graph=rec.graph.value, tokens_per_request=rec.tokens_per_request,
                      num_draft_tokens=rec.num_draft_tokens, page_size=rec.page_size, start_ns=rec.start_ns,
                      end_ns=rec.end_ns, scalars=rec.scalars)
        return dict(header=header, requests=rec.requests, arrays=floats, packs=packs, spans=spans,
                    violations=[v.to_dict() for v in rec.violations])


class PinnedRing:
    """Pinned host memory for snapshots, handed out in order and reused once their steps are written."""

    def __init__(self, num_int64: int) -> None:
        self.buf = torch.empty(num_int64, dtype=torch.int64, pin_memory=True)
        self.head = 0
        self.live: list[tuple[int, int]] = []  # [start, end) slots whose steps are not written yet

    def take(self, n: int, drain_oldest: Callable[[], None]) -> tuple[torch.Tensor, tuple[int, int]]:
        """A slot of `n` int64; waits for the oldest pending step only while the slot is still in use."""
        size = self.buf.numel()
        if n > size:
            raise ValueError(f"a snapshot of {n} values does not fit the pinned ring ({size})")
        start = self.head if self.head + n <= size else 0
        while any(a < start + n and start < b for a, b in self.live):
            drain_oldest()
        slot = (start, start + n)
        self.live.append(slot)
        self.head = start + n
        return self.buf[start:start + n], slot

    def release(self, slot: tuple[int, int]) -> None:
        """The slot's values have been copied out."""
        self.live.remove(slot)
