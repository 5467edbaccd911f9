"""Textual's `Strip.divide` without the reference cycle it makes of every whole-line strip.

The compositor divides each screen line of each widget at the widget's cuts; a line that lies in one region is
"divided" into itself, and Textual 8.2 caches that answer in the strip's own `_divide_cache` (`[self]`), so every
such strip -- with its seven FIFOCache objects, their dicts and its segments -- lives in a cycle that only the
cyclic collector frees. Stepping the 100k-step benchmark trace left ~250 such objects per key (10 095 over 40
keys; 15 with this), and they were what triggered the young collections (5-10 ms of CPU each, one every ~25
keys) and most of the survivors the older ones walked. Without the cache entry the answer is the same
(a one-strip list), the strip is freed by reference counting when the screen drops it, and the collector has
little left to do on the key path. `SpecscopeApp` applies it when it is made (idempotent); a Textual that does not
cache `[self]` is left alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from textual.strip import Strip

_original = Strip.divide


def _divide(self: Strip, cuts: Iterable[int]) -> Sequence[Strip]:
    """`Strip.divide`, answering the whole-line case without caching `self` in `self`."""
    cuts = list(cuts)
    n = self.cell_length
    if [c for c in cuts if c <= n] == [n]:
        return [self]
    return _original(self, cuts)


def apply() -> bool:
    """Install the cycle-free `divide` (idempotent); returns whether Textual's was replaced."""
    if Strip.divide is _divide:
        return True
    probe = Strip([], 0)
    out = _original(probe, [0])
    cache = getattr(probe, "_divide_cache", None)
    if out != [probe] or cache is None or cache.get((0,)) is not out:  # not the cycle-making version: leave it
        return False
    Strip.divide = _divide  # type: ignore[method-assign]  # replacing Textual's method is the point of this module
    return True
