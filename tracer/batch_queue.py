"""A bounded FIFO whose consumer takes items in batches and wakes blocked producers only at half-empty.

`queue.Queue` wakes a blocked producer on every `get`; when a producer outpaces the trace writer that
costs two thread switches per step, which on a small machine is a large share of the step's cost.
"""

from __future__ import annotations

import collections
import threading
from typing import Generic, TypeVar

T = TypeVar("T")


class BatchQueue(Generic[T]):
    """Bounded FIFO: `put` blocks while full; `get_batch` blocks while empty and returns up to n items."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = max(1, maxsize)
        self._low_water = self.maxsize // 2
        self._items: collections.deque[T] = collections.deque()
        self._lock = threading.Lock()
        self._not_empty = threading.Condition(self._lock)
        self._not_full = threading.Condition(self._lock)

    def put(self, item: T) -> None:
        """Append `item`, blocking while the queue is full (backpressure, never a drop)."""
        with self._lock:
            while len(self._items) >= self.maxsize:
                self._not_full.wait()
            self._items.append(item)
            self._not_empty.notify()

    def get_batch(self, n: int) -> list[T]:
        """Remove and return 1..n items, blocking while the queue is empty."""
        with self._lock:
            while not self._items:
                self._not_empty.wait()
            items = self._items
            batch = [items.popleft() for _ in range(min(n, len(items)))]
            if len(items) <= self._low_water:
                self._not_full.notify_all()
            return batch
