"""The per-step view every check reads: the step's arrays by name, the violations it emits (with the cell they
name), and the per-row quantities several checks share (mode formulas, query lengths, the pages a row reads)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from ..schema import Cell, ForwardMode, Step, Violation
from .catalogue import BY_ID

# Modes whose kernel runs one q_len_per_req for every row; the context kernels split tokens by cu_seqlens_q.
UNIFORM = (ForwardMode.DECODE, ForwardMode.DRAFT_DECODE, ForwardMode.TARGET_VERIFY)
CONTEXT = (ForwardMode.EXTEND, ForwardMode.DRAFT_EXTEND)
# The attention metadata arrays the kernels read (int32, bound by address in a CUDA graph).
PTR_NAMES = ("cache_seqlens", "cu_seqlens_q", "cu_seqlens_k", "page_table")
R2T, LOC = "req_to_token_page_starts", "out_cache_loc"


def short(x: object) -> str:
    """A value as a violation shows it: arrays as lists, long lists cut after 8 entries."""
    if isinstance(x, np.ndarray):
        x = x.tolist()
    if isinstance(x, list) and len(x) > 8:
        return "[" + ", ".join(map(str, x[:8])) + ", ...]"
    return str(x)


class Ctx:
    """Per-step view with helpers to emit violations."""

    def __init__(self, step: Step, skip: frozenset[str] = frozenset()) -> None:
        self.step = step
        self.out: list[Violation] = []
        self.a = {a.name: a for a in step.arrays}
        self.skip = skip  # invariants whose facts this trace does not record: never judged on a made-up value
        self._reads: tuple[int, np.ndarray, np.ndarray] | None | bool = False  # False: not computed yet
        self._want: list[int] | None = None
        self._tok: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def want_lens(self) -> list[int]:
        """Each live row's cache_seqlens by its mode's formula (I5, I39), computed once."""
        if self._want is None:
            s = self.step
            self._want = [formula(s, r.seq_len_before, r.seq_len_after) for r in s.requests]
        return self._want

    def token_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`_token_rows` of this step, computed once."""
        if self._tok is None:
            self._tok = _token_rows(self)
        return self._tok

    def reads(self) -> tuple[int, np.ndarray, np.ndarray] | None:
        """`_live_reads` of this step, computed once (several relations need it)."""
        if self._reads is False:
            self._reads = _live_reads(self)
        return self._reads  # type: ignore[return-value]

    def v(self, check_id: str, msg: str, request_id: int | None = None, *, array: str | None = None,
          row: int | None = None, col: int | None = None, found: object = None, expected: object = None,
          related: Iterable[Cell] = ()) -> None:
        """Emit a violation of `check_id` (unless this trace cannot judge it), naming the step and the cell."""
        if check_id in self.skip:
            return
        s = self.step
        where = f"step {s.index} ({s.model} {s.mode.value}"
        where += f" #{s.step_id}" if s.step_id is not None else ""
        where += f", {s.graph.value}, bs {s.batch_size}/{s.padded_batch_size})"
        who = f" request {request_id}" if request_id is not None else ""
        self.out.append(Violation(
            check_id, BY_ID[check_id].severity, s.index, f"{where}{who}: {msg}", request_id, array=array, row=row,
            col=col, found=None if found is None else short(found),
            expected=None if expected is None else short(expected), related=tuple(related)))

    def arr(self, name: str) -> np.ndarray | None:
        """The values of the recorded array `name`, or None when the step did not record it."""
        a = self.a.get(name)
        return None if a is None else a.values


def cell(array: str, row: int | None = None, col: int | None = None, value: object = None,
         step: int | None = None) -> Cell:
    """The other side of a relation: a recorded cell with its value (`step` only when recorded at another step)."""
    return Cell(array, row, col, None if value is None else short(value), step)


def formula(step: Step, s: int, after: int) -> int:
    """cache_seqlens of a live row by its mode's formula over S (seq_len_before) and seq_len_after."""
    T, i = step.tokens_per_request, step.step_id or 0
    f: dict[ForwardMode, Callable[[int, int], int]] = {
        ForwardMode.DECODE: lambda s, after: s + 1,
        ForwardMode.DRAFT_DECODE: lambda s, after: s + i + 1,
        ForwardMode.TARGET_VERIFY: lambda s, after: s + T,
        ForwardMode.DRAFT_EXTEND: lambda s, after: s + T,
        ForwardMode.EXTEND: lambda s, after: after,
    }
    return f[step.mode](s, after)


def q_lens(step: Step) -> list[int]:
    """Query tokens of each live row: T for the uniform-q modes, each row's own for the context kernels."""
    if step.mode in UNIFORM:
        return [step.tokens_per_request] * step.batch_size
    return [r.num_q_tokens for r in step.requests]


def pages_read(c: Ctx, b: int) -> int:
    """Logical pages live row b reads (its cache_seqlens), clipped to the recorded columns."""
    cs, pt = c.arr("cache_seqlens"), c.arr("page_table")
    if cs is None:
        # Reported as I2 by `checker._guard`: the TypeError (and message) indexing the missing array would raise.
        raise TypeError("'NoneType' object is not subscriptable")
    assert pt is not None, "callers check the page table is recorded"
    return min(max(-(-int(cs[b]) // c.step.page_size), 0), int(pt.shape[1]))


def _token_rows(c: Ctx) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per query token of the live rows: its row, its index within the row, and the rows' query lengths."""
    q = np.asarray(q_lens(c.step)[: len(c.step.requests)], dtype=np.int64)
    rows = np.repeat(np.arange(q.shape[0]), q)
    first = np.cumsum(q) - q
    return rows, np.arange(rows.shape[0]) - first[rows], q


def _live_reads(c: Ctx) -> tuple[int, np.ndarray, np.ndarray] | None:
    """(live rows, logical pages each reads, mask of the read columns) over the recorded page-table columns."""
    cs, pt = c.arr("cache_seqlens"), c.arr("page_table")
    live = len(c.step.requests)
    if cs is None or pt is None or not live or pt.ndim != 2:
        return None
    n = np.clip(-(-cs[:live].astype(np.int64) // c.step.page_size), 0, pt.shape[1])
    return live, n, np.arange(pt.shape[1])[None, :] < n[:, None]


def first_dup(row: np.ndarray) -> tuple[int, int] | None:
    """(earlier column, later column) of the first repeated value in `row`, or None."""
    seen: dict[int, int] = {}
    for j, x in enumerate(row.tolist()):
        if x in seen:
            return seen[x], j
        seen[x] = j
    return None


def token_row(s: Step, k: int) -> tuple[int, int]:
    """(row, token within the row) of query token k of the live rows."""
    start = 0
    for b, n in enumerate(q_lens(s)):
        if k < start + n:
            return b, k - start
        start += n
    return len(s.requests), k - start
