"""The snapshot ring that graph replays write their metadata into (`SnapshotRing`), and the one kernel that writes a
replay's row on a GPU with Triton (`RingPacker`).

The torch way to record a replay's metadata inside the graph is about a dozen small nodes: a cast per int32 tensor,
the page-start gather, a cat, the row copy at the device index, and two ops advancing the index. Each node costs
the replay a few µs of GPU time, on every replay of every graph. `RingPacker` does the same in one single-block
kernel: it reads the row index, writes every part (widened to int64, in order) and the page starts of the live
requests (`req_to_token[rpi[b], c * page_size]`), then advances the index. The values and their order are those of
`torch.cat([t.reshape(-1).to(torch.int64) for t in parts] + [starts])`, which the CPU path (and any host without
Triton) still runs, and which `tests/gpu/test_ring_pack_gpu.py` compares it with.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import torch

from .stamps import DrainedRing

NUM_PARTS = 8  # the metadata tensors ModelRunner records: 5 int32 then 3 int64 in the torch path's order
# One thread block walks the row 1,024 values at a time: past ~16k values (long contexts at large batches: the page
# table and page starts are bs x pages each) the torch pack's many-block kernels are faster, and take over.
MAX_VALUES = 16_384
_BLOCK = 1024
DRAIN_EVERY = 8  # replays per snapshot-ring drain: few enough that a drain never frees a burst of steps at once
_kernel: Any = None


def _build() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def _copy(dst, src, n, BLOCK: tl.constexpr):
        for start in range(0, n, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            m = offs < n
            tl.store(dst + offs, tl.load(src + offs, mask=m).to(tl.int64), mask=m)

    # Lengths and strides vary per graph size: not specialized, so one compile (at warm-up) serves every capture.
    @triton.jit(do_not_specialize=["rows", "width", "n0", "n1", "n2", "n3", "n4", "n5", "n6", "n7", "r2t_stride",
                                   "bs", "cols", "page_size"])
    def ring_pack(ring, index, rows, width, p0, n0, p1, n1, p2, n2, p3, n3, p4, n4, p5, n5, p6, n6, p7, n7,
                  r2t, r2t_stride, rpi, bs, cols, page_size, BLOCK: tl.constexpr):
        idx = tl.load(index)
        dst = ring + idx * width
        _copy(dst, p0, n0, BLOCK)
        dst += n0
        _copy(dst, p1, n1, BLOCK)
        dst += n1
        _copy(dst, p2, n2, BLOCK)
        dst += n2
        _copy(dst, p3, n3, BLOCK)
        dst += n3
        _copy(dst, p4, n4, BLOCK)
        dst += n4
        _copy(dst, p5, n5, BLOCK)
        dst += n5
        _copy(dst, p6, n6, BLOCK)
        dst += n6
        _copy(dst, p7, n7, BLOCK)
        dst += n7
        total = bs * cols
        for start in range(0, total, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            m = offs < total
            slot = tl.load(rpi + offs // cols, mask=m, other=0).to(tl.int64)
            v = tl.load(r2t + slot * r2t_stride + (offs % cols) * page_size, mask=m, other=0)
            tl.store(dst + offs, v.to(tl.int64), mask=m)
        tl.debug_barrier()  # every warp has read the index before it moves on
        tl.store(index, (idx + 1) % rows)

    return ring_pack


def fused_wanted(device: torch.device) -> bool:
    """Whether replays pack with the one kernel: on a GPU with Triton."""
    if device.type != "cuda":
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _row_len(parts: list[torch.Tensor], rpi: torch.Tensor, cols: int) -> int:
    return sum(p.numel() for p in parts) + rpi.numel() * cols


def _launch(ring: torch.Tensor, index: torch.Tensor, parts: list[torch.Tensor], r2t: torch.Tensor,
            rpi: torch.Tensor, cols: int, page_size: int) -> None:
    args: list[Any] = []
    for p in parts:  # Triton takes no lists: each part is a (pointer, length) pair of arguments
        args += [p, p.numel()]
    rows, width = ring.shape
    _kernel[(1,)](ring, index, rows, width, *args, r2t, r2t.stride(0), rpi, rpi.numel(), cols, page_size,
                  BLOCK=_BLOCK, num_warps=4)


class RingPacker:
    """Writes packed snapshots into a ring of int64 rows `dev` `[rows, width]` at the device index `index` int64
    `[1]`, with one kernel per write (graph-capturable: every argument is an address or a size fixed per graph)."""

    def __init__(self, dev: torch.Tensor, index: torch.Tensor) -> None:
        global _kernel
        if _kernel is None:
            _kernel = _build()
        self.dev, self.index = dev, index
        self._warm_up()

    @staticmethod
    def takes(parts: list[torch.Tensor], rpi: torch.Tensor, cols: int) -> bool:
        """Whether `write` is the faster way to record these parts (at most MAX_VALUES values in the row)."""
        return _row_len(parts, rpi, cols) <= MAX_VALUES

    def write(self, parts: list[torch.Tensor], r2t: torch.Tensor, rpi: torch.Tensor, cols: int,
              page_size: int) -> int:
        """Write `parts` (NUM_PARTS contiguous int32 / int64 tensors, flattened in order) and the page starts
        `r2t[rpi[b], c * page_size]` for b < len(rpi), c < cols (r2t int32 `[slots, ctx]`, rpi int64 `[bs]`) as
        one row; returns the row's length."""
        if len(parts) != NUM_PARTS:
            raise ValueError(f"ring_pack takes {NUM_PARTS} parts, got {len(parts)}")
        if not all(p.is_contiguous() for p in parts):
            raise ValueError("ring_pack parts must be contiguous (they are graph buffers' leading views)")
        n = _row_len(parts, rpi, cols)
        if n > self.dev.shape[1]:
            raise ValueError(f"a snapshot of {n} values does not fit the snapshot ring's rows ({self.dev.shape[1]})")
        _launch(self.dev, self.index, parts, r2t, rpi, cols, page_size)
        return n

    def _warm_up(self) -> None:
        """Compile before any capture (a graph must not record a compile), on scratch rows of the same dtypes."""
        d = self.dev.device
        i32, i64 = torch.zeros(2, dtype=torch.int32, device=d), torch.zeros(2, dtype=torch.int64, device=d)
        _launch(torch.zeros(2, 64, dtype=torch.int64, device=d), torch.zeros(1, dtype=torch.int64, device=d),
                [i32] * 5 + [i64] * 3, torch.zeros(2, 8, dtype=torch.int32, device=d), i64, 2, 4)
        torch.cuda.synchronize(d)


class SnapshotRing(DrainedRing):
    """Device rows that captured graphs write their packed snapshots into, copied to host memory in batches.

    Inside each captured graph, after the forward, `write` stores the packed snapshot int64 `[n]` in the row a
    device-resident index names, then advances the index: a replay costs the host nothing for its snapshot.
    The host numbers replays in launch order (`claim`; every replay runs on the compute stream, so launch order
    is the order the rows are written) and every `drain_every` replays enqueues one copy of the new rows to
    pinned memory on the compute stream, which orders it after those replays and before any later one, so a
    row is never overwritten before it is copied. On the CPU the same rows are written at each emulated replay
    and a drain copies them at once.
    """

    def __init__(self, device: torch.device, width: int, rows: int) -> None:
        super().__init__(device.type == "cuda", rows)
        self.device = device
        self.width = width
        self.rows = rows
        self.drain_every = max(1, min(rows // 4, DRAIN_EVERY))
        self.dev = torch.zeros(rows, width, dtype=torch.int64, device=device)
        self.index = torch.zeros(1, dtype=torch.int64, device=device)
        # A host copy apart from the device rows on the CPU too: only a drain overwrites a host row, as on a GPU.
        self.host = torch.zeros(rows, width, dtype=torch.int64, pin_memory=self.is_cuda)
        self._host_np = self.host.numpy()  # rows are read through numpy: torch indexing costs µs per row
        # One kernel per replay's row instead of the torch pack's dozen nodes (GPU with Triton; tracer.ring_pack).
        self.packer: RingPacker | None = None
        if fused_wanted(device):
            try:
                self.packer = RingPacker(self.dev, self.index)
            except Exception as e:  # noqa: BLE001 - a Triton that cannot build it: the torch pack records the same
                print(f"specscope: the one-kernel snapshot pack is unavailable ({type(e).__name__}: {e}); "
                      "replays pack with torch ops", file=sys.stderr)

    def write(self, packed: torch.Tensor) -> None:
        """Store `packed` int64 `[n]` in the current row and advance the index (device ops only: captured)."""
        n = packed.numel()
        if n > self.width:
            raise ValueError(f"a snapshot of {n} values does not fit the snapshot ring's rows ({self.width})")
        self.dev.narrow(1, 0, n).index_copy_(0, self.index, packed.view(1, n))
        self.index.add_(1).remainder_(self.rows)

    def claim(self) -> int:
        """The sequence number of a replay just launched (its row is seq % rows)."""
        seq = self.count
        self.count += 1
        return seq

    def drain(self) -> None:
        """Enqueue the copy of every row written since the last drain (compute stream; no host sync)."""
        if self.drained != self.count:
            self._copy_new()

    def row(self, seq: int, length: int) -> np.ndarray:
        """The host copy of replay `seq`'s snapshot (a copy: the row is reused `rows` replays later)."""
        row: np.ndarray = self._host_np[seq % self.rows, :length].copy()
        return row
