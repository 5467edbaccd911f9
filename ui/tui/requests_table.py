"""The per-request table of the current step (live and padded rows)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.segment import Segment
from rich.style import Style
from specscope.tracer.schema import ForwardMode, Step
from textual import events
from textual.binding import Binding
from textual.geometry import Region
from textual.scroll_view import ScrollView
from textual.strip import Strip

from . import model as m
from .lines import WidgetArgs, text_width
from .marks import (
    REQUEST_FIELDS,
    StepMarks,
    mark_text,
    symbol,
)
from .pane_style import S_CURSOR, S_MARK, S_ROW_CUR, S_TABLE_HEAD, crop_cells, grow_virtual, merge_runs

if TYPE_CHECKING:
    from typing_extensions import Unpack


class RequestsTable(ScrollView, can_focus=True):
    """One row per live request of the step (padded rows listed dimmed); drawn line by line, so a bs-64 step
    costs the visible rows only. The first two columns stay while the table scrolls sideways."""

    BINDINGS = [
        Binding("j,down", "cursor(1)", show=False), Binding("k,up", "cursor(-1)", show=False),
        Binding("h,left", "scroll_left", show=False), Binding("l,right", "scroll_right", show=False),
    ]
    HEADERS = ("row", "req", "slot", "seq before→after", "q", "acc", "draft", "accepted")
    FIXED = 2

    def __init__(self, **kw: Unpack[WidgetArgs]) -> None:
        super().__init__(**kw)
        # Per row, per column: (runs of (text, style), the cell's own style, width in cells). Plain tuples, not
        # Rich Text: a bs-64 step builds 512 cells, and only the ~12 visible rows are ever turned into segments.
        self.rows: list[list[_TCell]] = []
        self.widths: list[int] = [len(h) for h in self.HEADERS]
        self.cursor_row = 0
        self.highlight_row: int | None = None
        self._height = -1
        self._rendered: dict[tuple[int, bool, bool], tuple[list[Segment], list[Segment]]] = {}
        self._head: tuple[tuple[int, ...], list[Segment], list[Segment]] | None = None

    @property
    def row_count(self) -> int:
        """Rows shown (live and padded)."""
        return len(self.rows)

    def cell_text(self, row: int, col: int) -> str:
        """The plain text of one cell (for tests and the clipboard)."""
        return "".join(t for t, _ in self.rows[row][col][0])

    def show(self, st: Step, byte_level: bool, highlight_row: int | None, marks: StepMarks | None = None) -> None:
        """Fill with the step's requests; a row a violation names gets `✗` by its number, a field it names the
        value found and the one expected."""
        rows: list[list[_TCell]] = []
        verify = st.mode == ForwardMode.TARGET_VERIFY
        sep = "" if byte_level else " "
        for b, r in enumerate(st.requests):
            draft: list[tuple[str, Style | None]] = []
            if r.draft_tokens:
                # One run per stretch of accepted / rejected tokens (the accepted ones are a prefix).
                for link in m.draft_chain(r.draft_tokens, r.accepted_tokens, r.accept_length if verify else None):
                    if link.bonus:
                        continue
                    sty = _S_ACC if link.accepted else _S_REJ
                    txt = m.token_text(link.token, byte_level) + sep
                    if draft and draft[-1][1] is sty:
                        draft[-1] = (draft[-1][0] + txt, sty)
                    else:
                        draft.append((txt, sty))
            acc = m.tokens_text(r.accepted_tokens, byte_level)
            rows.append([_tcell(str(b)), _tcell(str(r.request_id), _S_BOLD), _tcell(str(r.slot)),
                         _tcell(f"{r.seq_len_before}→{r.seq_len_after}"), _tcell(str(r.num_q_tokens)),
                         _tcell(str(r.accept_length) if verify else ""),
                         (tuple(draft), None, sum(text_width(t) for t, _ in draft)), _tcell(acc, _S_GREEN)])
            if marks and (here := marks.request(b)):
                row = rows[-1]
                row[0] = _tcell(f"{b}{symbol(here[0])}", S_MARK)
                for c in {REQUEST_FIELDS[mk.array] for mk in here if mk.array in REQUEST_FIELDS}:
                    got = marks.request_field(b, c)
                    text = "".join(t for t, _ in row[c][0])
                    row[c] = _tcell(f"{text} {symbol(got[0])} " + "; ".join(
                        f"{mk.check_id}: {mark_text(mk)}" for mk in got), S_MARK)
        for b in range(len(st.requests), st.padded_batch_size):
            rows.append([_tcell(str(b), _S_PAD), _tcell("pad", _S_PAD)] + [_EMPTY] * 6)
        same_frame = len(rows) == len(self.rows) and self.size.height > 0
        old_widths = self.widths
        self.rows = rows
        self.widths = [max([len(h)] + [r[c][2] for r in rows]) for c, h in enumerate(self.HEADERS)]
        same_frame = same_frame and self.widths == old_widths
        self._rendered.clear()
        self.highlight_row = highlight_row
        self.cursor_row = highlight_row if highlight_row is not None and highlight_row < len(rows) else min(
            self.cursor_row, max(0, len(rows) - 1))
        want = len(rows) + 3  # border, header, rows, a horizontal scrollbar
        if want > self._height:  # grows only: a layout pass only when the batch grows past its largest
            self._height = want
            self.styles.height = want  # a layout pass only when the batch size changes
        grow_virtual(self, sum(self.widths) + 2 * len(self.widths), len(rows) + 1)
        self._reveal()
        if same_frame:  # same rows and column widths: the border and header stay, the rows are repainted
            self.refresh(Region(0, 1, self.size.width, max(0, self.size.height - 1)))
        else:
            self.refresh()

    def _reveal(self) -> None:
        h = max(1, self.size.height - 1)
        top = int(self.scroll_offset.y)
        if not top <= self.cursor_row < top + h:
            self.scroll_to(y=max(0, self.cursor_row - h // 2), animate=False, immediate=True)

    def action_cursor(self, d: int) -> None:
        """Move the row cursor."""
        self.cursor_row = max(0, min(len(self.rows) - 1, self.cursor_row + d))
        self._reveal()
        self.refresh()

    def _cells(self, cells: Sequence[_TCell], base: Style) -> tuple[list[Segment], list[Segment]]:
        fixed: list[Segment] = []
        rest: list[Segment] = []
        for c, (runs, cell_style, w) in enumerate(cells):
            out = fixed if c < self.FIXED else rest
            cs = base + cell_style if cell_style is not None else base
            for text, sty in runs:
                out.append(Segment(text, cs + sty if sty is not None else cs))
            pad = self.widths[c] - w
            if pad > 0:
                out.append(Segment(" " * pad, cs))
            out.append(Segment("  ", base))
        return merge_runs(fixed), merge_runs(rest)

    def render_line(self, y: int) -> Strip:
        """Header, then the rows from the scroll position."""
        width = self.size.width
        if y == 0:
            key = tuple(self.widths)
            if self._head is None or self._head[0] != key:
                self._head = (key, *self._cells([_tcell(h) for h in self.HEADERS], S_TABLE_HEAD))
            _, fixed, rest = self._head
            base = S_TABLE_HEAD
        else:
            r = int(self.scroll_offset.y) + y - 1
            if not 0 <= r < len(self.rows):
                return Strip.blank(width)
            base = S_CURSOR if r == self.cursor_row and self.has_focus else (
                S_ROW_CUR if r == self.cursor_row else _S_NONE)
            key = (r, r == self.cursor_row, self.has_focus and r == self.cursor_row)
            got = self._rendered.get(key)
            if got is None:
                cells = list(self.rows[r])
                if r == self.highlight_row:
                    runs, _, w = cells[1]
                    cells[1] = (tuple((t, None) for t, _ in runs), _S_ROW_HIT, w)
                got = self._cells(cells, base)
                self._rendered[key] = got
            fixed, rest = got
        fw = sum(len(s.text) for s in fixed)
        if fw >= width:
            return Strip(fixed).crop_extend(0, width, base)
        strip = Strip(fixed + crop_cells(rest, int(self.scroll_offset.x), width - fw))
        return strip if strip.cell_length == width else strip.crop_extend(0, width, base)  # wide characters

    def on_click(self, event: events.Click) -> None:
        """Put the cursor on the clicked row."""
        off = event.get_content_offset(self)
        if off is not None and off.y >= 1:
            self.cursor_row = max(0, min(len(self.rows) - 1, int(self.scroll_offset.y) + off.y - 1))
            self.refresh()


_TCell = tuple[tuple[tuple[str, "Style | None"], ...], "Style | None", int]
_S_NONE = Style()
_S_BOLD, _S_GREEN, _S_PAD = Style(bold=True), Style(color="green"), Style(color="grey42")
_S_ACC, _S_REJ = Style(bold=True, color="green"), Style(strike=True, color="red")
_S_ROW_HIT = Style.parse("bold black on #ffff5f")
_EMPTY: _TCell = ((), None, 0)


def _tcell(text: str, style: Style | None = None) -> _TCell:
    """A table cell of one run."""
    return (((text, None),) if text else (), style, text_width(text))
