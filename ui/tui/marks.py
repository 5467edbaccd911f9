"""Where a step's violations point, as the TUI's panes look them up while they draw: the shared marks
(`views.violation_marks`), indexed by what each pane shows (a scalar, a seqlens entry, a page-table cell, a
request row), plus the few things only the TUI needs (which recorded scalar a derived one came from, the cell of
a violation that names none, whether a check judged T against the kernel's q length).

Pure functions over schema records; no Textual.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from specscope.tracer.schema import GraphPhase, Step, Violation
from specscope.ui.views import CellMark, violation_cell, violation_marks

# The request table's columns by the request field a violation names (Violation.array).
REQUEST_FIELDS = {"slot": 2, "seq_len_before": 3, "seq_len_after": 3, "num_q_tokens": 4, "accept_length": 5,
                  "draft_tokens": 6, "accepted_tokens": 7}
# Arrays the page-table pane shows: the grid itself and the seqlens beside each row.
GRID_ARRAYS = ("page_table", "req_to_token_page_starts")
SEQLENS_ARRAYS = ("cache_seqlens", "cu_seqlens_q", "cu_seqlens_k")
# Per-row arrays no pane draws as columns: a mark on one marks its request row (and is listed in the step pane).
ROW_ARRAYS = ("out_cache_loc", "positions", "seq_lens", "seq_lens_cpu", "req_pool_indices")
# Checks that judge the tokens per request (T) against the q length the kernel ran with, or the stride it implies:
# the only verdicts that make "T vs K" worth a mark (T ≠ K alone is a healthy verify runner, and prefill's T is
# the longest extend).
TK_CHECKS = frozenset({"I3", "I6", "I7", "I8", "I16"})
# A scalar the recorder derives from another: `kernel_q_len` is the `max_seq_len_q` the kernel ran with (the value a
# graph froze at capture, on a replay). A mark on it marks its source too, where the values agree, so the field the
# bug is about (PR #27495's max_seq_len_q) is marked where the detail shows it.
DERIVED_FROM = {"kernel_q_len": ("max_seq_len_q", "captured_max_seq_len_q")}

_PREFIX = re.compile(r"^step \d+ \([^)]*\)\s*")


def short_message(v: Violation) -> str:
    """The message without its `step N (model MODE, graph, bs a/b)` prefix, which the step pane's header says."""
    msg = _PREFIX.sub("", v.message, count=1)
    return msg[2:] if msg.startswith(": ") else msg


def cell_name(mk: CellMark) -> str:
    """`page_table[0, 3]`, `cache_seqlens[2]`, `max_seq_len_q` (as the checks' messages write them)."""
    idx = [str(x) for x in (mk.row, mk.col) if x is not None]
    return f"{mk.array}[{', '.join(idx)}]" if idx else mk.array


def mark_text(mk: CellMark) -> str:
    """`4, expected 2` (or `7 (related)`): the shared mark's text without its check id."""
    return mk.text.split(": ", 1)[1] if ": " in mk.text else mk.text


def step_marks(violations: Sequence[Violation], step: Step | None) -> list[CellMark]:
    """The marks of one step's violations (`views.violation_marks`), in their order, plus: the source scalar of a
    derived one (`DERIVED_FROM`), and for a violation that names no cell, the cell its message spells out or its
    request's row (`views.violation_cell`), with no values."""
    here = None if step is None else step.index
    out: list[CellMark] = []
    for v in violations:
        got = violation_marks([v], step=here)
        if not got and step is not None:
            c = violation_cell(v, step, infer=True)
            if c is not None:
                got = [CellMark(v.check_id, v.severity.value, c.array, c.row, c.col, None, None, False, v.message)]
        out.extend(got)
        for mk in got:
            for src in DERIVED_FROM.get(mk.array, ()):
                if step is not None and mk.found is not None and str(step.scalars.get(src)) == mk.found and (
                        src != "captured_max_seq_len_q" or step.graph == GraphPhase.REPLAY):
                    out.append(replace(mk, array=src))
    return out


@dataclass(frozen=True)
class StepMarks:
    """One step's marks, indexed for the panes: `scalar(name)`, `seqlens(name, i)`, `grid(row, col)`, `request(row)`.
    `focus` is the violation walked to (n / N), whose marks are drawn as the highlight."""

    marks: tuple[CellMark, ...] = ()
    focus: Violation | None = None

    @classmethod
    def of(cls, violations: Sequence[Violation], step: Step | None, focus: Violation | None = None) -> StepMarks:
        """The marks of `violations` at `step`."""
        return cls(tuple(step_marks(violations, step)), focus)

    def __bool__(self) -> bool:
        return bool(self.marks)

    def scalar(self, name: str) -> list[CellMark]:
        """Marks on a scalar (an array name with neither row nor column, e.g. `max_seq_len_q`)."""
        return [mk for mk in self.marks if mk.array == name and mk.row is None and mk.col is None]

    def seqlens(self, name: str, i: int) -> list[CellMark]:
        """Marks on entry `i` of a 1-D seqlens array (checks name it by row or by column)."""
        return [mk for mk in self.marks if mk.array == name and (mk.row if mk.row is not None else mk.col) == i]

    def grid(self, row: int, col_lo: int, col_hi: int) -> list[CellMark]:
        """Marks on page-table cells of `row` in columns [col_lo, col_hi) (a whole-row mark: any column)."""
        return [mk for mk in self.marks if mk.array in GRID_ARRAYS and mk.row == row and (
            mk.col is None or col_lo <= mk.col < col_hi)]

    def request(self, row: int) -> list[CellMark]:
        """Marks on request row `row`: its fields, its row of a per-row array, the row itself."""
        return [mk for mk in self.marks if mk.row == row and (
            mk.array in REQUEST_FIELDS or mk.array in ROW_ARRAYS or mk.array == "request")]

    def request_field(self, row: int, col: int) -> list[CellMark]:
        """Marks on column `col` of request row `row` (REQUEST_FIELDS)."""
        return [mk for mk in self.marks if mk.row == row and REQUEST_FIELDS.get(mk.array) == col]

    def is_focus(self, mk: CellMark) -> bool:
        """Whether a mark belongs to the violation walked to."""
        f = self.focus
        return f is not None and mk.check_id == f.check_id and mk.message == f.message

    def unplaced(self, shown_scalars: Iterable[str]) -> list[CellMark]:
        """Marks no pane draws in place (an array the panes do not show, a scalar the detail does not list)."""
        shown = set(shown_scalars)
        out = []
        for mk in self.marks:
            if mk.array in GRID_ARRAYS or mk.array in SEQLENS_ARRAYS or mk.array in REQUEST_FIELDS:
                continue
            if mk.row is None and mk.col is None and mk.array in shown:
                continue
            if mk.array == "request":
                continue
            out.append(mk)
        return out


def tk_flagged(violations: Iterable[Violation]) -> list[str]:
    """The check ids among `violations` that judge T against the kernel's q length (TK_CHECKS), in order."""
    out: list[str] = []
    for v in violations:
        if v.check_id in TK_CHECKS and v.check_id not in out:
            out.append(v.check_id)
    return out


def symbol(mk: CellMark) -> str:
    """The mark's symbol, readable without colour: `✗` a value a check found wrong, `◇` the other side of it."""
    return "◇" if mk.is_related else "✗"
