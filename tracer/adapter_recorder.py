"""The recorder for a backend the tracer adapts onto rather than runs (an SGLang server's `TRTLLMHAAttnBackend`):
its steps are known only once the call they time has returned, its tensors live where the server put them, and its
request rows follow from the recorded values (`Probe.end_step(finish=...)` reads them back through `values`).
Everything else, copies, readiness, ordering, resolving and writing, is the engine's `Recorder`'s."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .probe import StepRecord, _PendingPack, _PendingSpan
from .recorder import Recorder
from .stamps import StampRing


class AdapterRecorder(Recorder):
    """`Recorder` plus what an adapter needs (`probe.AdapterProbe`): snapshots of named tensors packed per device,
    snapshots replaced later, values read back, and spans between marks made before the step was begun."""

    def values(self, rec: StepRecord) -> dict[str, np.ndarray]:
        """The step's recorded tensors by name, whole and uncropped (hidden ones included, dropped ones not).
        Valid once the step's copies landed: inside its `finish`, or for a step it waits on (`after`)."""
        return self._resolver.values(rec)

    def snapshot_tensors(self, rec: StepRecord, tensors: Sequence[tuple[str, torch.Tensor, str, int]],
                         crop_cols: dict[str, int], hidden: bool = False) -> list[_PendingPack]:
        """Record integer tensors as they are now, one int64 pack per device (one copy each, no sync): the adapter's
        way (an SGLang backend's tensors live where SGLang put them). Returns the packs (see `drop_snapshot`)."""
        groups: dict[Any, list[tuple[str, torch.Tensor, str, int]]] = {}
        for entry in tensors:
            groups.setdefault(entry[1].device, []).append(entry)
        out = []
        for dev, group in groups.items():
            packed = torch.cat([t.reshape(-1).to(torch.int64) for _, t, _, _ in group])
            layout = [(name, dtype, tuple(t.shape), ptr) for name, t, dtype, ptr in group]
            self.snapshot_pack(rec, packed, layout, crop_cols)
            pack = rec.packs[-1]
            pack.hidden = hidden
            out.append(pack)
            if dev.type == "cuda" and self.is_cuda:
                # The step may be ended on another stream than the one that copies.
                ev = torch.cuda.Event()  # type: ignore[no-untyped-call]
                ev.record(torch.cuda.current_stream(dev))
                rec.copy_events.append(ev)
        return out

    def drop_snapshot(self, rec: StepRecord, packs: Sequence[_PendingPack]) -> None:
        """Packs a later snapshot replaces: not written, not read (their pinned slots are freed when the step is)."""
        for p in packs:
            p.hidden = p.dropped = True

    def mark(self, cuda_stream: Any = None) -> int | tuple[StampRing, int]:
        """A time stamp now: a device stamp on `cuda_stream` on a GPU, else the host clock."""
        if self.is_cuda and cuda_stream is not None:
            ring = self.stamp_ring(str(cuda_stream), cuda_stream)
            return ring, ring.stamp()
        return time.perf_counter_ns()

    def add_span(self, rec: StepRecord, stream: str, name: str, start: int | tuple[StampRing, int],
                 end: int | tuple[StampRing, int]) -> None:
        """A span between two `mark`s (a region timed before its step's record was begun)."""
        rec.spans.append(_PendingSpan(stream, name, start, end))
