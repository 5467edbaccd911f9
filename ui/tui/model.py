"""View models the TUI draws from: page-table cell classes, token text, draft chains, acceptance. Torch-free.

Pure functions over schema records, so the tests exercise them without a terminal. Where the shared
`specscope.ui.views` offers the same thing, the TUI should move to it; these stay minimal.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from specscope.tracer.schema import ForwardMode, Step, StepSummary, Violation
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


@dataclass(frozen=True)
class Grid:
    """The page table of one step, classified: `pages[r, j]` physical page, `cls[r, j]` class per cell."""

    pages: np.ndarray  # int64 [rows, cols]
    cls: np.ndarray  # int8 [rows, cols], index into KINDS
    live_rows: int
    request_ids: tuple[int | None, ...]  # per row; None for padded rows
    cache_seqlens: list[int]
    cu_seqlens_q: list[int]
    cu_seqlens_k: list[int]
    page_size: int
    full_cols: int

    @property
    def rows(self) -> int:
        """Rows of the grid (live and padded)."""
        return int(self.pages.shape[0])

    @property
    def cols(self) -> int:
        """Logical pages recorded per row."""
        return int(self.pages.shape[1])


def classify(step: Step) -> Grid | None:
    """The shared classification of `views.page_grid`, computed with numpy over the whole table at once (the
    shared one builds a Python object per cell: ~100 ms for a bs-64 step; this is ~1 ms). The tests check the
    two agree cell by cell on every sample trace."""
    pt_snap = step.array("page_table")
    if pt_snap is None or pt_snap.values.ndim != 2:
        return None
    pages = pt_snap.values.astype(np.int64)
    rows, cols = pages.shape
    p = max(1, step.page_size)
    live = min(step.batch_size, rows)
    cs_a = step.array("cache_seqlens")
    cs = np.zeros(rows, np.int64)
    if cs_a is not None:
        v = cs_a.values.astype(np.int64).reshape(-1)[:rows]
        cs[: len(v)] = v
    need = -(-cs // p)
    colidx = np.arange(cols)[None, :]
    read = colidx < need[:, None]
    is_live = (np.arange(rows) < live)[:, None]
    owners = [r.request_id for r in step.requests]
    owner_of_row = np.array([owners[b] if b < len(owners) else -b - 1 for b in range(live)], np.int64)
    # Shared: a non-zero page that a live row reads and another live row (another owner) reads too.
    live_read = read & is_live
    shared = np.zeros((rows, cols), bool)
    if live and cols:
        lr_pages = pages[:live][live_read[:live]]
        lr_owner = np.broadcast_to(owner_of_row[:, None], (live, cols))[live_read[:live]]
        if lr_pages.size:
            # Distinct (page, owner) pairs as one int64 key each (a 2-D unique sorts rows as void records: slow).
            pairs = np.unique((lr_pages << 32) | (lr_owner & 0xFFFFFFFF))
            uniq, cnt = np.unique(pairs >> 32, return_counts=True)
            multi = uniq[(cnt > 1) & (uniq != 0)]
            if multi.size:
                shared[:live] = np.isin(pages[:live], multi) & live_read[:live]
    # Fresh: the physical pages this step's query tokens write, per row (views._fresh_pages' bounds).
    fresh = _fresh(step, pages, live, p)
    stale = np.zeros((rows, cols), bool)
    st_a = step.array("req_to_token_page_starts")
    if st_a is not None and st_a.values.ndim == 2:
        r, c = min(rows, st_a.values.shape[0]), min(cols, st_a.values.shape[1])
        stale[:r, :c] = (st_a.values[:r, :c].astype(np.int64) // p) != pages[:r, :c]
    npages = step.scalars.get("num_kv_pages")
    oor = np.zeros((rows, cols), bool) if npages is None else (pages >= npages) | (pages < 0)
    cls = np.full((rows, cols), OK, np.int8)
    cls[fresh] = FRESH
    cls[shared] = SHARED
    cls[stale] = STALE
    cls[~read] = NOT_READ
    cls[~is_live[:, 0]] = PADDED
    # Stale, shared and fresh only apply to cells a live row reads.
    cls[is_live[:, 0][:, None] & ~read] = NOT_READ
    cls[oor] = OUT_OF_RANGE
    rids = tuple(owners[b] if b < live and b < len(owners) else None for b in range(rows))
    cu_q, cu_k = step.array("cu_seqlens_q"), step.array("cu_seqlens_k")
    return Grid(pages, cls, live, rids, [int(x) for x in cs], [] if cu_q is None else [int(x) for x in cu_q.values],
                [] if cu_k is None else [int(x) for x in cu_k.values], p,
                int(pt_snap.shape[1]) if len(pt_snap.shape) == 2 else cols)


def _fresh(step: Step, pages: np.ndarray, live: int, p: int) -> np.ndarray:
    """Cells whose physical page receives KV this step (out_cache_loc), per row: `views._fresh_pages`' rule,
    vectorized (one membership test over (row, page) keys)."""
    rows, cols = pages.shape
    out = np.zeros((rows, cols), bool)
    loc = step.array("out_cache_loc")
    if loc is None or live == 0:
        return out
    slots = loc.values.astype(np.int64).reshape(-1)
    if step.mode in (ForwardMode.DECODE, ForwardMode.DRAFT_DECODE, ForwardMode.TARGET_VERIFY):
        q = step.scalars.get("kernel_q_len", step.tokens_per_request) if step.mode == ForwardMode.TARGET_VERIFY else 1
        bounds = np.arange(live + 1, dtype=np.int64) * q
    else:
        cuq = step.array("cu_seqlens_q")
        if cuq is not None and len(cuq.values.reshape(-1)) > live:
            bounds = cuq.values.astype(np.int64).reshape(-1)[: live + 1]
        else:
            lens = [r.num_q_tokens for r in step.requests[:live]]
            bounds = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    nrow = len(bounds) - 1
    if nrow <= 0:
        return out
    lo, hi = np.clip(bounds[:-1], 0, None), np.clip(bounds[1:], 0, None)
    tok = np.arange(len(slots))
    row_of = np.searchsorted(hi, tok, side="right")  # the first row whose end is past the token
    ok = (row_of < nrow)
    ok[ok] &= tok[ok] >= lo[row_of[ok]]
    if not ok.any():
        return out
    big = np.int64(1) << 40
    keys = np.unique(row_of[ok] * big + slots[ok] // p)
    r = min(rows, nrow)
    cell = np.arange(r, dtype=np.int64)[:, None] * big + pages[:r]
    out[:r] = np.isin(cell, keys)
    return out


def classify_shared(step: Step) -> Grid | None:
    """The same grid from the shared per-cell view model (the reference the fast one is tested against)."""
    pg = views.page_grid(step)
    if pg is None:
        return None
    rows, cols = len(pg.cells), pg.num_cols
    pages = np.zeros((rows, cols), np.int64)
    cls = np.zeros((rows, cols), np.int8)
    index = {k: i for i, k in enumerate(KINDS)}
    for b, row in enumerate(pg.cells):
        pages[b, : len(row)] = [c.page for c in row]
        cls[b, : len(row)] = [index[c.kind] for c in row]
    rids = tuple(r.request_id if b < pg.batch_size else None for b, r in enumerate(step.requests)) + (None,) * max(
        0, rows - len(step.requests))
    return Grid(pages, cls, pg.batch_size, rids[:rows], pg.cache_seqlens, pg.cu_seqlens_q, pg.cu_seqlens_k,
                pg.page_size, pg.full_cols)


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

_CELL = re.compile(r"\b(page_table|cache_seqlens|cu_seqlens_q|cu_seqlens_k|seq_lens|out_cache_loc|positions|"
                   r"req_pool_indices|req_to_token_page_starts)\[(\d+)(?:,\s*(\d+))?\]")


@dataclass(frozen=True)
class Cell:
    """Where a violation points: an array (or "request"), its row and column (None when the whole row)."""

    array: str
    row: int | None
    col: int | None


def violation_cell(v: Violation, step: Step | None = None) -> Cell | None:
    """The cell a violation names: its recorded cell, else one its message spells out, else its request's row."""
    if v.array is not None:
        return Cell(v.array, v.row, v.col)
    m = _CELL.search(v.message)
    if m:
        return Cell(m.group(1), int(m.group(2)), None if m.group(3) is None else int(m.group(3)))
    if v.request_id is not None and step is not None:
        for b, r in enumerate(step.requests):
            if r.request_id == v.request_id:
                return Cell("request", b, None)
    return None


def violation_key(v: Violation) -> tuple[str, int, int | None, str]:
    """Identity of a violation across sources (the trace's table and the TUI's own checker)."""
    return (v.check_id, v.step, v.request_id, v.message)
