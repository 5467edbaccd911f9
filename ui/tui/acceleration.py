"""Held-key acceleration of `[` / `]`: the longer a key repeats, the further each repeat moves."""

from __future__ import annotations

import time
from collections.abc import Callable


class Accelerator:
    """Held-key acceleration (Dolphie's replay keys): repeats that arrive faster than `window` seconds apart
    are a held key, and the stride grows the longer it is held; a lone press always moves one step."""

    STRIDES = ((3, 1), (8, 2), (16, 5), (28, 10), (40, 25))

    def __init__(self, window: float = 0.1, clock: Callable[[], float] = time.monotonic) -> None:
        self.window, self.clock = window, clock
        self.key: str | None = None
        self.last = -1e9
        self.streak = 0

    def stride(self, key: str) -> int:
        """Steps to move for this press of `key`."""
        now = self.clock()
        self.streak = self.streak + 1 if key == self.key and now - self.last <= self.window else 0
        self.key, self.last = key, now
        for limit, n in self.STRIDES:
            if self.streak < limit:
                return n
        return 100

    def held(self) -> bool:
        """Whether the last key is still repeating by this accelerator's clock."""
        return self.streak > 0 and self.clock() - self.last <= self.window
