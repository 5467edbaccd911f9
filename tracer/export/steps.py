"""`--steps A:B` ranges, shared by the export commands."""

from __future__ import annotations


def parse_steps(text: str | None, last: int | None = None) -> tuple[int, int | None]:
    """`A:B` (B exclusive), `A:`, `:B` or `N` (one step) -> (start, stop); stop None means to the end.

    A and B are step indexes, not positions: a bundle keeps the original trace's numbers, so `--steps 30:40` of a
    bundle of steps 30..59 is its first ten steps. `last` (the trace's highest index) rejects a range past it.
    Raises ValueError with a one-line message for anything else (negative, empty or reversed ranges)."""
    if text is None or text.strip() in ("", ":"):
        return 0, None
    t = text.strip()
    hi: int | None
    try:
        if ":" not in t:
            a = int(t)
            lo, hi = a, a + 1
        else:
            left, right = t.split(":", 1)
            lo = int(left) if left.strip() else 0
            hi = int(right) if right.strip() else None
    except ValueError:
        raise ValueError(f"--steps {text!r}: expected A:B, A:, :B or N with integer step indexes") from None
    if lo < 0 or (hi is not None and hi < 0):
        raise ValueError(f"--steps {text!r}: step indexes are >= 0")
    if hi is not None and hi <= lo:
        raise ValueError(f"--steps {text!r}: the range is empty (B must be greater than A)")
    if last is not None and lo > last:
        raise ValueError(f"--steps {text!r}: the trace's steps end at {last}")
    return lo, hi
