"""The probe: the one typed protocol through which the engine (`backend/`) talks to recording.

The engine, its model runners and its graph runners call a `Probe` at fixed points of every forward (begin a step,
number it at launch, hand over what the kernels consumed, time spans, note waits, errors and fault firings, end it
with its request rows) and know nothing else of recording. `tracer.recorder.Recorder` is the probe that records
(packing, interning, copying, deferring and stamping live there); `NullProbe` is tracing off: every call does
nothing, so the engine runs the plain backend. Live pause / step / breakpoints are not part of the probe: they are
the engine's own step callback (`backend/engine.py`, `Engine.on_step_end`).

This module is torch-free at import (a reader of traces imports the tracer without torch); tensors and the
capture side's rings appear in annotations only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .schema import CallError, ForwardMode, GraphPhase, RequestRecord

if TYPE_CHECKING:
    from typing import TypeAlias

    import numpy as np
    import torch

    from .ring_pack import SnapshotRing
    from .stamps import StampRing

    # One entry of a snapshot layout: the tensor's name, its dtype (a torch dtype, or its numpy name once interned),
    # its full shape and its data pointer (0 where the address is not the kernel's).
    LayoutEntry: TypeAlias = tuple[str, "torch.dtype | str", tuple[int, ...], int]
    # A packed snapshot's layout: the tensors flattened into it, in order.
    Layout: TypeAlias = Sequence[LayoutEntry]
    # A step's request rows as columns (RequestState fields: int columns; draft_tokens / accepted_tokens hold a list
    # of token ids per row).
    RequestColumns: TypeAlias = dict[str, list[Any]]
    # What step-level calls take: one step, several (a span both steps of a phase share), or none (not recorded).
    Steps: TypeAlias = "StepRecord | Sequence[StepRecord | None] | None"


def is_sticky_cuda_error(e: BaseException) -> bool:
    """A CUDA error that poisons the context (illegal address, launch failure): every later call fails too (the
    probe's caller passes `fatal=` to `Probe.error` by it)."""
    return type(e).__name__ == "AcceleratorError" or (isinstance(e, RuntimeError) and "CUDA error" in str(e))


@dataclass(slots=True)
class _PendingPack:
    """A snapshot of a step, until the recorder resolves it (recorder-private)."""

    host: torch.Tensor | None  # int64 host copy of the packed snapshot (a pinned-ring slice on a GPU)
    layout: Layout  # name, dtype, full shape, data_ptr
    crop_cols: dict[str, int]
    slot: tuple[int, int] | None = None  # pinned-ring slot (GPU)
    seq: int | None = None  # a graph replay's row in the SnapshotRing (its values arrive with a drain)
    length: int = 0
    hidden: bool = False  # read by the step's `finish` only, never written (`Probe.snapshot_tensors`)
    dropped: bool = False  # replaced by a later snapshot: neither written nor read (`Probe.drop_snapshot`)


@dataclass(slots=True)
class _PendingSpan:
    """A span of a step, until its stamps are read (recorder-private)."""

    stream: str
    name: str
    start: Any  # int ns on the host clock, or (StampRing, stamp number) until the stamp's value is read
    end: Any


@dataclass(eq=False, slots=True)  # identity: the recorder finds records in its lists by object, not by value
class StepRecord:
    """A step under construction: `Probe.begin_step` makes it, the model runner adds its scalars, `Probe.end_step`
    queues it. Its other fields belong to the recorder."""

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
    # columns (see process_writer), or a function that makes them from values that no longer change (a draft
    # step's requests and lengths): called when the step is resolved, off the launch path
    requests: RequestColumns | Callable[[], RequestColumns] = field(default_factory=dict)
    packs: list[_PendingPack] = field(default_factory=list)
    floats: list[tuple[str, torch.Tensor]] = field(default_factory=list)  # sampled attention inputs/outputs
    host_arrays: list[tuple[str, np.ndarray, int]] = field(default_factory=list)  # host tensors: name, copy, ptr
    spans: list[_PendingSpan] = field(default_factory=list)
    waits: list[tuple[str, str, str]] = field(default_factory=list)  # StreamWait fields: stream, on_stream, on_span
    errors: list[CallError] = field(default_factory=list)
    faults_fired: list[str] = field(default_factory=list)
    done_event: torch.cuda.Event | None = None  # after the last async copy of this step (host-copied snapshots only)
    # An adapter's step (`snapshot_tensors`, `end_step(finish=...)`): events after its copies, the steps whose copies
    # its `finish` reads too, and the call that completes the record from the landed values when it is resolved.
    copy_events: list[Any] = field(default_factory=list)
    after: list[StepRecord] = field(default_factory=list)
    finish: Callable[[StepRecord], None] | None = None


class Probe(Protocol):
    """What the engine calls on recording. Step-level calls take the record `begin_step` returned (None: this step
    is not recorded); a list of records where one span or wait serves several steps."""

    @property
    def enabled(self) -> bool:
        """Whether steps are recorded (False: every call below does nothing)."""
        ...

    @property
    def compute_stamps(self) -> StampRing | None:
        """The compute stream's stamp ring, whose stamps captured graphs write in their first and last node."""
        ...

    @property
    def ring(self) -> SnapshotRing | None:
        """The device snapshot ring captured graphs write their packed metadata into (None until `open_ring`)."""
        ...

    def open_ring(self, width: int) -> SnapshotRing | None:
        """Open the snapshot ring before graphs are captured: rows of `width` int64, the largest pack a graph makes."""
        ...

    def begin_step(self, *, iteration: int, mode: ForwardMode, model: str, step_id: int | None, batch_size: int,
                   padded_batch_size: int, graph: GraphPhase, tokens_per_request: int, num_draft_tokens: int,
                   page_size: int) -> StepRecord | None:
        """Open a step's record (None: the step is not recorded)."""
        ...

    def assign_index(self, rec: StepRecord) -> int:
        """Number `rec` now, at its forward's launch (idempotent); returns its step index."""
        ...

    def snapshot_pack(self, rec: StepRecord, packed: torch.Tensor, layout: Layout,
                      crop_cols: dict[str, int]) -> None:
        """Record an eager step's (or a capture's) metadata: `packed` int64 `[n]` holds `layout`'s tensors flattened
        in order; `crop_cols` keeps the live columns of 2-D tables."""
        ...

    def snapshot_ring(self, rec: StepRecord, length: int, layout: Layout, crop_cols: dict[str, int],
                      seq: int | None = None) -> None:
        """Record the metadata a replay wrote into its snapshot-ring row (`length` int64 of `layout`; `seq`: the row
        `claim_row` numbered at launch)."""
        ...

    def claim_row(self) -> int:
        """Number the snapshot-ring row of the replay just launched."""
        ...

    def later(self, fn: Callable[..., None], *args: object) -> None:
        """Run `fn(*args)` before the next poll resolves a step: host bookkeeping moved off the launch path."""
        ...

    def run_later(self) -> None:
        """Run the deferred calls now (what they read is about to change)."""
        ...

    def intern_layout(self, layout: Layout) -> tuple[LayoutEntry, ...]:
        """`layout` as the one shared tuple of its value (a graph's replays hand the same object every step)."""
        ...

    def snapshot_float(self, rec: StepRecord, name: str, t: torch.Tensor) -> None:
        """Record a sampled tensor `t` (attention inputs/outputs, any shape; floats as float32) under `name`."""
        ...

    def snapshot_host(self, rec: StepRecord, name: str, t: torch.Tensor) -> None:
        """Record host tensor `t` (e.g. the int32 `[bs]` `seq_lens_cpu` mirror) as it is now."""
        ...

    def span(self, rec: Steps, stream: str, name: str,
             cuda_stream: torch.cuda.Stream | None = None) -> AbstractContextManager[None]:
        """Time a region of `stream` for the steps in `rec` (stamps on `cuda_stream` on a GPU)."""
        ...

    def graph_span(self, rec: StepRecord, stream: str, name: str, ring: StampRing) -> None:
        """A span the replay just launched stamped itself (its first and last node, on `ring`)."""
        ...

    def wait(self, rec: Steps, stream: str, on_stream: str, on_span: str) -> None:
        """A wait edge just enqueued: `stream` waits for span `on_span` of `on_stream`."""
        ...

    def error(self, rec: Steps, call: str, exc: BaseException, fatal: bool = False) -> None:
        """`call` raised `exc` for these steps (`fatal`: a sticky CUDA error, the device is gone)."""
        ...

    def fired(self, rec: Steps, faults: Sequence[str]) -> None:
        """Fault accounting: these injected faults changed these steps."""
        ...

    def end_step(self, rec: StepRecord, requests: RequestColumns | Callable[[], RequestColumns] | None = None, *,
                 finish: Callable[[StepRecord], None] | None = None, after: Sequence[StepRecord] = ()) -> None:
        """Close the step, with its request rows (or the function that makes them once they stop changing).
        `finish(rec)` completes the record from its landed `values` when it is resolved (an adapter whose request
        rows and crops follow from recorded values); `after`: steps whose copies must land first (`finish` reads
        their values too)."""
        ...

    def write_request(self, rec: RequestRecord) -> None:
        """A finished request's whole record."""
        ...

    def poll(self) -> None:
        """Resolve and send what is ready (the engine calls it just before it waits on the GPU)."""
        ...

    def flush_pending(self) -> None:
        """Wait for the device and hand every ended step to the writer now."""
        ...

    def flush(self) -> None:
        """`flush_pending`, then wait until the writer committed it: a reader of the trace sees every ended step."""
        ...

    def close(self, ended_by: BaseException | None = None, *, stopped: bool = False) -> None:
        """Write everything pending, record how the run ended, close the trace."""
        ...


class AdapterProbe(Probe, Protocol):
    """The probe an adapter records through (`tracer.adapter_recorder.AdapterRecorder`): a backend the tracer does
    not run, whose steps are known only once the call they time returned (SGLang's)."""

    def snapshot_tensors(self, rec: StepRecord, tensors: Sequence[tuple[str, torch.Tensor, str, int]],
                         crop_cols: dict[str, int], hidden: bool = False) -> list[_PendingPack]:
        """Record integer tensors as they are now (name, tensor, numpy dtype name, data_ptr to record): packed per
        device, copied without a sync. `crop_cols` (the caller may change it until the step resolves) keeps the live
        columns of 2-D tables; `hidden` snapshots feed the step's `finish` only. Returns the snapshot's packs."""
        ...

    def drop_snapshot(self, rec: StepRecord, packs: Sequence[_PendingPack]) -> None:
        """Packs `snapshot_tensors` returned that a later snapshot replaces: neither written nor read."""
        ...

    def values(self, rec: StepRecord) -> dict[str, np.ndarray]:
        """A step's recorded tensors by name, whole (uncropped), hidden ones included: for a `finish`, once landed."""
        ...

    def mark(self, cuda_stream: Any = None) -> int | tuple[StampRing, int]:
        """A time stamp now: on `cuda_stream`'s stamp ring on a GPU, else the host clock (for `add_span`)."""
        ...

    def add_span(self, rec: StepRecord, stream: str, name: str, start: int | tuple[StampRing, int],
                 end: int | tuple[StampRing, int]) -> None:
        """A span between two `mark`s, for a region timed before its step's record was begun."""
        ...


_NO_SPAN: contextlib.nullcontext[None] = contextlib.nullcontext()


class NullProbe:
    """Tracing off: every call does nothing and nothing is recorded, so the engine runs the plain backend."""

    enabled = False
    compute_stamps: StampRing | None = None
    ring: SnapshotRing | None = None

    def open_ring(self, width: int) -> SnapshotRing | None:
        """No ring: nothing is recorded."""
        return None

    def begin_step(self, *, iteration: int, mode: ForwardMode, model: str, step_id: int | None, batch_size: int,
                   padded_batch_size: int, graph: GraphPhase, tokens_per_request: int, num_draft_tokens: int,
                   page_size: int) -> StepRecord | None:
        """No record."""
        return None

    def assign_index(self, rec: StepRecord) -> int:
        """No index."""
        return -1

    def snapshot_pack(self, rec: StepRecord, packed: torch.Tensor, layout: Layout,
                      crop_cols: dict[str, int]) -> None:
        """No-op."""

    def snapshot_ring(self, rec: StepRecord, length: int, layout: Layout, crop_cols: dict[str, int],
                      seq: int | None = None) -> None:
        """No-op."""

    def claim_row(self) -> int:
        """No row."""
        return -1

    def later(self, fn: Callable[..., None], *args: object) -> None:
        """No-op (nothing is deferred: nothing is recorded)."""

    def run_later(self) -> None:
        """No-op."""

    def intern_layout(self, layout: Layout) -> tuple[LayoutEntry, ...]:
        """The layout as a tuple."""
        return tuple(layout)

    def snapshot_float(self, rec: StepRecord, name: str, t: torch.Tensor) -> None:
        """No-op."""

    def snapshot_host(self, rec: StepRecord, name: str, t: torch.Tensor) -> None:
        """No-op."""

    def span(self, rec: Steps, stream: str, name: str,
             cuda_stream: torch.cuda.Stream | None = None) -> AbstractContextManager[None]:
        """One shared do-nothing context manager: the untraced engine pays nothing per span."""
        return _NO_SPAN

    def graph_span(self, rec: StepRecord, stream: str, name: str, ring: StampRing) -> None:
        """No-op."""

    def wait(self, rec: Steps, stream: str, on_stream: str, on_span: str) -> None:
        """No-op."""

    def error(self, rec: Steps, call: str, exc: BaseException, fatal: bool = False) -> None:
        """No-op."""

    def fired(self, rec: Steps, faults: Sequence[str]) -> None:
        """No-op."""

    def end_step(self, rec: StepRecord, requests: RequestColumns | Callable[[], RequestColumns] | None = None, *,
                 finish: Callable[[StepRecord], None] | None = None, after: Sequence[StepRecord] = ()) -> None:
        """No-op."""

    def write_request(self, rec: RequestRecord) -> None:
        """No-op."""

    def poll(self) -> None:
        """No-op."""

    def flush_pending(self) -> None:
        """No-op."""

    def flush(self) -> None:
        """No-op (no trace to commit)."""

    def close(self, ended_by: BaseException | None = None, *, stopped: bool = False) -> None:
        """No-op."""
