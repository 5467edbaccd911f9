"""A completed step record turned into the compact form the writer stores (`Recorder.poll` resolves steps through
it, on the engine's thread: kept cheap, unpacking and encoding happen in the writer), and a step's recorded values
read back for an adapter's `finish`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .probe import StepRecord, _PendingPack

if TYPE_CHECKING:
    from .pinned_ring import PinnedRing
    from .probe import Layout, LayoutEntry
    from .ring_pack import SnapshotRing
    from .stamps import StampClock

NP_DTYPES: dict[torch.dtype | str, str] = {
    torch.int32: "int32", torch.int64: "int64", torch.int16: "int16", torch.uint8: "uint8", torch.bool: "bool",
    torch.float32: "float32"}
_LAYOUTS_KEPT = 4096  # distinct snapshot layouts interned (a graph replay's repeats; eager steps vary)


class StepResolver:
    """Reads a step's values where they landed and builds its compact record; interns layouts (one shared tuple per
    distinct layout: a batch carries a graph's layout once, not once per replay)."""

    def __init__(self, clock: StampClock, pinned: PinnedRing | None, free_events: list[Any]) -> None:
        self.clock = clock
        self.pinned = pinned
        self.ring: SnapshotRing | None = None  # the device snapshot ring, once the recorder opened it
        self.free_events = free_events  # the recorder's: a resolved step's event is reused
        self._layouts: dict[tuple[LayoutEntry, ...], tuple[LayoutEntry, ...]] = {}
        self._np_names: dict[Any, str] = {}

    def intern_layout(self, layout: Layout) -> tuple[LayoutEntry, ...]:
        """`layout` (name, torch dtype, shape, data_ptr per tensor) with numpy dtype names, as the one shared tuple
        of its value; a caller that keeps it hands the same object with every step, which is returned as it is."""
        if type(layout) is tuple:
            return layout  # interned already
        key = tuple((n, NP_DTYPES.get(d, d), sh, ptr) for n, d, sh, ptr in layout)
        kept = self._layouts.get(key)
        if kept is None:
            if len(self._layouts) >= _LAYOUTS_KEPT:
                self._layouts.clear()
            kept = self._layouts[key] = key
        return kept

    def values(self, rec: StepRecord) -> dict[str, np.ndarray]:
        """The step's recorded tensors by name, whole and uncropped (hidden ones included, dropped ones not; a later
        snapshot of a name wins). Valid once the step's copies landed: inside its `finish`, or a step it waits on."""
        out: dict[str, np.ndarray] = {}
        for p in rec.packs:
            if p.dropped:
                continue
            flat = self.pack_values(p)
            off = 0
            for name, dtype, shape, _ in p.layout:
                n = int(np.prod(shape)) if shape else 1
                np_dtype = dtype if isinstance(dtype, str) else NP_DTYPES[dtype]
                out[name] = flat[off:off + n].astype(np_dtype).reshape(shape)
                off += n
        return out

    def pack_values(self, p: _PendingPack) -> np.ndarray:
        """A pack's int64 values, from wherever they landed (a snapshot-ring row, a pinned slot, a host copy)."""
        if p.seq is not None:
            assert self.ring is not None, "a replay's row is in the snapshot ring"
            return self.ring.row(p.seq, p.length)
        if p.slot is not None:
            assert self.pinned is not None, "pinned-ring slots come from the pinned ring"
            values: np.ndarray = self.pinned.np[p.slot[0]:p.slot[1]].copy()
            return values
        assert p.host is not None, "a pack without a ring row or a pinned slot holds its host copy"
        host: np.ndarray = p.host.numpy().copy()
        return host

    def resolve(self, rec: StepRecord) -> dict[str, Any]:
        """The step in the compact form the writer process turns into a schema Step (`step_from_raw`).

        Kept cheap on purpose: this runs on the engine's thread; unpacking and encoding happen in the writer."""
        if rec.finish is not None:
            rec.finish(rec)  # an adapter's request rows and crops, from the values that have landed now
        off = self.clock.offset_ns
        spans = [(s.stream, s.name,
                  s.start[0].value(s.start[1]) + off if type(s.start) is tuple else s.start,
                  s.end[0].value(s.end[1]) + off if type(s.end) is tuple else s.end) for s in rec.spans]
        packs = [(self.pack_values(p), self.intern_layout(p.layout), p.crop_cols) for p in rec.packs if not p.hidden]
        floats = [(name, "float32" if t.is_floating_point() else NP_DTYPES[t.dtype], tuple(t.shape), 0,
                   t.float().numpy() if t.is_floating_point() else t.numpy()) for name, t in rec.floats]
        floats += [(name, self._np_name(v.dtype), v.shape, ptr, v) for name, v, ptr in rec.host_arrays]
        for p in rec.packs:
            if p.slot is not None:
                assert self.pinned is not None, "pinned-ring slots come from the pinned ring"
                self.pinned.release(p.slot)
        if rec.done_event is not None:
            self.free_events.append(rec.done_event)
        if rec.after:
            rec.after = []  # a verify's draft extend: not held past this step's resolve
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
