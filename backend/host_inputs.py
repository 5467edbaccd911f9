"""Host inputs of an iteration staged in one pinned buffer and sent with one non-blocking copy.

`torch.tensor(list, device=cuda)` and copies from pageable memory block the host until the copy is done (and
pageable host-to-device copies wait for the GPU to drain); the engine made about twenty per iteration. Here the
host writes every small int64 input of a phase into a pinned buffer, and one `copy_(non_blocking=True)` sends it.
Buffers form a ring; a buffer is rewritten only after the event recorded behind its last copy has completed, which
the one accept sync per iteration has already guaranteed in the steady state (so the wait costs nothing there).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class HostInputs:
    """A ring of (pinned host, device) int64 buffer pairs; `upload` sends several small int lists at once."""

    def __init__(self, device: torch.device, capacity: int = 1 << 16, ring: int = 8) -> None:
        self.device = device
        self.is_cuda = device.type == "cuda"
        self.capacity = capacity
        self._ring = [self._pair(capacity) for _ in range(ring)] if self.is_cuda else []
        self._events: list[torch.cuda.Event | None] = [None] * len(self._ring)
        self._next = 0

    def _pair(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.empty(n, dtype=torch.int64, pin_memory=True),
                torch.empty(n, dtype=torch.int64, device=self.device))

    def upload(self, parts: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Device int64 tensors `[len(part)]`, one per part, sent in one copy on the current stream.

        On a GPU the returned tensors are views of a ring buffer: valid until `ring` more uploads have been made.
        On the CPU there is no copy to save: each part is its own tensor."""
        if not self.is_cuda:
            return [torch.tensor(p, dtype=torch.int64) for p in parts]
        sizes = [len(p) for p in parts]
        total = sum(sizes)
        if total > self.capacity:  # a prefill of long prompts: grow once, the ring keeps the larger size
            self.capacity = max(total, 2 * self.capacity)
            self._ring = [self._pair(self.capacity) for _ in self._ring]
            self._events = [None] * len(self._ring)
        k, self._next = self._next, (self._next + 1) % len(self._ring)
        ev = self._events[k]
        if ev is not None:
            ev.synchronize()  # already complete in the steady state (the accept sync came after this copy)
        host, dev = self._ring[k]
        if total:
            host[:total] = torch.tensor([x for p in parts for x in p], dtype=torch.int64)  # host-side only
            dev[:total].copy_(host[:total], non_blocking=True)
        ev = ev or torch.cuda.Event()
        ev.record()
        self._events[k] = ev
        out, start = [], 0
        for n in sizes:
            out.append(dev[start:start + n])
            start += n
        return out
