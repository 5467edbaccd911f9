"""The recorder: the torch side of the tracer. The engine calls it at each step; it turns what the kernels
consumed into schema records and hands them to the trace writer.

Hot-path rule: on a GPU nothing here synchronizes. Metadata snapshots are copied device->host with
`non_blocking` copies into pinned staging buffers (or, for graph replays, written into a device ring inside the
graph); spans are timed by stamps the GPU writes itself (`tracer.stamps`: captured in the graphs, one driver call
when eager), all on one device clock; a step is turned into a record only once its stamps and copies have landed
(`poll`), and the SQLite work happens in the writer's process.
The engine calls it through the `tracer.probe.Probe` protocol; with tracing off it calls `NullProbe`, whose
methods do nothing.

What the engine records are facts, never verdicts: spans (stream, documented name, start/end ns), the wait
edges it really enqueued (`StreamWait`), calls that raised (`CallError`, message verbatim) and, for fault
accounting only, the injected faults that changed a step. Only `tracer/checks/` turns facts into violations.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .capture_span import Span, records_of
from .errors import TraceError
from .pinned_ring import PinnedRing
from .probe import StepRecord, _PendingPack, _PendingSpan, is_sticky_cuda_error
from .ring_pack import SnapshotRing
from .run_end import CLOCK_END, CLOCK_START, ErrorLedger, clock_fact, end_of, host_side_only, keep_until_exit
from .schema import CallError, ForwardMode, GraphPhase, RequestRecord
from .stamps import StampClock, StampRing, bracket_offset
from .step_resolver import StepResolver
from .step_sink import StepSink

if TYPE_CHECKING:
    from .probe import Layout, LayoutEntry, RequestColumns, Steps

RING_BYTES = 64 << 20  # device (and pinned host) memory of the snapshot ring
RESOLVE_PER_POLL = 32  # steps resolved per hot-path poll (an iteration makes 3-7)
# Steps ended between two resolving polls: resolving, encoding and sending a batch in one pass runs on caches the
# previous step of the pass warmed, where one record per iteration, between the engine's own work, runs on caches
# that work left cold and costs several times as much.
RESOLVE_BATCH = 16
QUIET_NS = 20_000_000  # a step pending this long is resolved at the next poll, due or not (a quiet or slow run)
DRAIN_STAMPS = 16  # undrained stamps of a stream before a poll drains them for the step waiting on them
LATER_MAX = 32  # deferred calls (`Recorder.later`) held before they run anyway


class Recorder:
    """Builds steps and writes them to a `TraceWriter` once their device work has completed."""

    enabled = True

    def __init__(self, writer: StepSink, device: torch.device, ring_int64: int = 8 << 20) -> None:
        self.writer = writer
        self.device = device
        self.is_cuda = device.type == "cuda"
        self._next_index = 0
        self._pending: deque[StepRecord] = deque()
        self._open: list[StepRecord] = []  # begun, not ended (their order decides which step a crash marks)
        self._ending: list[StepRecord] = []  # ended, not queued yet (`_settle`; still in `_open` until then)
        self._ring = PinnedRing(ring_int64) if self.is_cuda else None
        self._free_events: list[Any] = []
        self._failed: BaseException | None = None  # a sticky CUDA error: no device call may run any more
        self._errors = ErrorLedger()  # which step carries the error that ended the run
        self.ring: SnapshotRing | None = None  # opened by the engine before it captures graphs
        self._outbox: list[dict[str, Any]] = []  # resolved steps, sent to the writer in batches
        self._later: list[tuple[Callable[..., None], tuple[object, ...]]] = []  # see `later`
        self._ended = self._ended_at_pass = 0  # steps ended, and their number at the last resolving poll
        background = getattr(writer, "send_in_background", None)  # a writer process's client has one
        if self.is_cuda and background is not None:
            # Tiny models make steps faster than the writer child stores them: the engine must not wait on the pipe.
            background()
        # One stamp ring per stream; the compute stream's is the one captured graphs stamp (`compute_stamps`).
        self._stamps: dict[Any, StampRing] = {}
        self._np_views: dict[int, tuple[torch.Tensor, np.ndarray]] = {}  # see snapshot_host
        self.compute_stamps = self.stamp_ring("compute", torch.cuda.current_stream(device) if self.is_cuda else None)
        self.clock = StampClock(self.compute_stamps)  # device stamps -> host ns, measured once
        clock = self.clock
        self.writer.write_meta(CLOCK_START, clock_fact(clock.bracket_ns, clock.at_ns, clock.offset_ns))
        self._resolver = StepResolver(clock, self._ring, self._free_events)

    def open_ring(self, width: int, budget_bytes: int | None = None) -> SnapshotRing:
        """The device rows captured graphs write their snapshots into (`width` int64 per row, the largest pack a
        graph makes); rows are sized to `budget_bytes` of device and of pinned host memory each."""
        rows = max(16, min(512, (budget_bytes or RING_BYTES) // (8 * max(width, 1))))
        self.ring = self._resolver.ring = SnapshotRing(self.device, width, rows)
        # Replays run on the compute stream, and their rows are drained there (after them, before any later one).
        self.ring.stream_handle = self.compute_stamps.stream_handle
        return self.ring

    def begin_step(self, *, iteration: int, mode: ForwardMode, model: str, step_id: int | None,
                   batch_size: int, padded_batch_size: int, graph: GraphPhase, tokens_per_request: int,
                   num_draft_tokens: int, page_size: int) -> StepRecord:
        """Open a step record."""
        rec = StepRecord(-1, iteration, mode, model, step_id, batch_size, padded_batch_size, graph,
                         tokens_per_request, num_draft_tokens, page_size, time.perf_counter_ns())
        self._open.append(rec)
        return rec

    @property
    def next_index(self) -> int:
        """The index the next numbered step gets."""
        return self._next_index

    def assign_index(self, rec: StepRecord) -> int:
        """Give `rec` its step index now (idempotent): steps are numbered in the order their forwards were issued
        (a verify prepared on the plan stream before the draft still comes after it), so the engine calls this
        when it launches a forward; `end_step` numbers any step not numbered yet."""
        if rec.index < 0:
            rec.index = self._next_index
            self._next_index += 1
        return rec.index

    def snapshot_pack(self, rec: StepRecord, packed: torch.Tensor, layout: Layout, crop_cols: dict[str, int]) -> None:
        """Record a step's metadata: `packed` int64 `[n]` holds the tensors of `layout` flattened in order.

        On a GPU this is one non-blocking copy into the pinned ring; values are read when the step resolves.
        `crop_cols` keeps only the live columns of 2-D tables.
        """
        if self.is_cuda:
            assert self._ring is not None, "a GPU recorder has its pinned ring"
            host, slot = self._ring.take(packed.numel(), self._drain_oldest)
            host.copy_(packed, non_blocking=True)
        else:
            host, slot = packed.detach().clone(), None
        rec.packs.append(_PendingPack(host, layout, crop_cols, slot))

    def snapshot_ring(self, rec: StepRecord, length: int, layout: Layout, crop_cols: dict[str, int],
                      seq: int | None = None) -> None:
        """Record the metadata that the replay just launched wrote into its SnapshotRing row (`length` int64 values
        of `layout`; `seq`: the row's number if `claim_row` gave it at launch): no device work here; the values
        arrive with the next drain."""
        if seq is None:
            assert self.ring is not None, "the engine opens the snapshot ring before it replays graphs"
            seq = self.ring.claim()
        rec.packs.append(_PendingPack(None, layout, crop_cols, None, seq, length))
        self._drain_ring(force=False)

    def claim_row(self) -> int:
        """Number the SnapshotRing row of the replay just launched (replays are numbered in launch order), for a
        `snapshot_ring` made later. Undrained rows never reach half the ring: past that the deferred records are
        made and the rows drained now, so the device cannot lap a row before it is copied."""
        ring = self.ring
        assert ring is not None, "the engine opens the snapshot ring before it replays graphs"
        seq = ring.claim()
        if ring.count - ring.drained > ring.rows // 2:
            self.run_later()
            self._drain_ring(force=True)
        return seq

    def later(self, fn: Callable[..., None], *args: object) -> None:
        """Run `fn(*args)` before the next poll resolves a step (or a flush, or close): host bookkeeping of values
        that do not change until then, moved off the launch path. The caller guarantees they do not (the model
        runner makes its deferred records before it prepares the same graph or backend again)."""
        self._later.append((fn, args))
        if len(self._later) >= LATER_MAX:
            self.run_later()

    def run_later(self) -> None:
        """Run the deferred calls now, in the order they were deferred."""
        while self._later:
            fn, args = self._later.pop(0)  # taken off first: a call that raises is not made twice
            fn(*args)

    def intern_layout(self, layout: Layout) -> tuple[LayoutEntry, ...]:
        """`layout` with numpy dtype names, as the one shared tuple of its value (see `StepResolver.intern_layout`)."""
        return self._resolver.intern_layout(layout)

    def snapshot_float(self, rec: StepRecord, name: str, t: torch.Tensor) -> None:
        """Record a float tensor as float32 (sampled attention inputs/outputs for the differential check).

        Only sampled steps come here, so a fresh pinned buffer per call is acceptable."""
        if self.is_cuda:
            host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            host.copy_(t, non_blocking=True)
        else:
            host = t.detach().clone()
        rec.floats.append((name, host))

    def snapshot_host(self, rec: StepRecord, name: str, t: torch.Tensor) -> None:
        """Record a host tensor (e.g. the `seq_lens_cpu` mirror) as it is now: a host copy, no device work."""
        # A graph's host buffers come back step after step: keep their numpy views (held with the tensor, so the
        # id is not reused while cached; `t.numpy()` costs more than the copy).
        hit = self._np_views.get(id(t))
        if hit is None or hit[0] is not t:
            if len(self._np_views) >= 256:
                self._np_views.clear()
            hit = self._np_views[id(t)] = (t, t.numpy())
        rec.host_arrays.append((name, hit[1].copy(), t.data_ptr()))

    def stamp_ring(self, stream: str, cuda_stream: Any = None) -> StampRing:
        """The stamp ring of a CUDA stream (on the CPU: of the stream name), made on first use."""
        key = cuda_stream.cuda_stream if cuda_stream is not None else stream
        ring = self._stamps.get(key)
        if ring is None:
            ring = self._stamps[key] = StampRing(self.device, cuda_stream)
            ring.on_lap = lambda below, r=ring: self._read_out_stamps(r, below)
        return ring

    def span(self, rec: Steps, stream: str, name: str, cuda_stream: torch.cuda.Stream | None = None) -> Span:
        """Time a region for one step or a list of steps (a context manager): with device stamps on `cuda_stream` on
        a GPU (stamps on the CPU are host times), with the host clock for a host region (`cuda_stream` None on a
        GPU). A body that raises leaves no span (after a sticky CUDA error nothing may be launched any more). Span
        names are documented in docs/trace-format.md ("producers", "metadata", "forward")."""
        host = self.is_cuda and cuda_stream is None
        return Span(records_of(rec), stream, name, None if host else self.stamp_ring(stream, cuda_stream))

    def graph_span(self, rec: StepRecord, stream: str, name: str, ring: StampRing) -> None:
        """A span a graph replay just launched stamped itself (its first and last node, on `ring`'s stream): the
        host only numbers the two stamps."""
        a = ring.claim(2)
        rec.spans.append(_PendingSpan(stream, name, (ring, a), (ring, a + 1)))

    def _read_out_stamps(self, ring: StampRing, below: int) -> None:
        """A drain is about to overwrite the host slots of `ring`'s stamps numbered below `below`: a step still
        holding one (held back behind an unfinished earlier step) takes its value out first."""
        for rec in (*self._pending, *self._open):
            for sp in rec.spans:
                for attr in ("start", "end"):
                    t = getattr(sp, attr)
                    if type(t) is tuple and t[0] is ring and t[1] < below:
                        ring.wait(t[1])
                        setattr(sp, attr, self.clock.ns(ring.value(t[1])))

    def wait(self, rec: Steps, stream: str, on_stream: str, on_span: str) -> None:
        """Record a wait edge the engine has just enqueued: `stream` waits for span `on_span` of `on_stream`."""
        edge = (stream, on_stream, on_span)  # StreamWait's fields (the writer makes the StreamWait)
        for r in records_of(rec):
            r.waits.append(edge)

    def error(self, rec: Steps, call: str, exc: BaseException, fatal: bool = False) -> None:
        """Record that `call` raised for this step (type and message verbatim)."""
        recs = records_of(rec)
        for r in recs:
            r.errors.append(CallError(call, type(exc).__name__, str(exc), fatal))
        self._errors.note(recs, exc)
        if fatal:
            self._failed = exc  # the device is gone: from now on nothing is enqueued, synchronized or queried

    def fired(self, rec: Steps, faults: Sequence[str]) -> None:
        """Fault accounting: these injected faults changed this step (never an input to detection)."""
        if not faults:
            return
        for r in records_of(rec):
            for f in faults:
                if f not in r.faults_fired:
                    r.faults_fired.append(f)

    def end_step(self, rec: StepRecord, requests: RequestColumns | Callable[[], RequestColumns] | None = None, *,
                 finish: Callable[[StepRecord], None] | None = None, after: Sequence[StepRecord] = ()) -> None:
        """Close the step (with its request rows, or the function that makes them when it is resolved); it is written
        once its device work completes. Only what must happen now happens here (its
        end time, its number, the event after its host copies); queueing it waits for the next poll, off the launch
        path (an engine ends steps right after its read-back, where the GPU waits for the next launch). `finish`
        and `after`: see `Probe.end_step` (an end time set before is kept: an adapter's step ends at its call)."""
        rec.end_ns = rec.end_ns or time.perf_counter_ns()
        if requests is not None:
            rec.requests = requests
        if finish is not None:
            rec.finish = finish
        if after:
            rec.after.extend(after)
        self._ended += 1
        self.assign_index(rec)
        if self.is_cuda and self._failed is None and (rec.floats or any(p.slot is not None for p in rec.packs)):
            ev = self._event()  # the host copies of this step's values land with it
            ev.record(torch.cuda.current_stream(self.device))
            rec.done_event = ev
        self._ending.append(rec)
        # No poll here: resolving costs host time while launches are still being issued; the engine polls just
        # before it waits on the GPU (and a live viewer's pause flushes).

    def _settle(self) -> None:
        """Queue the steps ended since the last call, in index order (a step numbered at launch may end after a
        later-numbered one)."""
        for rec in self._ending:
            try:
                self._open.remove(rec)
            except ValueError:
                pass  # ended before (a failure path ends its step early)
            i = len(self._pending)
            while i and self._pending[i - 1].index > rec.index:
                i -= 1
            self._pending.insert(i, rec)
        self._ending.clear()

    def _drain_ring(self, force: bool) -> None:
        ring = self.ring
        if ring is None or ring.count == ring.drained or self._failed is not None:
            return
        if not force and ring.count - ring.drained < ring.drain_every:
            return
        # This drain overwrites the host rows of replays `rows` older; a step still holding one (held back behind
        # an unfinished earlier step) takes its values out first.
        oldest = ring.count - ring.rows
        for rec in (*self._pending, *self._open):
            for p in rec.packs:
                if p.seq is not None and p.seq < oldest:
                    ring.wait(p.seq)
                    p.host, p.seq = torch.from_numpy(ring.row(p.seq, p.length)), None
        ring.drain()
        self.compute_stamps.drain()  # the replays' stamps, in the same pass (same stream)

    def poll(self, force_send: bool = False, limit: int | None = RESOLVE_PER_POLL) -> None:
        """Make the deferred records, then (every `RESOLVE_BATCH` ended steps, when the oldest pending step is 20 ms
        old, or when `force_send`) write pending steps whose device work has completed (in order; never blocks), at
        most `limit` of them (None: all), so a backlog is worked off a little at a time. Resolved steps go to the
        writer as one message per pass."""
        if self._failed is not None:
            return
        self._settle()
        if self._later:
            self.run_later()  # every poll: what the records read is rewritten when the next iteration prepares
        quiet = bool(self._pending) and time.perf_counter_ns() - self._pending[0].end_ns > QUIET_NS
        if not (force_send or quiet or self._ended - self._ended_at_pass >= RESOLVE_BATCH):
            return
        self._ended_at_pass = self._ended
        self._drain_all()  # what is pending lands for this pass or the next (a quiet run's last steps too)
        self._write_ready(limit)
        self._send()

    def _drain_all(self) -> None:
        """Enqueue the copies of every ring's undrained values."""
        self._drain_ring(force=True)
        for ring in self._stamps.values():
            ring.drain()

    def _write_ready(self, limit: int | None = None) -> bool:
        """Resolve pending steps in order while they are complete (at most `limit`); False when one is not. The
        callers (`poll`, `_drain_oldest`) have queued the steps ended before it."""
        if self._later:
            self.run_later()  # a step is resolved only with its whole record (every poll, flush and close comes here)
        n = 0
        done: dict[int, int] = {}  # stamps completed per ring, asked once per pass
        while self._pending and (limit is None or n < limit):
            n += 1
            rec = self._pending[0]
            if any(o.index >= 0 and o.index < rec.index for o in self._open):
                return False  # an earlier-numbered step is still being built
            if not self._complete(rec, done):
                return False
            self._pending.popleft()
            self._outbox.append(self._resolver.resolve(rec))
        return True

    def _send(self) -> None:
        """Hand the pass's resolved steps to the writer as one message."""
        if not self._outbox:
            return
        out, self._outbox = self._outbox, []
        if len(out) == 1:
            self.writer.write_raw_step(out[0])
        else:
            self.writer.write_raw_steps(out)

    def flush_pending(self) -> None:
        """Drain the ring, wait for the device and write every finished step now (a pause of the live viewer)."""
        if self._failed is None:
            self._drain_all()
            if self.is_cuda:
                torch.cuda.synchronize(self.device)
        self.poll(force_send=True, limit=None)

    def flush(self) -> None:
        """`flush_pending`, then wait until the writer has committed it: a reader of the trace (a live viewer that
        hears of a pause) sees every ended step."""
        self.flush_pending()
        self.writer.flush()

    def _complete(self, rec: StepRecord, done: dict[int, int]) -> bool:
        if rec.done_event is not None and not rec.done_event.query():  # type: ignore[no-untyped-call]
            return False
        if (rec.copy_events or rec.after) and not all(e.query() for r in (rec, *rec.after) for e in r.copy_events):
            return False
        if self.ring is not None and rec.packs:
            rows = done.get(id(self.ring))  # asked once per pass, like the stamp rings below
            if rows is None:
                rows = done[id(self.ring)] = self.ring.completed()
            if any(p.seq is not None and p.seq >= rows for p in rec.packs):
                return False
        for sp in rec.spans:
            for t in (sp.start, sp.end):
                if type(t) is tuple:
                    ring, seq = t
                    got = done.get(id(ring))
                    if got is None:
                        got = done[id(ring)] = ring.completed()
                    if seq >= got:
                        if seq >= ring.drained and (ring.count - ring.drained >= DRAIN_STAMPS
                                                    or ring is self.compute_stamps and self.ring is None):
                            ring.drain()  # enough have gathered (or no snapshot-ring drain will take them)
                        return False
        return True

    def _event(self) -> Any:
        # Events are reused once their step is written: creating one costs more than recording it.
        return self._free_events.pop() if self._free_events else torch.cuda.Event()  # type: ignore[no-untyped-call]

    def _drain_oldest(self) -> None:
        """The pinned ring is full: wait for the oldest pending step and write it (and what is ready after it)."""
        self._settle()  # its slots may belong to a step ended since the last poll
        rec = self._pending[0]
        if rec.done_event is not None:
            rec.done_event.synchronize()
        self._write_ready()

    def write_request(self, rec: RequestRecord) -> None:
        """A finished request's whole record."""
        self.writer.write_request(rec)

    def close(self, ended_by: BaseException | None = None, *, stopped: bool = False) -> None:
        """Wait for the device, write everything pending, record how the run ended, and close the trace.

        `ended_by` is the exception that ended the run (default: the one being handled, if any; none: the run
        finished); `stopped`: it is a stop the run's controller asked for (a live viewer's), a clean end of a run
        cut short. The end record (`meta.end_state`) says which, and counts the steps begun that never reach the
        trace (`lost_in_flight`).

        After a sticky CUDA error (the run is failing with it, or synchronizing raises it) nothing touches the
        device again: every pending and unfinished step is written from its host-side record, the step the
        error hit carries it as a fatal CallError, and the trace is closed; the caller's exception goes on."""
        failing = sys.exc_info()[1]
        if ended_by is None:
            ended_by = failing
        if failing is not None and is_sticky_cuda_error(failing):
            self._failed = failing
        elif ended_by is not None and is_sticky_cuda_error(ended_by):
            self._failed = ended_by
        if self.is_cuda and self._failed is None:
            try:
                self._drain_all()
                torch.cuda.synchronize(self.device)
                self.poll(force_send=True, limit=None)
                self._write_clock_end()
            except Exception as e:  # noqa: BLE001 - only sticky CUDA errors are absorbed here
                if not is_sticky_cuda_error(e):
                    raise
                self._failed = e
        elif self._failed is None:
            self._drain_all()
            self.poll(force_send=True, limit=None)
            self._write_clock_end()
        if self._failed is not None:
            self.run_later()  # poll resolves nothing after a failure; host reads only (the ring is not drained again)
            lost = self._write_after_failure(self._failed)
            if ended_by is None or not is_sticky_cuda_error(ended_by):
                ended_by = self._failed  # the device failed first; what the run ended on followed from it
        else:
            self._settle()
            lost = len(self._open) + len(self._pending)  # begun, never ended or held behind one: never written
        state, detail = end_of(ended_by, stopped)
        set_end = getattr(self.writer, "set_end", None)  # None: a writer that keeps no end record (a stand-in)
        try:
            if set_end is not None:
                error_step = self._errors.step_of(ended_by, self._failed)
                set_end(state, lost_in_flight=lost, detail=detail, error_step=error_step)
        except TraceError:
            pass  # the writer is gone: close() says why (and still stops its processes)
        self.writer.close()

    def _write_clock_end(self) -> None:
        # The offset measured again where the run synchronizes anyway: how far the stamp clock drifted against the
        # host's over the run (nothing corrects it; `specscope info` shows it for a GPU run).
        self.writer.write_meta(CLOCK_END, clock_fact(*bracket_offset(self.compute_stamps, 3)))

    def _write_after_failure(self, err: BaseException) -> int:
        """Write every step still held from host-side data only: the pending ones and those launched but not
        finished (a step begun but never launched ran nothing and is left out); returns how many were left out."""
        self._settle()
        launched = [r for r in self._open if r.index >= 0]
        left_out = len(self._open) - len(launched)
        recs = sorted(list(self._pending) + launched, key=lambda r: r.index)
        # Device objects must never be destroyed now: their destructors query the dead context and print C++
        # warnings (or abort). The process is ending; keep them referenced until it does.
        keep_until_exit(self._free_events, self._ring, self._stamps, recs, self.ring)
        for raw in self._outbox:  # resolved before the failure: complete, and first in index order
            self.writer.write_raw_step(raw)
        self._outbox = []
        self._pending.clear()
        self._open.clear()
        self._errors.mark_hit(recs, launched, err)
        for r in recs:
            host_side_only(r, self.is_cuda)
            self.writer.write_raw_step(self._resolver.resolve(r))
        return left_out
