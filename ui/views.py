"""View models shared by the TUI and the dashboard: what a step screen shows, derived from the recorded values.

Pure functions over `tracer` records (no Textual, no Dash, no torch). The page-table classification here is
for display; the invariant catalogue in `tracer/checks/` is what judges a trace.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from specscope.tracer.schema import ForwardMode, GraphPhase, RunInfo, Step, StepSummary, Violation

_UNIFORM = (ForwardMode.DECODE, ForwardMode.DRAFT_DECODE, ForwardMode.TARGET_VERIFY)
_BYTE_MODELS = ("tiny", "tiny-draft")


# -- tokens as text --------------------------------------------------------------------------------------


def is_byte_level(run: RunInfo) -> bool:
    """True when token ids are bytes (the embedded models, or a config that says so)."""
    if run.target_model in _BYTE_MODELS:
        return True
    tok = run.config.get("tokenizer")
    return tok == "bytes"


_ESCAPES = {0x0A: "\\n", 0x09: "\\t", 0x0D: "\\r", 0x5C: "\\\\"}


def byte_text(tokens: Iterable[int]) -> str:
    """Byte tokens as one printable line: ASCII as is, \\n \\t \\r escaped, other bytes as \\xNN."""
    out = []
    for t in tokens:
        t = int(t)
        if t in _ESCAPES:
            out.append(_ESCAPES[t])
        elif 0x20 <= t < 0x7F:
            out.append(chr(t))
        else:
            out.append(f"\\x{t & 0xFF:02x}")
    return "".join(out)


def token_formatter(run: RunInfo) -> Callable[[Sequence[int]], str]:
    """How to show a token sequence for this run: text for byte-level models, space-separated ids otherwise."""
    if is_byte_level(run):
        return byte_text
    return lambda toks: " ".join(str(int(t)) for t in toks)


# -- step detail ---------------------------------------------------------------------------------------


def step_label(s: Step | StepSummary) -> str:
    """A short name: `#12 target TARGET_VERIFY replay` (with `draft step i` for draft decodes)."""
    sid = f" #{s.step_id}" if s.step_id is not None else ""
    return f"#{s.index} {s.model} {s.mode.value}{sid} {s.graph.value}"


def fmt_ns(ns: int, compact: bool = False) -> str:
    """A duration in ns as µs or ms with 3 significant digits; `compact`: no space and a unit that keeps three
    digits up to seconds (`4.2µs`, `1.25ms`, `312ms`, `12s`), for a terminal's narrow columns."""
    if compact:
        if ns < 10_000:
            return f"{ns / 1000:.1f}µs"
        if ns < 10_000_000:
            return f"{ns / 1e6:.2f}ms" if ns < 1_000_000 else f"{ns / 1e6:.1f}ms"
        if ns < 10_000_000_000:
            return f"{ns / 1e6:.0f}ms"
        return f"{ns / 1e9:.0f}s"
    if abs(ns) >= 1_000_000:
        return f"{ns / 1e6:.3g} ms"
    return f"{ns / 1e3:.3g} µs"


def step_detail(s: Step | StepSummary, *, capture: int | None = None, kernel: str | None = None,
                spans: Sequence[tuple[str, str, int, int]] = ()) -> list[tuple[str, str]]:
    """(label, value) rows of the step detail panel; `spans` are (stream, name, start_ns, end_ns)."""
    sc = s.scalars
    graph = s.graph.value
    if s.graph == GraphPhase.REPLAY:
        graph += f" (capture step {capture})" if capture is not None else " (capture not in trace)"
    # T differing from K is a healthy configuration (adaptive speculation); whether a value is wrong is for the
    # checks to say, and the viewers mark the cells their violations name.
    tk = f"T {s.tokens_per_request} / K {s.num_draft_tokens}"
    rows = [
        ("step", str(s.index)),
        ("iteration", str(s.iteration)),
        ("model", s.model),
        ("mode", s.mode.value + (f" (draft step {s.step_id})" if s.step_id is not None else "")),
        ("graph", graph),
        ("bs / padded", f"{s.batch_size} / {s.padded_batch_size}"
         + (f"  ({s.padded_batch_size - s.batch_size} padded)" if s.padded_batch_size > s.batch_size else "")),
        ("tokens", tk),
        ("max_seq_len_q", _scalar(sc, "max_seq_len_q")),
        ("kernel q_len", _scalar(sc, "kernel_q_len")),
        ("max_seq_len_k", _scalar(sc, "max_seq_len_k")),
        ("page size", str(s.page_size)),
    ]
    if "captured_max_seq_len_q" in sc:
        rows.append(("captured q_len", str(sc["captured_max_seq_len_q"])))
    if kernel:
        rows.append(("kernel", kernel))
    rows.append(("host time", fmt_ns(s.end_ns - s.start_ns)))
    for stream, name, t0, t1 in spans:
        rows.append((f"{stream}:{name}", fmt_ns(t1 - t0)))
    return rows


def _scalar(sc: dict[str, int], name: str) -> str:
    return str(sc[name]) if name in sc else "-"


# -- requests and the draft chain ----------------------------------------------------------------------


@dataclass(frozen=True)
class RequestView:
    """One live row of a step as the request table shows it."""

    row: int
    request_id: int
    slot: int
    seq_len_before: int
    seq_len_after: int
    num_q_tokens: int
    accept_length: int
    draft_tokens: tuple[int, ...]
    accepted_tokens: tuple[int, ...]
    draft_accepted: tuple[bool, ...]  # per draft token: kept by the verify
    bonus: int | None  # the token the target added after the accepted drafts (None outside verify)
    draft_text: str
    accepted_text: str

    @property
    def num_draft_accepted(self) -> int:
        """Draft tokens accepted (the bonus excluded)."""
        return sum(self.draft_accepted)


def request_views(step: Step, fmt: Callable[[Sequence[int]], str] = byte_text) -> list[RequestView]:
    """The request table of a step; accepted draft tokens are the common prefix of drafts and accepted tokens."""
    out = []
    for b, r in enumerate(step.requests):
        acc, drafts = tuple(r.accepted_tokens), tuple(r.draft_tokens)
        kept = [j < len(acc) - 1 and all(acc[i] == drafts[i] for i in range(j + 1)) for j in range(len(drafts))]
        bonus = acc[-1] if acc and step.mode == ForwardMode.TARGET_VERIFY else None
        out.append(RequestView(
            row=b, request_id=r.request_id, slot=r.slot, seq_len_before=r.seq_len_before,
            seq_len_after=r.seq_len_after, num_q_tokens=r.num_q_tokens, accept_length=r.accept_length,
            draft_tokens=drafts, accepted_tokens=acc, draft_accepted=tuple(kept), bonus=bonus,
            draft_text=fmt(drafts), accepted_text=fmt(acc),
        ))  # fmt: skip
    return out


# -- the page-table grid ---------------------------------------------------------------------------------


class CellKind(str, enum.Enum):
    """How a page-table cell looks; the order is the display precedence (first wins)."""

    OUT_OF_RANGE = "out_of_range"  # page id outside the KV pool
    STALE = "stale"  # differs from req_to_token: the kernel reads someone else's (or last batch's) page
    SHARED = "shared"  # the same physical page is read by another live request
    PADDED = "padded"  # a padded graph row (not a request)
    FRESH = "fresh"  # this step writes KV into this page
    OK = "ok"
    UNREAD = "unread"  # past the row's cache_seqlens: recorded but not read


# One symbol per kind, so the grid reads without colour.
SYMBOLS: dict[CellKind, str] = {
    CellKind.OUT_OF_RANGE: "✗", CellKind.STALE: "!", CellKind.SHARED: "=", CellKind.PADDED: "~",
    CellKind.FRESH: "+", CellKind.OK: " ", CellKind.UNREAD: "·",
}  # fmt: skip
KIND_TEXT: dict[CellKind, str] = {
    CellKind.OUT_OF_RANGE: "page id outside the KV pool", CellKind.STALE: "differs from req_to_token",
    CellKind.SHARED: "also read by another live request", CellKind.PADDED: "padded graph row",
    CellKind.FRESH: "KV written this step", CellKind.OK: "read, matches req_to_token",
    CellKind.UNREAD: "past cache_seqlens (not read)",
}  # fmt: skip
_PRECEDENCE = list(CellKind)


@dataclass(frozen=True)
class PageCell:
    """One cell: row b (request or padded row) x logical page j."""

    row: int
    col: int
    page: int  # physical page the kernel was handed
    kind: CellKind
    expected_page: int | None  # from req_to_token (None when not recorded or not read)
    token_start: int  # token positions this logical page covers for this row: [start, end)
    token_end: int
    owner: int | None  # request id of the row (None for padded rows)
    shared_with: tuple[int, ...] = ()  # other request ids reading the same physical page


@dataclass(frozen=True)
class PageGrid:
    """The page table a kernel consumed, classified cell by cell, with the seqlens beside it."""

    page_size: int
    batch_size: int  # live rows; rows past it are padding
    num_cols: int  # recorded columns (the live part of the table)
    full_cols: int  # columns of the tensor the kernel saw
    cells: list[list[PageCell]]
    cache_seqlens: list[int]
    cu_seqlens_q: list[int]
    cu_seqlens_k: list[int]
    row_labels: list[str]
    counts: dict[CellKind, int] = field(default_factory=dict)

    def cell(self, row: int, col: int) -> PageCell | None:
        """The cell at (row, col), or None outside the recorded table."""
        if 0 <= row < len(self.cells) and 0 <= col < len(self.cells[row]):
            return self.cells[row][col]
        return None


@dataclass(frozen=True)
class PageClasses:
    """The page table of one step, classified: `pages[r, j]` physical page, `cls[r, j]` its kind as an index into
    `list(CellKind)` (the display precedence: a smaller index wins)."""

    pages: np.ndarray  # int64 [rows, cols]
    cls: np.ndarray  # int8 [rows, cols], index into list(CellKind)
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


_KIND_INDEX = {k: i for i, k in enumerate(CellKind)}
_OUT_OF_RANGE, _STALE, _SHARED, _PADDED, _FRESH, _OK, _UNREAD = (_KIND_INDEX[k] for k in (
    CellKind.OUT_OF_RANGE, CellKind.STALE, CellKind.SHARED, CellKind.PADDED, CellKind.FRESH, CellKind.OK,
    CellKind.UNREAD))


def page_classes(step: Step) -> PageClasses | None:
    """Every recorded page-table cell of a step classified at once (numpy, ~1 ms for a bs-64 step): the one
    classifier, which `page_grid` (a Python object per cell) and the TUI's grid both draw from; None when the
    step has no page table."""
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
    # Fresh: the physical pages this step's query tokens write, per row.
    fresh = _fresh_cells(step, pages, live, p)
    stale = np.zeros((rows, cols), bool)
    st_a = step.array("req_to_token_page_starts")
    if st_a is not None and st_a.values.ndim == 2:
        r, c = min(rows, st_a.values.shape[0]), min(cols, st_a.values.shape[1])
        stale[:r, :c] = (st_a.values[:r, :c].astype(np.int64) // p) != pages[:r, :c]
    npages = step.scalars.get("num_kv_pages")
    oor = np.zeros((rows, cols), bool) if npages is None else (pages >= npages) | (pages < 0)
    cls = np.full((rows, cols), _OK, np.int8)
    cls[fresh] = _FRESH
    cls[shared] = _SHARED
    cls[stale] = _STALE
    cls[~read] = _UNREAD
    cls[~is_live[:, 0]] = _PADDED
    # Stale, shared and fresh only apply to cells a live row reads.
    cls[is_live[:, 0][:, None] & ~read] = _UNREAD
    cls[oor] = _OUT_OF_RANGE
    rids = tuple(owners[b] if b < live and b < len(owners) else None for b in range(rows))
    cu_q, cu_k = step.array("cu_seqlens_q"), step.array("cu_seqlens_k")
    return PageClasses(pages, cls, live, rids, [int(x) for x in cs],
                       [] if cu_q is None else [int(x) for x in cu_q.values],
                       [] if cu_k is None else [int(x) for x in cu_k.values], p,
                       int(pt_snap.shape[1]) if len(pt_snap.shape) == 2 else cols)


def page_grid(step: Step) -> PageGrid | None:
    """Every recorded page-table cell of a step as a `PageCell` (kinds from `page_classes`); None when the step
    has no page table."""
    pc = page_classes(step)
    if pc is None:
        return None
    pt, p = pc.pages, pc.page_size
    rows, cols = pt.shape
    cs = _values(step, "cache_seqlens", rows)
    starts_snap = step.array("req_to_token_page_starts")
    starts = None if starts_snap is None else starts_snap.values.astype(np.int64)
    live = pc.live_rows
    owners = [r.request_id for r in step.requests]
    need = [-(-int(cs[b]) // p) if b < len(cs) else 0 for b in range(rows)]
    readers: dict[int, set[int]] = {}
    for b in range(live):
        for j in range(min(need[b], cols)):
            pg = int(pt[b, j])
            if pg != 0:
                readers.setdefault(pg, set()).add(owners[b] if b < len(owners) else -b - 1)
    kinds = list(CellKind)
    grid: list[list[PageCell]] = []
    counts: dict[CellKind, int] = {}
    for b in range(rows):
        owner = owners[b] if b < live and b < len(owners) else None
        row: list[PageCell] = []
        for j, (pg, k) in enumerate(zip(pt[b].tolist(), pc.cls[b].tolist(), strict=True)):
            kind = kinds[k]
            exp = None
            if starts is not None and b < starts.shape[0] and j < starts.shape[1] and j < need[b]:
                exp = int(starts[b, j]) // p
            counts[kind] = counts.get(kind, 0) + 1
            shared = tuple(sorted(readers.get(pg, set()) - {owner})) if kind == CellKind.SHARED else ()
            t0 = j * p
            t1 = min((j + 1) * p, int(cs[b]) if b < len(cs) else t0)
            row.append(PageCell(b, j, pg, kind, exp, t0, max(t0, t1), owner, shared))
        grid.append(row)
    labels = [f"r{owners[b]}" if b < live and b < len(owners) else f"pad{b}" for b in range(rows)]
    return PageGrid(
        page_size=p, batch_size=live, num_cols=cols, full_cols=pc.full_cols, cells=grid,
        cache_seqlens=[int(x) for x in cs], cu_seqlens_q=_list(step, "cu_seqlens_q"),
        cu_seqlens_k=_list(step, "cu_seqlens_k"), row_labels=labels,
        counts=counts,
    )  # fmt: skip


def _values(step: Step, name: str, n: int) -> np.ndarray:
    a = step.array(name)
    if a is None:
        return np.zeros(n, np.int64)
    return a.values.astype(np.int64).reshape(-1)


def _list(step: Step, name: str) -> list[int]:
    a = step.array(name)
    return [] if a is None else [int(x) for x in a.values.reshape(-1)]


def _fresh_cells(step: Step, pages: np.ndarray, live: int, p: int) -> np.ndarray:
    """Cells whose physical page receives KV this step (out_cache_loc), per row: the slots of the row's query
    tokens (uniform q per row in decode / verify, cu_seqlens_q otherwise), one membership test over (row, page)."""
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


@dataclass(frozen=True)
class BinnedCell:
    """A zoomed-out cell: logical pages [col_lo, col_hi] of one row, shown as their most notable kind."""

    row: int
    col_lo: int
    col_hi: int
    kind: CellKind
    pages: tuple[int, ...]


def bin_columns(grid: PageGrid, width: int) -> list[list[BinnedCell]]:
    """The grid squeezed to at most `width` columns per row (for 100k-token contexts); each bin shows the
    highest-precedence kind inside it, so a single stale page is never hidden by zooming out."""
    width = max(1, width)
    per = max(1, -(-grid.num_cols // width))
    out = []
    for row in grid.cells:
        bins = []
        for lo in range(0, len(row), per):
            chunk = row[lo:lo + per]
            kind = min((c.kind for c in chunk), key=_PRECEDENCE.index)
            bins.append(BinnedCell(chunk[0].row, lo, lo + len(chunk) - 1, kind, tuple(c.page for c in chunk)))
        out.append(bins)
    return out


class Cell(NamedTuple):
    """Where a violation points: an array (or "request"), its row and column (None: the whole row / array)."""

    array: str
    row: int | None
    col: int | None


_SPELLED_CELL = re.compile(r"\b(page_table|cache_seqlens|cu_seqlens_q|cu_seqlens_k|seq_lens|out_cache_loc|positions|"
                           r"req_pool_indices|req_to_token_page_starts)\[(\d+)(?:,\s*(\d+))?\]")


def violation_cell(v: Violation, step: Step | None = None, *, infer: bool = False) -> Cell | None:
    """(array, row, col) a violation points at, or None when it names no array; with `infer`, a violation that
    records no cell points at the one its message spells out (`page_table[2, 5]`), else at its request's row
    (`("request", b, None)`, found in `step`)."""
    if v.array is not None:
        return Cell(v.array, v.row, v.col)
    if not infer:
        return None
    m = _SPELLED_CELL.search(v.message)
    if m:
        return Cell(m.group(1), int(m.group(2)), None if m.group(3) is None else int(m.group(3)))
    if v.request_id is not None and step is not None:
        for b, r in enumerate(step.requests):
            if r.request_id == v.request_id:
                return Cell("request", b, None)
    return None


def check_key(check_id: str) -> tuple[str, int]:
    """A check id's place in the catalogue: by prefix, then by number (I3 before I10)."""
    head = check_id.rstrip("0123456789")
    tail = check_id[len(head):]
    return head, int(tail) if tail else -1


def catalogue_order(violations: Iterable[Violation]) -> list[Violation]:
    """Violations as `check` lists them: errors before warnings, then by check id (`check_key`)."""
    return sorted(violations, key=lambda v: (v.severity.value != "error", *check_key(v.check_id)))


@dataclass(frozen=True)
class CellMark:
    """One recorded cell a violation names, as a viewer marks it in place: found vs expected, readable as text."""

    check_id: str
    severity: str  # "error" or "warning"
    array: str  # a Step.arrays name, a scalar (e.g. "max_seq_len_q") or a request field (e.g. "accept_length")
    row: int | None
    col: int | None
    found: str | None  # the value recorded in this cell
    expected: str | None  # what the invariant expected here (None on the related side of a relation)
    is_related: bool  # the other side of the relation (the cell this one disagrees with), not the wrong value
    message: str

    @property
    def text(self) -> str:
        """`I7: 4, expected 2` (or `I40: 7 (related)`), without colour."""
        if self.is_related:
            return f"{self.check_id}: {self.found} (related)"
        if self.expected is not None:
            return f"{self.check_id}: {self.found}, expected {self.expected}"
        return f"{self.check_id}: {self.found}"


def violation_marks(violations: Iterable[Violation], step: int | None = None) -> list[CellMark]:
    """Every cell the violations name (each violation's own cell, then the facts it is related to), in the order
    given; with `step`, only cells recorded at that step (a related fact may live at another, e.g. its capture)."""
    out: list[CellMark] = []
    for v in violations:
        for i, c in enumerate(v.cells()):
            at = v.step if c.step is None else c.step
            if step is not None and at != step:
                continue
            own = i == 0 and v.array is not None
            out.append(CellMark(v.check_id, v.severity.value, c.array, c.row, c.col, c.value,
                                v.expected if own else None, not own, v.message))
    return out


def marks_by_cell(marks: Iterable[CellMark]) -> dict[tuple[str, int | None, int | None], list[CellMark]]:
    """Marks keyed by (array, row, col), for a viewer that looks each cell up as it draws it."""
    out: dict[tuple[str, int | None, int | None], list[CellMark]] = {}
    for m in marks:
        out.setdefault((m.array, m.row, m.col), []).append(m)
    return out


# A scalar the recorder derives from another: `kernel_q_len` is the `max_seq_len_q` the kernel ran with (the value a
# graph froze at capture, on a replay). A mark on it also marks its source where the two values agree, so the field
# a bug is about (max_seq_len_q, overwritten by a graph's cached K) is marked where a viewer shows it.
DERIVED_FROM: dict[str, tuple[str, ...]] = {"kernel_q_len": ("max_seq_len_q", "captured_max_seq_len_q")}


def step_marks(violations: Iterable[Violation], step: Step | StepSummary) -> list[CellMark]:
    """`violation_marks(violations, step=step.index)`, plus each marked derived scalar's source (DERIVED_FROM) where
    its recorded value is the one found: what a step page marks."""
    out: list[CellMark] = []
    for mk in violation_marks(violations, step=step.index):
        out.append(mk)
        for src in DERIVED_FROM.get(mk.array, ()):
            if src == "captured_max_seq_len_q" and step.graph != GraphPhase.REPLAY:
                continue
            if mk.found is not None and src in step.scalars and str(step.scalars[src]) == mk.found:
                out.append(CellMark(mk.check_id, mk.severity, src, mk.row, mk.col, mk.found, mk.expected,
                                    mk.is_related, mk.message))
    return out


def cell_name(array: str, row: int | None, col: int | None) -> str:
    """`page_table[0, 3]`, `cache_seqlens[2]`, `max_seq_len_q`: a cell as the checks' messages write it."""
    idx = [str(x) for x in (row, col) if x is not None]
    return f"{array}[{', '.join(idx)}]" if idx else array


# -- acceptance ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AcceptanceStats:
    """Acceptance over a set of verify steps. Accept length counts the bonus token; draft acceptance does not."""

    verify_steps: int
    rows: int  # request rows verified
    mean_accept_length: float  # tokens committed per row per verify (bonus included)
    tokens_per_verify_step: float  # tokens committed per verify forward (all rows)
    draft_acceptance: float  # accepted draft tokens / drafted tokens (bonus excluded)
    draft_waste: float  # rejected draft tokens / drafted tokens
    by_position: list[float]  # element j: share of rows whose draft token j was accepted
    histogram: list[int]  # element L: rows with accept length L


def acceptance_from_summaries(rows: Iterable[StepSummary]) -> AcceptanceStats:
    """Acceptance statistics from the TARGET_VERIFY summary rows among `rows` (their accept histograms)."""
    hist: list[int] = []
    steps = drafted = 0
    for s in rows:
        if s.mode != ForwardMode.TARGET_VERIFY or not s.accept_hist:
            continue
        steps += 1
        if len(s.accept_hist) > len(hist):
            hist.extend([0] * (len(s.accept_hist) - len(hist)))
        for n, c in enumerate(s.accept_hist):
            hist[n] += c
        drafted += sum(s.accept_hist) * max(0, s.tokens_per_request - 1)
    return acceptance_from_histogram(hist, steps, drafted)


def acceptance_from_histogram(hist: Sequence[int], verify_steps: int, drafted: int) -> AcceptanceStats:
    """Statistics from an accept-length histogram (element L = rows with accept length L)."""
    rows = int(sum(hist))
    committed = sum(n * c for n, c in enumerate(hist))
    accepted = sum(max(0, n - 1) * c for n, c in enumerate(hist))
    depth = max(0, len(hist) - 2)
    by_pos = [sum(c for n, c in enumerate(hist) if n - 1 > j) / rows if rows else 0.0 for j in range(depth)]
    return AcceptanceStats(
        verify_steps=verify_steps, rows=rows,
        mean_accept_length=committed / rows if rows else 0.0,
        tokens_per_verify_step=committed / verify_steps if verify_steps else 0.0,
        draft_acceptance=accepted / drafted if drafted else 0.0,
        draft_waste=(drafted - accepted) / drafted if drafted else 0.0,
        by_position=by_pos, histogram=list(hist),
    )  # fmt: skip
