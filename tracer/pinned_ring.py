"""Pinned host memory for the recorder's eager snapshots: slots handed out in order, reused once their steps are
written (one non-blocking device->host copy per step lands in a slot)."""

from __future__ import annotations

from collections.abc import Callable

import torch


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
