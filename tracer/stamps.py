"""Timestamps the GPU writes itself: one clock for every span the recorder times on a device.

A stamp is a one-thread kernel that reads the GPU's `%globaltimer` (ns, 32 ns steps on an H200) and stores it in a
device ring at the slot a device-resident index names, then advances the index. Captured inside a CUDA graph it
costs a replay's host nothing (and ~1 µs of GPU time); launched eagerly it costs one driver call, ~5 µs of host time
on the H200 (a CUDA event record costs ~2 µs, triton's Python launcher ~19 µs). Each CUDA stream has its own ring, so
the stamps of a ring run in the order the host launched them on that stream and the host numbers them by counting
(`claim`). A ring's new slots are copied to pinned memory now and then (`drain`, on the ring's stream, so a slot is
never overwritten before it is copied); a stamp's value is read once the drain covering it has landed.

Why one clock: the stream checks (I21, I22) compare a plan-stream span with a compute-stream span at µs gaps, so
every device span, eager or captured, is stamped by this kernel and carries an absolute time. CUDA events give only
differences between events; measured on the H200 they run at `%globaltimer`'s rate (scripts/event_clock.py: a slope
of -0.015 ppm, pairs agreeing within ~0.1 µs), so an event could be re-anchored on a stamp taken beside it, but from
the host alone the two clocks' offset brackets only to ~20 µs. One mechanism serves graph replays and eager steps.

The kernel is PTX loaded through the CUDA driver (no compiler needed; the driver JIT-compiles it in ms). On the CPU
a ring is host memory and a stamp is `time.perf_counter_ns()`, written by the same claim / drain logic, so CI runs
the bookkeeping the GPU runs.
"""

from __future__ import annotations

import ctypes
import functools
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

_PTX = rb"""
.version 7.0
.target sm_75
.address_size 64
.visible .entry specscope_stamp(.param .u64 ring, .param .u64 index, .param .u64 slots)
{
    .reg .b64 %r<10>;
    ld.param.u64 %r1, [ring];
    ld.param.u64 %r2, [index];
    ld.param.u64 %r3, [slots];
    cvta.to.global.u64 %r1, %r1;
    cvta.to.global.u64 %r2, %r2;
    ld.volatile.global.u64 %r4, [%r2];
    mov.u64 %r5, %globaltimer;
    rem.u64 %r6, %r4, %r3;
    shl.b64 %r6, %r6, 3;
    add.u64 %r7, %r1, %r6;
    st.global.u64 [%r7], %r5;
    add.u64 %r4, %r4, 1;
    st.volatile.global.u64 [%r2], %r4;
    ret;
}
"""

SLOTS = 8192  # stamps per ring; a drain is forced before half of them are undrained


class _Driver:
    """The CUDA driver calls a stamp needs (libcuda through ctypes), loaded once per process."""

    def __init__(self) -> None:
        lib = ctypes.CDLL("libcuda.so.1")
        self.lib = lib
        # No argtypes: every argument is passed as a ready-made ctypes object (no per-call conversion). The launch
        # goes through PyDLL, which keeps the GIL: a CDLL call releases and retakes it, and a thread waiting for it
        # (the trace sender) would run in between, making the engine wait to get it back.
        py = ctypes.PyDLL("libcuda.so.1")
        launch = py.cuLaunchKernel
        launch.restype = ctypes.c_int
        self.launch = launch
        module, fn = ctypes.c_void_p(), ctypes.c_void_p()
        self._check(lib.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(_PTX)), "cuModuleLoadData")
        self._check(lib.cuModuleGetFunction(ctypes.byref(fn), module, b"specscope_stamp"), "cuModuleGetFunction")
        self.module, self.fn = module, fn
        # The drains' calls (DrainedRing): an async copy to pinned memory and an event after it, straight to the
        # driver. torch's copy, stream switch and Event cost tens of µs of Python per drain on the engine's thread.
        # Non-blocking calls keep the GIL (PyDLL, see the launch above).
        self.memcpy_dtoh = py.cuMemcpyDtoHAsync_v2
        self.memcpy_dtoh.argtypes = (ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p)
        self.event_record = py.cuEventRecord
        self.event_record.argtypes = (ctypes.c_void_p, ctypes.c_void_p)
        self.event_query = py.cuEventQuery
        self.event_query.argtypes = (ctypes.c_void_p,)
        self.event_sync = lib.cuEventSynchronize  # CDLL: lets the GIL go while it blocks
        self.event_sync.argtypes = (ctypes.c_void_p,)
        self._event_create = lib.cuEventCreate
        for f in (self.memcpy_dtoh, self.event_record, self.event_query, self.event_sync, self._event_create):
            f.restype = ctypes.c_int

    def new_event(self) -> int:
        """A CUDA event without timing (the driver's handle)."""
        ev = ctypes.c_void_p()
        self._check(self._event_create(ctypes.byref(ev), 2), "cuEventCreate")  # 2: CU_EVENT_DISABLE_TIMING
        return ev.value or 0

    def _check(self, rc: int, call: str) -> None:
        if rc:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(rc, ctypes.byref(name))
            # "CUDA error" as torch words it: the recorder tells a sticky error by it (is_sticky_cuda_error).
            raise RuntimeError(f"CUDA error: {(name.value or b'?').decode()} ({rc}) in {call}")


_DRIVER: _Driver | None = None


def _driver() -> _Driver:
    """The driver calls, with the stamp kernel loaded into the current device's context (one device per process:
    the engine's device is made current before its recorder starts)."""
    global _DRIVER
    if _DRIVER is None:
        try:
            _DRIVER = _Driver()
        except OSError as e:  # no libcuda.so.1 (a GPU host always has it; torch alone does not need it)
            raise RuntimeError(f"device stamps need the CUDA driver library: {e}") from e
    return _DRIVER


class DrainedRing:
    """Device rows (`dev`, first dimension `size`) numbered in launch order and copied to their `host` twin in
    batches: which numbers an enqueued copy covers (`drained`) and which have landed (`completed`). The snapshot
    ring and the stamp rings share it. On a GPU a drain is one driver copy per contiguous range (two where the ring
    wraps) plus one event record on the ring's stream (`stream_handle`); events are reused once they have
    completed."""

    _NOT_READY = 600  # CUDA_ERROR_NOT_READY

    def __init__(self, is_cuda: bool, size: int) -> None:
        self.is_cuda = is_cuda
        self.size = size
        self.count = 0  # numbers handed out (claimed)
        self.drained = 0  # numbers covered by an enqueued copy
        self._done = 0  # numbers whose rows are in `host`
        self._drains: deque[tuple[int, int]] = deque()  # (numbers covered, driver event handle, 0 on the CPU)
        self._free_events: list[int] = []
        self.stream_handle = 0  # the raw CUDA stream the rows are written and drained on (set by the subclass)
        self.dev: torch.Tensor
        self.host: torch.Tensor

    def _copy_new(self) -> None:
        """Enqueue the copy of the rows numbered [drained, count) on the ring's stream and the event that says it
        landed."""
        ev = 0
        if self.is_cuda:
            drv = _driver()
            row = self.dev.stride(0) * self.dev.element_size()
            dst, src, h = self.host.data_ptr(), self.dev.data_ptr(), self.stream_handle
            for lo, hi in row_ranges(self.drained, self.count, self.size):
                drv._check(drv.memcpy_dtoh(dst + lo * row, src + lo * row, (hi - lo) * row, h), "cuMemcpyDtoHAsync")
            ev = self._free_events.pop() if self._free_events else drv.new_event()
            drv._check(drv.event_record(ev, h), "cuEventRecord")
        else:
            for lo, hi in row_ranges(self.drained, self.count, self.size):
                self.host[lo:hi].copy_(self.dev[lo:hi])
        self._drains.append((self.count, ev))
        self.drained = self.count

    def completed(self) -> int:
        """Numbers below this have their rows in host memory."""
        drains = self._drains
        while drains:
            end, ev = drains[0]
            if ev:
                drv = _DRIVER
                assert drv is not None, "driver events are made only once the driver is loaded"
                rc = drv.event_query(ev)
                if rc == self._NOT_READY:
                    break
                if rc:
                    drv._check(rc, "cuEventQuery")
                self._free_events.append(ev)
            drains.popleft()
            self._done = end
        return self._done

    def wait(self, seq: int) -> None:
        """Block until the enqueued copy covering `seq` has landed."""
        for end, ev in self._drains:
            if end > seq:
                if ev:
                    drv = _DRIVER
                    assert drv is not None, "driver events are made only once the driver is loaded"
                    drv._check(drv.event_sync(ev), "cuEventSynchronize")
                break
        self.completed()


class StampRing(DrainedRing):
    """The stamps of one stream: `dev` int64 `[SLOTS]` written by the stamp kernel, `index` int64 `[1]` its next
    slot (device memory on a GPU), `host` the pinned copy drains fill."""

    def __init__(self, device: torch.device, stream: Any = None, slots: int = SLOTS) -> None:
        super().__init__(device.type == "cuda", slots)
        self.device = device
        self.stream = stream  # the torch.cuda.Stream it stamps (None on the CPU)
        self.slots = slots
        self.dev = torch.zeros(slots, dtype=torch.int64, device=device)
        self.index = torch.zeros(1, dtype=torch.int64, device=device)
        self.host = torch.zeros(slots, dtype=torch.int64, pin_memory=self.is_cuda)
        self._host_np = self.host.numpy()
        self._dev_np = None if self.is_cuda else self.dev.numpy()
        self._cpu_index = 0
        # Called before a drain overwrites the host slots of stamps numbered below its argument (the recorder reads
        # out the ones a held-back step still needs).
        self.on_lap: Callable[[int], None] | None = None
        if self.is_cuda:
            drv = _driver()
            self.stream_handle = stream.cuda_stream if stream is not None else 0
            self._args = (ctypes.c_uint64(self.dev.data_ptr()), ctypes.c_uint64(self.index.data_ptr()),
                          ctypes.c_uint64(slots))
            self._params = (ctypes.c_void_p * 3)(*(ctypes.addressof(a) for a in self._args))
            one, zero = ctypes.c_uint(1), ctypes.c_uint(0)
            head = (drv.fn, one, one, one, one, one, one, zero)
            self._launch = functools.partial(drv.launch, *head)  # (stream, params, extra)
            own = ctypes.c_void_p(self.stream_handle)
            self._launch_own = functools.partial(drv.launch, *head, own, self._params, None)  # on this ring's stream
            self._check = drv._check

    def launch(self, stream_handle: int | None = None) -> None:
        """Write one stamp on `stream_handle` (a raw CUDA stream; default: this ring's stream) without claiming it:
        what a graph capture records (its replays are claimed with `claim`) and what `stamp` does first."""
        if not self.is_cuda:
            i = self._cpu_index
            assert self._dev_np is not None, "a CPU ring has its numpy view"
            self._dev_np[i % self.slots] = time.perf_counter_ns()
            self._cpu_index = i + 1
            return
        if stream_handle is None:
            rc = self._launch_own()
        else:
            rc = self._launch(ctypes.c_void_p(stream_handle), self._params, None)
        if rc:
            self._check(rc, "cuLaunchKernel")

    def claim(self, n: int = 1) -> int:
        """Number `n` stamps just launched on this stream (a replay's captured ones); returns the first number."""
        seq = self.count
        self.count += n
        if self.count - self.drained >= self.slots // 2:
            self.drain()  # the device must never lap a slot whose value has not been copied
        return seq

    def stamp(self) -> int:
        """Stamp now, on this ring's stream; returns the stamp's number."""
        self.launch()
        return self.claim()

    def drain(self) -> None:
        """Enqueue the copy of every stamp claimed since the last drain (on the ring's stream; no host sync)."""
        if self.drained == self.count:
            return
        if self.on_lap is not None and self.count > self.slots:
            self.on_lap(self.count - self.slots)
        self._copy_new()

    def wait(self, seq: int) -> None:
        """Block until stamp `seq` is in host memory (draining it first if need be)."""
        if seq >= self.drained:
            self.drain()
        super().wait(seq)

    def value(self, seq: int) -> int:
        """The device time (ns) of stamp `seq`; valid once `completed() > seq` and until the slot is reused."""
        return int(self._host_np[seq % self.slots])


class StampClock:
    """Device stamps on the host clock (`time.perf_counter_ns`): one offset, measured once at a synchronized point.

    The offset is bracketed by host reads around a stamp and a synchronize; the tightest of a few tries is kept
    (tens of µs). Drift between the GPU timer and the host clock after that is not corrected: spans on the device
    are exact relative to each other, which is what the checks compare."""

    def __init__(self, ring: StampRing, tries: int = 5) -> None:
        self.offset_ns, self.bracket_ns, self.at_ns = 0, 0, time.perf_counter_ns()  # CPU stamps are host times
        if ring.is_cuda:
            self.bracket_ns, self.at_ns, self.offset_ns = bracket_offset(ring, tries)

    def ns(self, device_ns: int) -> int:
        """A device stamp on the host clock."""
        return device_ns + self.offset_ns


def bracket_offset(ring: StampRing, tries: int = 5) -> tuple[int, int, int]:
    """The host - device clock offset, bracketed by host reads around a stamp between two synchronizes: the tightest
    of `tries` as (bracket width ns, host ns at its middle, offset ns). On the CPU stamps are host times, so the
    offset is the few hundred ns a stamp takes."""
    brackets = []
    for _ in range(tries):
        if ring.is_cuda:
            torch.cuda.synchronize(ring.device)
        h0 = time.perf_counter_ns()
        seq = ring.stamp()
        if ring.is_cuda:
            torch.cuda.synchronize(ring.device)
        h1 = time.perf_counter_ns()
        ring.wait(seq)
        mid = (h0 + h1) // 2
        brackets.append((h1 - h0, mid, mid - ring.value(seq)))
    return min(brackets)


def row_ranges(a: int, b: int, slots: int) -> list[tuple[int, int]]:
    """Slot (or row) ranges [lo, hi) holding sequence numbers [a, b) of a ring of `slots` (at most two: it may
    wrap)."""
    if b - a >= slots:
        return [(0, slots)]
    lo, hi = a % slots, b % slots
    return [(lo, hi)] if lo < hi else [(lo, slots), (0, hi)] if hi else [(lo, slots)]
