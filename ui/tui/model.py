"""View models the TUI draws from: page-table cell classes, token text, draft chains, acceptance. Torch-free.

Pure functions over schema records, so the tests exercise them without a terminal. The classification, time
format, violation cells and check order are the shared `specscope.ui.views`' (nothing here repeats them).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from specscope.tracer.schema import ForwardMode, StepSummary, Violation
from specscope.ui import views

# Cell classes of the page-table grid are the shared view model's kinds, in its display precedence (the first
# wins): a class is its index in KINDS, so a zoomed-out cell shows the minimum index it covers.
KINDS = list(views.CellKind)
OUT_OF_RANGE, STALE, SHARED, PADDED, FRESH, OK, NOT_READ = (KINDS.index(k) for k in (
    views.CellKind.OUT_OF_RANGE, views.CellKind.STALE, views.CellKind.SHARED, views.CellKind.PADDED,
    views.CellKind.FRESH, views.CellKind.OK, views.CellKind.UNREAD))
CLASS_NAMES = tuple({"out_of_range": "out of range", "stale": "stale", "shared": "shared", "padded": "padded row",
                     "fresh": "freshly written", "ok": "ok", "unread": "not read"}[k.value] for k in KINDS)
# One symbol per class (the shared ones, so TUI and dashboard agree); "ok" is a blank in the shared set, which
# the TUI draws as a dot-free square so an all-ok row is still visibly a row.
SYMBOLS = tuple("■" if k == views.CellKind.OK else views.SYMBOLS[k] for k in KINDS)
_STYLE_BY_KIND = {
    views.CellKind.OUT_OF_RANGE: "bold white on red", views.CellKind.STALE: "bold white on magenta",
    views.CellKind.SHARED: "black on yellow", views.CellKind.PADDED: "grey35", views.CellKind.FRESH: "bold cyan",
    views.CellKind.OK: "green", views.CellKind.UNREAD: "grey42",
}  # fmt: skip
STYLES = tuple(_STYLE_BY_KIND[k] for k in KINDS)
ZOOMS = (0, 1, 4, 16, 64, 256, 1024)  # 0: physical page numbers; N: N logical pages per character


# The page table of one step, classified by the shared classifier (`views.page_classes`).
Grid = views.PageClasses


def zoom_cells(grid: Grid, zoom: int) -> tuple[np.ndarray, np.ndarray]:
    """(classes, first logical page) per character column at `zoom` pages per character (worst class wins)."""
    z = max(1, zoom)
    ncell = -(-grid.cols // z)
    first = np.arange(ncell) * z
    if z == 1:
        return grid.cls, first
    pad = ncell * z - grid.cols
    c = np.pad(grid.cls, ((0, 0), (0, pad)), constant_values=len(KINDS)) if pad else grid.cls
    return c.reshape(grid.rows, ncell, z).min(axis=2), first


def fit_zoom(cols: int, width: int) -> int:
    """The smallest zoom (pages per character) at which `cols` pages fit in `width` characters."""
    for z in ZOOMS[1:]:
        if -(-cols // z) <= max(1, width):
            return z
    return ZOOMS[-1]


# -- tokens -----------------------------------------------------------------------------------------------

def token_text(tok: int, byte_level: bool) -> str:
    """A token as the user reads it: the shared byte text for the byte-level models (a space shown as ␣ so a
    chain of single tokens stays readable), else its id."""
    if not byte_level:
        return str(tok)
    return "␣" if tok == 32 else views.byte_text([tok])


def tokens_text(tokens: Sequence[int], byte_level: bool) -> str:
    """A token sequence as one string (bytes joined, ids separated by spaces)."""
    return views.byte_text(tokens) if byte_level else " ".join(str(t) for t in tokens)


@dataclass(frozen=True)
class ChainLink:
    """One drafted token of a verify row: accepted or rejected (and the bonus token the target added)."""

    token: int
    accepted: bool
    bonus: bool = False


def draft_chain(draft: Sequence[int], accepted: Sequence[int], accept_length: int | None = None) -> list[ChainLink]:
    """The chain of a verify row: drafted tokens marked accepted while they match, then the bonus token. A row
    whose accepted tokens were not recorded (SGLang's backend sees the accept lengths, not the tokens) marks its
    first `accept_length - 1` drafts accepted by count, and no bonus token is known."""
    out: list[ChainLink] = []
    if not accepted and accept_length:
        return [ChainLink(int(t), j < accept_length - 1) for j, t in enumerate(draft)]
    n_ok = max(0, len(accepted) - 1)  # accepted includes the bonus token
    for j, t in enumerate(draft):
        out.append(ChainLink(int(t), j < n_ok and int(accepted[j]) == int(t)))
    if accepted:
        out.append(ChainLink(int(accepted[-1]), True, bonus=True))
    return out


# -- acceptance ---------------------------------------------------------------------------------------------

def add_hist(total: list[int], hist: Iterable[int]) -> list[int]:
    """Element-wise sum of two accept-length histograms of any lengths."""
    h = list(hist)
    if len(h) > len(total):
        total = total + [0] * (len(h) - len(total))
    for i, c in enumerate(h):
        total[i] += int(c)
    return total


def accept_by_position(hist: Sequence[int]) -> list[float]:
    """Rate at which draft position j was accepted, from an accept-length histogram (the shared statistics)."""
    return views.acceptance_from_histogram(hist, 0, 0).by_position if sum(hist) else []


def mean_accept(hist: Sequence[int]) -> float | None:
    """Mean accept length (tokens committed per verify row, bonus included)."""
    return views.acceptance_from_histogram(hist, 0, 0).mean_accept_length if sum(hist) else None


def window_hist(summaries: Iterable[StepSummary]) -> list[int]:
    """Accept-length histogram over the verify steps among `summaries`."""
    total: list[int] = []
    for s in summaries:
        if s.mode == ForwardMode.TARGET_VERIFY and s.accept_hist:
            total = add_hist(total, s.accept_hist)
    return total


class SlidingHist:
    """`window_hist` of a window of steps that slides with the current step: a move by d steps adds and removes
    about d summaries instead of re-summing the ~400 of the window. Equal to `window_hist` of the window."""

    def __init__(self) -> None:
        self.a = self.b = 0
        self.counts: list[int] = []
        self.lengths: Counter[int] = Counter()  # histogram lengths in the window: the result is the longest

    def window(self, a: int, b: int, rows: Callable[[int, int], list[StepSummary] | None]) -> list[int] | None:
        """The histogram of [a, b); `rows(lo, hi)` gives summaries or None when they are not at hand (then None,
        and nothing changes)."""
        if a >= self.b or b <= self.a or (b - a) < abs(a - self.a) + abs(b - self.b):
            got = rows(a, b)
            if got is None:
                return None
            self.counts, self.lengths = [], Counter()
            self._add(got, 1)
        else:
            spans = [(lo, hi, sign) for lo, hi, sign in ((self.a, a, -1), (b, self.b, -1), (a, self.a, 1),
                                                       (self.b, b, 1)) if hi > lo]
            parts = [(rows(lo, hi), sign) for lo, hi, sign in spans]
            ready = [(p, sign) for p, sign in parts if p is not None]
            if len(ready) < len(parts):
                return None
            for p, sign in ready:
                self._add(p, sign)
        self.a, self.b = a, b
        n = max((k for k, c in self.lengths.items() if c > 0), default=0)
        return self.counts[:n]

    def _add(self, summaries: Iterable[StepSummary], sign: int) -> None:
        for s in summaries:
            if s.mode == ForwardMode.TARGET_VERIFY and s.accept_hist:
                h = s.accept_hist
                if len(h) > len(self.counts):
                    self.counts += [0] * (len(h) - len(self.counts))
                for i, c in enumerate(h):
                    self.counts[i] += sign * int(c)
                self.lengths[len(h)] += sign


def bar(frac: float, width: int) -> str:
    """A horizontal bar of eighths, `width` characters at 1.0."""
    eighths = int(round(max(0.0, min(1.0, frac)) * width * 8))
    full, part = divmod(eighths, 8)
    return ("█" * full + (" ▏▎▍▌▋▊▉"[part] if part else "")).ljust(width)


# -- violations ---------------------------------------------------------------------------------------------

def violation_key(v: Violation) -> tuple[str, int, int | None, str]:
    """Identity of a violation across sources (the trace's table and the TUI's own checker)."""
    return (v.check_id, v.step, v.request_id, v.message)
