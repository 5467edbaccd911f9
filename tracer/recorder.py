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

import json
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from .errors import TraceError
from .probe import StepRecord as StepRecord
from .probe import _PendingPack, _PendingSpan
from .probe import is_sticky_cuda_error as is_sticky_cuda_error
from .process_writer import ProcessTraceWriter
from .ring_pack import SnapshotRing as SnapshotRing
from .schema import CallError, ForwardMode, GraphPhase, RequestRecord
from .stamps import StampClock, StampRing, bracket_offset

if TYPE_CHECKING:
    from .probe import Layout, LayoutEntry, RequestColumns, Steps

_NP_DTYPES: dict[torch.dtype | str, str] = {
    torch.int32: "int32", torch.int64: "int64", torch.int16: "int16", torch.uint8: "uint8", torch.bool: "bool",
    torch.float32: "float32"}
_LAYOUTS_KEPT = 4096  # distinct snapshot layouts interned (a graph replay's repeats; eager steps vary)


_DEAD_CONTEXT_OBJECTS: list[Any] = []
RING_BYTES = 64 << 20  # device (and pinned host) memory of the snapshot ring
RESOLVE_PER_POLL = 32  # steps resolved per hot-path poll (an iteration makes 3-7)
# Steps ended between two resolving polls: resolving, encoding and sending a batch in one pass runs on caches the
# previous step of the pass warmed, where one record per iteration, between the engine's own work, runs on caches
# that work left cold and costs several times as much.
RESOLVE_BATCH = 16
QUIET_NS = 20_000_000  # a step pending this long is resolved at the next poll, due or not (a quiet or slow run)
DRAIN_STAMPS = 16  # undrained stamps of a stream before a poll drains them for the step waiting on them
LATER_MAX = 32  # deferred calls (`Recorder.later`) held before they run anyway


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


class _Span:
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


def _recs(rec: Steps) -> list[StepRecord]:
    if type(rec) is StepRecord:  # the common case first: every step-level hook comes through here
        return [rec]
    if rec is None:
        return []
    if isinstance(rec, StepRecord):
        return [rec]
    return [r for r in rec if r is not None]  # a list or tuple of steps


class Recorder:
    """Builds steps and writes them to a `TraceWriter` once their device work has completed."""

    enabled = True

    def __init__(self, writer: ProcessTraceWriter, device: torch.device, ring_int64: int = 8 << 20) -> None:
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
        # The steps the latest recorded errors went on, by (type name, message): the end record names the step
        # carrying the one that ended the run (a run that ends on an error records it last). By value, not the
        # exception itself: holding one would hold its traceback's frames and their tensors.
        self._errors_on: dict[tuple[str, str], list[StepRecord]] = {}
        self._hit: StepRecord | None = None  # the step close() marked with a sticky error
        self.ring: SnapshotRing | None = None  # opened by the engine before it captures graphs
        self._outbox: list[dict[str, Any]] = []  # resolved steps, sent to the writer in batches
        self._later: list[tuple[Callable[..., None], tuple[object, ...]]] = []  # see `later`
        # One shared tuple per distinct layout: a batch pickles a graph's layout once, not once per replay.
        self._layouts: dict[tuple[LayoutEntry, ...], tuple[LayoutEntry, ...]] = {}
        self._np_names: dict[Any, str] = {}
        self._ended = self._ended_at_pass = 0  # steps ended, and their number at the last resolving poll
        if self.is_cuda and hasattr(writer, "send_in_background"):
            # Tiny models make steps faster than the writer child stores them: the engine must not wait on the pipe.
            writer.send_in_background()
        # One stamp ring per stream; the compute stream's is the one captured graphs stamp (`compute_stamps`).
        self._stamps: dict[Any, StampRing] = {}
        self._np_views: dict[int, tuple[torch.Tensor, np.ndarray]] = {}  # see snapshot_host
        self.compute_stamps = self.stamp_ring("compute", torch.cuda.current_stream(device) if self.is_cuda else None)
        self.clock = StampClock(self.compute_stamps)  # device stamps -> host ns, measured once
        clock = self.clock
        self.writer.write_meta(CLOCK_START, clock_fact(clock.bracket_ns, clock.at_ns, clock.offset_ns))

    def open_ring(self, width: int, budget_bytes: int | None = None) -> SnapshotRing:
        """The device rows captured graphs write their snapshots into (`width` int64 per row, the largest pack a
        graph makes); rows are sized to `budget_bytes` of device and of pinned host memory each."""
        rows = max(16, min(512, (budget_bytes or RING_BYTES) // (8 * max(width, 1))))
        self.ring = SnapshotRing(self.device, width, rows)
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
        """`layout` (name, torch dtype, shape, data_ptr per tensor) with numpy dtype names, as the one shared tuple
        of its value; a caller that keeps it hands the same object with every step, which is returned as it is."""
        if type(layout) is tuple:
            return layout  # interned already
        key = tuple((n, _NP_DTYPES.get(d, d), sh, ptr) for n, d, sh, ptr in layout)
        kept = self._layouts.get(key)
        if kept is None:
            if len(self._layouts) >= _LAYOUTS_KEPT:
                self._layouts.clear()
            kept = self._layouts[key] = key
        return kept

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

    def span(self, rec: Steps, stream: str, name: str, cuda_stream: torch.cuda.Stream | None = None) -> _Span:
        """Time a region for one step or a list of steps (a context manager): with device stamps on `cuda_stream` on
        a GPU (stamps on the CPU are host times), with the host clock for a host region (`cuda_stream` None on a
        GPU). A body that raises leaves no span (after a sticky CUDA error nothing may be launched any more). Span
        names are documented in docs/trace-format.md ("producers", "metadata", "forward")."""
        host = self.is_cuda and cuda_stream is None
        return _Span(_recs(rec), stream, name, None if host else self.stamp_ring(stream, cuda_stream))

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
        for r in _recs(rec):
            r.waits.append(edge)

    def error(self, rec: Steps, call: str, exc: BaseException, fatal: bool = False) -> None:
        """Record that `call` raised for this step (type and message verbatim)."""
        recs = _recs(rec)
        for r in recs:
            r.errors.append(CallError(call, type(exc).__name__, str(exc), fatal))
        key = (type(exc).__name__, str(exc))
        self._errors_on.pop(key, None)
        if len(self._errors_on) >= 8:
            self._errors_on.pop(next(iter(self._errors_on)))
        self._errors_on[key] = recs
        if fatal:
            self._failed = exc  # the device is gone: from now on nothing is enqueued, synchronized or queried

    def fired(self, rec: Steps, faults: Sequence[str]) -> None:
        """Fault accounting: these injected faults changed this step (never an input to detection)."""
        if not faults:
            return
        for r in _recs(rec):
            for f in faults:
                if f not in r.faults_fired:
                    r.faults_fired.append(f)

    def end_step(self, rec: StepRecord, requests: RequestColumns | Callable[[], RequestColumns] | None = None) -> None:
        """Close the step (with its request rows, or the function that makes them when it is resolved); it is written
        once its device work completes. Only what must happen now happens here (its
        end time, its number, the event after its host copies); queueing it waits for the next poll, off the launch
        path (an engine ends steps right after its read-back, where the GPU waits for the next launch)."""
        rec.end_ns = time.perf_counter_ns()
        if requests is not None:
            rec.requests = requests
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
            self._outbox.append(self._resolve(rec))
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
        if rec.done_event is not None and not rec.done_event.query():
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
        return self._free_events.pop() if self._free_events else torch.cuda.Event()

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
                set_end(state, lost_in_flight=lost, detail=detail, error_step=self._error_step(ended_by))
        except TraceError:
            pass  # the writer is gone: close() says why (and still stops its processes)
        self.writer.close()

    def _error_step(self, exc: BaseException | None) -> int | None:
        """The index of the step that carries `exc` (or an exception it was raised from) as a CallError, if any."""
        if self._hit is not None and self._failed is not None and exc is self._failed:
            return self._hit.index
        seen: set[int] = set()
        while exc is not None and id(exc) not in seen:
            seen.add(id(exc))
            indexes = [r.index for r in self._errors_on.get((type(exc).__name__, str(exc)), ()) if r.index >= 0]
            if indexes:
                return max(indexes)
            exc = exc.__cause__ or exc.__context__
        return None

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
        if recs and not any(e.fatal for r in recs for e in r.errors):
            # The error surfaces at the first host sync after the faulting launch: the step launched last and
            # not finished (or else the last one issued) is where it hit.
            hit = max(launched, key=lambda r: r.index) if launched else recs[-1]
            hit.errors.append(CallError("cuda", type(err).__name__, str(err), True))
            self._hit = hit
        for r in recs:
            r.end_ns = r.end_ns or time.perf_counter_ns()
            if self.is_cuda:
                keep_until_exit(r.spans, r.packs, r.floats, r.done_event)
                r.packs, r.floats, r.done_event = [], [], None  # device copies may never have landed
                r.spans = [s for s in r.spans if type(s.start) is int and type(s.end) is int]  # device stamps lost
            self.writer.write_raw_step(self._resolve(r))
        return left_out

    def _resolve(self, rec: StepRecord) -> dict[str, Any]:
        """The step in the compact form the writer process turns into a schema Step (`step_from_raw`).

        Kept cheap on purpose: this runs on the engine's thread; unpacking and encoding happen in the writer."""
        off = self.clock.offset_ns
        spans = [(s.stream, s.name,
                  s.start[0].value(s.start[1]) + off if type(s.start) is tuple else s.start,
                  s.end[0].value(s.end[1]) + off if type(s.end) is tuple else s.end) for s in rec.spans]
        packs = []
        for p in rec.packs:
            values: np.ndarray
            if p.seq is not None:
                assert self.ring is not None, "a replay's row is in the snapshot ring"
                values = self.ring.row(p.seq, p.length)
            elif p.slot is not None:
                assert self._ring is not None, "pinned-ring slots come from the pinned ring"
                values = self._ring.np[p.slot[0]:p.slot[1]].copy()
            else:
                assert p.host is not None, "a pack without a ring row or a pinned slot holds its host copy"
                values = p.host.numpy().copy()
            packs.append((values, self.intern_layout(p.layout), p.crop_cols))
        floats = [(name, "float32" if t.is_floating_point() else _NP_DTYPES[t.dtype], tuple(t.shape), 0,
                   t.float().numpy() if t.is_floating_point() else t.numpy()) for name, t in rec.floats]
        floats += [(name, self._np_name(v.dtype), v.shape, ptr, v) for name, v, ptr in rec.host_arrays]
        for p in rec.packs:
            if p.slot is not None:
                assert self._ring is not None, "pinned-ring slots come from the pinned ring"
                self._ring.release(p.slot)
        if rec.done_event is not None:
            self._free_events.append(rec.done_event)
        header = dict(index=rec.index, iteration=rec.iteration, mode=rec.mode.value, model=rec.model,
                      step_id=rec.step_id, batch_size=rec.batch_size, padded_batch_size=rec.padded_batch_size,
                      graph=rec.graph.value, tokens_per_request=rec.tokens_per_request,
                      num_draft_tokens=rec.num_draft_tokens, page_size=rec.page_size, start_ns=rec.start_ns,
                      end_ns=rec.end_ns, scalars=rec.scalars)
        requests = rec.requests() if callable(rec.requests) else rec.requests
        return dict(header=header, requests=requests, arrays=floats, packs=packs, spans=spans, violations=[],
                    waits=rec.waits,
                    errors=[e.to_dict() for e in rec.errors], faults_fired=list(rec.faults_fired))

    def _np_name(self, dtype: Any) -> str:
        name = self._np_names.get(dtype)
        if name is None:
            name = self._np_names[dtype] = str(dtype)
        return name


class PinnedRing:
    """Pinned host memory for snapshots, handed out in order and reused once their steps are written."""

    def __init__(self, num_int64: int) -> None:
        self.buf = torch.empty(num_int64, dtype=torch.int64, pin_memory=True)
        self.np = self.buf.numpy()
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
