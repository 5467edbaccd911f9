"""The TUI's panes. Each draws one thing about the current step; none of them reads more than it shows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from specscope.tracer.schema import ForwardMode, Step, StepSummary, Violation
from specscope.ui.recording_notes import RecordingNotes, replay_without_metadata
from specscope.ui.views import CellMark
from textual import events
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import Tree
from textual.widgets.tree import TreeNode

from . import model as m
from .lines import LinePane, Lines, WidgetArgs, text_width
from .marks import (
    GRID_ARRAYS,
    REQUEST_FIELDS,
    SEQLENS_ARRAYS,
    StepMarks,
    mark_text,
    short_message,
    symbol,
    tk_flagged,
)
from .marks import cell_name as marks_cell
from .source import TraceSource
from .streams import fmt_ns

if TYPE_CHECKING:
    from typing_extensions import Unpack

MODE_SHORT = {"EXTEND": "extend", "DECODE": "decode", "DRAFT_DECODE": "draft", "TARGET_VERIFY": "verify",
              "DRAFT_EXTEND": "d-ext"}
GRAPH_SHORT = {"eager": "E", "capture": "C", "replay": "R"}
_S_CURSOR = Style(bgcolor="#2b4f8a", bold=True)
_S_ERR = Style(color="#ff5f5f", bold=True)
_S_WARN = Style(color="#ffaf00")
_S_DIM = Style(color="grey50")
_S_HEAD = Style(color="grey70", bold=True, underline=True)
_S_HIT = Style(color="black", bgcolor="#ffff5f", bold=True, blink=False)
_S_CELL_HIT = Style(color="black", bgcolor="#ffff5f", bold=True, underline=True)
_KIND_STYLES = tuple(Style.parse(x) for x in m.STYLES)
_S_TABLE_HEAD = Style(bold=True, color="grey85", bgcolor="#1c3a5e")
_S_ROW_CUR = Style(bgcolor="#23334a")
_S_MARK = Style(color="#ff5f5f", bold=True, underline=True)
_S_MARK_FOCUS = Style(color="black", bgcolor="#ffff5f", bold=True, underline=True)
_S_MARK_TEXT = Style(color="#ff8787")
_S_NOTE = Style(color="#ffaf00", italic=True)  # what the recording could not record
_S_CELL_MARK = Style(underline=True, bold=True, reverse=True)


def step_row_text(s: StepSummary, width: int, nviol: int, tk_bad: bool = False) -> str:
    """One line of the step list, as many columns as `width` holds; `tk_bad`: a check judged T against the
    kernel's q length at this step (`marks.TK_CHECKS`), the only case the T/K column marks with `≠`."""
    mode = MODE_SHORT.get(s.mode.value, s.mode.value)
    sid = "" if s.step_id is None else str(s.step_id)
    tk = f"{s.tokens_per_request}{'≠' if tk_bad else '/'}{s.num_draft_tokens}"
    g = GRAPH_SHORT.get(s.graph.value, "?")
    v = f"!{nviol}" if nviol else ""
    bs, pbs = s.batch_size, s.padded_batch_size
    if width >= 58:
        return (f"{s.index:>6} {mode:<6} {s.model[0]}{sid:<2} {s.iteration:>5} {bs:>3}/{pbs:<3}"
                f" {g} {tk:<5} {fmt_ns(s.duration_ns):>7} {v}")
    if width >= 44:
        return f"{s.index:>6} {mode:<6} {s.model[0]}{sid:<1} {s.iteration:>4} {bs:>3}/{pbs:<3} {g} {tk:<5} {v}"
    return f"{s.index:>5} {mode:<6} {s.model[0]}{sid:<1} {bs:>2}/{pbs:<2} {g} {tk:<4}{v}"


def step_header_text(width: int) -> str:
    """The step list's column header for `width`."""
    if width >= 58:
        return f"{'step':>6} {'mode':<6} {'m#':<3} {'iter':>5} {'bs/pad':<7} G {'T/K':<5} {'time':>7} viol"
    if width >= 44:
        return f"{'step':>6} {'mode':<6} {'m#':<2} {'iter':>4} {'bs/pad':<7} G {'T/K':<5} viol"
    return f"{'step':>5} {'mode':<6} {'m#':<2} {'bs/pd':<5} G {'T/K':<4}!"


class StepList(ScrollView, can_focus=True):
    """Virtualized list of every step: only the visible rows' summaries are ever fetched. Rows are positions
    (0..n-1); the step in a row is `source.index_at(row)`, which a bundle's original numbering makes differ."""

    BINDINGS = [
        Binding("j,down", "app.next_step", "next", show=False),
        Binding("k,up", "app.prev_step", "prev", show=False),
        Binding("pagedown", "page(1)", show=False),
        Binding("pageup", "page(-1)", show=False),
        Binding("home", "app.first_step", show=False),
        Binding("end", "app.last_step", show=False),
    ]

    class Picked(Message):
        """A step was picked: clicked, or paged to (the app shows it)."""

        def __init__(self, index: int) -> None:
            super().__init__()
            self.index = index

    def __init__(self, source: TraceSource, **kw: Unpack[WidgetArgs]) -> None:
        super().__init__(**kw)
        self.source = source
        self.cursor = 0

    def on_mount(self) -> None:
        """Size the virtual canvas to the trace."""
        self.sync_size()

    def sync_size(self) -> None:
        """Follow a growing trace."""
        self.virtual_size = Size(0, self.source.num_steps() + 1)  # rows are cut to the pane: no sideways scroll

    def on_resize(self) -> None:
        """Keep the cursor in view: a step shown before the first layout (start-up, `--follow`) had no height."""
        self.sync_size()
        h = max(1, self.size.height - 1)
        top = int(self.scroll_offset.y)
        if not top <= self.cursor < top + h:
            self.scroll_to(y=max(0, self.cursor - h // 2), animate=False, immediate=True)

    def set_cursor(self, i: int) -> None:
        """Move the highlight to row i and keep it in view (centred when it jumps); without a scroll only the
        two rows that changed are redrawn."""
        old, self.cursor = self.cursor, i
        h = max(1, self.size.height - 1)
        top = int(self.scroll_offset.y)
        if not top <= i < top + h:
            self.scroll_to(y=max(0, i - h // 2), animate=False, immediate=True)
            self.refresh()
            return
        for row in (old, i):
            if top <= row < top + h:
                self.refresh_lines(row + 1, 1)  # virtual line: the header is line 0

    def action_page(self, n: int) -> None:
        """Move the cursor one screen."""
        row = self.cursor + n * max(1, self.size.height - 2)
        row = max(0, min(self.source.num_steps() - 1, row))
        i = self.source.index_at(row)
        if i is not None:
            # The cursor moves now, so a second page key before the app handles the message pages on from here.
            self.set_cursor(row)
            self.post_message(self.Picked(i))

    def render_line(self, y: int) -> Strip:
        """Header on line 0, then one summary per line."""
        width = self.size.width
        if y == 0:
            return Strip([Segment(step_header_text(width).ljust(width)[:width], _S_HEAD)], width)
        row = int(self.scroll_offset.y) + y - 1
        i = self.source.index_at(row)
        s = None if i is None else self.source.summary(i)
        if i is None or s is None:
            return Strip.blank(width)
        nv = self.source.num_violations(s)
        here = self.source.violations.at(i) if nv else []
        text = step_row_text(s, width, nv, bool(tk_flagged(here))).ljust(width)[:width]
        style = Style()
        if nv:
            style = _S_ERR if s.num_errors or any(v.severity.value == "error" for v in here) else _S_WARN
        elif s.mode == ForwardMode.TARGET_VERIFY:
            style = Style(color="#87d7ff")
        elif s.model == "draft":
            style = Style(color="#d7d7af")
        if row == self.cursor:
            style = style + _S_CURSOR
        return Strip([Segment(text, style)], width)

    def on_click(self, event: events.Click) -> None:
        """Pick the clicked row."""
        off = event.get_content_offset(self)
        if off is not None and off.y >= 1:
            i = self.source.index_at(int(self.scroll_offset.y) + off.y - 1)
            if i is not None:
                self.post_message(self.Picked(i))


class TextPane(LinePane):
    """A pane of styled lines with a fixed size: updating it repaints the changed lines only, without a layout
    pass (which costs a whole-screen relayout per step with auto-sized panes)."""


class DetailPanel(TextPane):
    """Forward mode, draft step, graph phase (and its capture), bs vs padded bs, T vs K, max_seq_len_q/k, timings;
    each field a violation names is marked in place with what was found and what the check expected."""

    BASE_HEIGHT = 6  # border and five lines; a step with marked fields takes a line per marked field more

    def show(self, st: Step, s: StepSummary, capture: int | None, kernel: str, nviol: int,
             marks: StepMarks | None = None, tk: Sequence[str] = (), notes: RecordingNotes | None = None) -> None:
        """Draw the detail of one step: short lines that do not wrap (the ends are cut on narrow panes); a marked
        field gets a line of its own, so its found vs expected is never cut. `notes` (what the recording could not
        record) turn a replay without metadata into "not recorded (why)" and a field the backend lacks into
        "(absent in this backend)", not a "-" that reads like a lost value."""
        marks = marks or StepMarks()
        notes = notes or RecordingNotes()
        t = Lines()
        mode = st.mode.value + (f" #{st.step_id}" if st.step_id is not None else "")
        t.append(f"step {st.index}", style="bold")
        t.append(f"  {st.model} {mode}", style="bold #87d7ff")
        t.append(f"  iter {st.iteration}\n")
        g = st.graph.value
        if g == "replay":
            g += f" of capture {capture}" if capture is not None else " (capture not in trace)"
        t.append(g, style="#d7afff")
        pad = st.padded_batch_size - st.batch_size
        t.append(f" · bs {st.batch_size}/{st.padded_batch_size}")
        if pad:
            t.append(f" (+{pad} pad)", style="#ffaf00")
        t.append(f" · T {st.tokens_per_request} K {st.num_draft_tokens}")
        if tk:  # only where a check judged T against the kernel's q length (T ≠ K alone is a healthy runner)
            t.append(f" ✗ {' '.join(tk)}", style=_S_MARK)
        t.append("\n")
        sc = st.scalars
        names = [("max_seq_len_q", "max_seq_len_q"), ("max_seq_len_k", "max_seq_len_k")]
        if "kernel_q_len" in sc:
            names.append(("kernel_q_len", "kernel_q_len"))
        if "captured_max_seq_len_q" in sc and st.graph.value == "replay":
            names.append(("captured_max_seq_len_q", "frozen q"))
        marked: list[tuple[str, str, list[CellMark]]] = []
        plain: list[tuple[str, str]] = []  # (key, label) of the fields shown unmarked
        for key, label in names:
            got = marks.scalar(key)
            if got:
                marked.append((label, str(sc.get(key, "-")), got))
            else:
                plain.append((key, label))
        shown = {k for k, _ in names}
        for mk in marks.unplaced(shown):  # a scalar the line above does not list, or an array no pane draws
            if mk.row is None and mk.col is None and mk.array in sc:
                marked.append((mk.array, str(sc[mk.array]), [mk]))
        for label, value, got in marked:
            focus = any(marks.is_focus(mk) for mk in got)
            t.append(f"{symbol(got[0])} {label} {value}", style=_S_MARK_FOCUS if focus else _S_MARK)
            t.append("  " + "; ".join(f"{mk.check_id}: {mark_text(mk)}" for mk in got) + "\n", style=_S_MARK_TEXT)
        if replay_without_metadata(notes, st.graph.value, [a.name for a in st.arrays], list(sc)):
            # The graph computed this replay's metadata where Python never sees it: there is nothing to show, and
            # the capture's values would be stale.
            t.append(f"not recorded ({notes.replay_reason()})", style=_S_NOTE)
            t.append(": max_seq_len_q/k, page table, seqlens · header, requests, spans recorded\n", style="grey62")
        else:
            # A field the backend does not have is recorded absent, never made up: its own line says so (a "-"
            # would read as a value lost), short enough for an 80-column terminal's pane.
            absent = [label for key, label in plain if key not in sc and notes.is_absent(key)]
            t.append(" · ".join(f"{label} {sc.get(key, '-')}" for key, label in plain if label not in absent) + "\n")
            for label in absent:
                t.append(f"{label} ")
                t.append("(absent in this backend)\n", style=_S_NOTE)
        for mk in marks.unplaced(shown):
            if mk.row is None and mk.col is None and mk.array in sc:
                continue
            t.append(f"{symbol(mk)} {marks_cell(mk)} = {mark_text(mk)}", style=_S_MARK)
            t.append(f"  {mk.check_id}\n", style=_S_MARK_TEXT)
        t.append(f"{kernel} · host {fmt_ns(st.end_ns - st.start_ns)}", style="grey70")
        for sp in st.spans:
            t.append(f" · {sp.stream}:{sp.name} {fmt_ns(sp.end_ns - sp.start_ns)}", style="grey70")
        if st.errors:
            t.append(f"\n{len(st.errors)} call error(s): {st.errors[0].call}: {st.errors[0].message}", style="bold red")
        lines = len(t.rows)
        want = max(self.BASE_HEIGHT, lines + 1)
        if self.styles.height is None or self.styles.height.value != want:
            self.styles.height = want  # a layout pass only when the number of marked fields changes
        self.update(t)


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
                row[0] = _tcell(f"{b}{symbol(here[0])}", _S_MARK)
                for c in {REQUEST_FIELDS[mk.array] for mk in here if mk.array in REQUEST_FIELDS}:
                    got = marks.request_field(b, c)
                    text = "".join(t for t, _ in row[c][0])
                    row[c] = _tcell(f"{text} {symbol(got[0])} " + "; ".join(
                        f"{mk.check_id}: {mark_text(mk)}" for mk in got), _S_MARK)
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
        _grow_virtual(self, sum(self.widths) + 2 * len(self.widths), len(rows) + 1)
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
        return _merge(fixed), _merge(rest)

    def render_line(self, y: int) -> Strip:
        """Header, then the rows from the scroll position."""
        width = self.size.width
        if y == 0:
            key = tuple(self.widths)
            if self._head is None or self._head[0] != key:
                self._head = (key, *self._cells([_tcell(h) for h in self.HEADERS], _S_TABLE_HEAD))
            _, fixed, rest = self._head
            base = _S_TABLE_HEAD
        else:
            r = int(self.scroll_offset.y) + y - 1
            if not 0 <= r < len(self.rows):
                return Strip.blank(width)
            base = _S_CURSOR if r == self.cursor_row and self.has_focus else (
                _S_ROW_CUR if r == self.cursor_row else _S_NONE)
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
        strip = Strip(fixed + _crop(rest, int(self.scroll_offset.x), width - fw))
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


NO_PAGE_TABLE = "no page table in this step"


class PageGrid(ScrollView, can_focus=True):
    """Request (and padded row) × logical page → physical page, classes in colour and symbol; zoomable."""

    BINDINGS = [
        Binding("plus,equals_sign", "zoom(-1)", "zoom in", show=False),
        Binding("minus", "zoom(1)", "zoom out", show=False),
        Binding("f", "fit", "fit", show=False),
        Binding("j", "scroll_down", show=False),
        Binding("k", "scroll_up", show=False),
        Binding("h", "scroll_left", show=False),
        Binding("l", "scroll_right", show=False),
    ]

    def __init__(self, **kw: Unpack[WidgetArgs]) -> None:
        super().__init__(**kw)
        self.grid: m.Grid | None = None
        self.zoom = 0  # index into model.ZOOMS
        self.highlight: m.Cell | None = None
        self.marks = StepMarks()
        self._marked_cols: dict[int, list[int | None]] = {}  # row -> page-table columns marked (None: whole row)
        self._mark_lines: list[list[Segment]] = []
        self._auto_fit = True
        self._zoom_cache: tuple[tuple[int, int], tuple[np.ndarray, np.ndarray]] | None = None
        self._lines: dict[tuple, Strip] = {}
        self.empty_text = NO_PAGE_TABLE

    # -- layout ----------------------------------------------------------------------------------

    def _label_w(self) -> int:
        return 32

    def _cell_w(self) -> int:
        if self.grid is None:
            return 1
        if m.ZOOMS[self.zoom] == 0:
            return max(2, len(str(int(self.grid.pages.max()) if self.grid.pages.size else 0))) + 2
        return 1

    def _ncells(self) -> int:
        if self.grid is None:
            return 0
        z = m.ZOOMS[self.zoom]
        return self.grid.cols if z == 0 else -(-self.grid.cols // z)

    def _sync(self) -> None:
        rows = 0 if self.grid is None else self.grid.rows + 1 + len(self._mark_lines)
        _grow_virtual(self, self._label_w() + self._ncells() * self._cell_w(), rows + 2)
        self.refresh()

    def show(self, grid: m.Grid | None, highlight: m.Cell | None, marks: StepMarks | None = None,
             empty: str = NO_PAGE_TABLE) -> None:
        """Draw a new step's grid (keeps the zoom unless auto-fit is on); `marks` are the cells the step's
        violations name, `highlight` the one walked to; `empty` is what a step without a page table says."""
        old = self._frame_key()
        if grid is None and empty != self.empty_text:
            self.empty_text = empty
            self._lines.clear()
            self.refresh()
        self.grid = grid
        self.highlight = highlight
        self.marks = marks or StepMarks()
        self._marked_cols = {}
        for mk in self.marks.marks:
            if mk.array in GRID_ARRAYS and mk.row is not None:
                self._marked_cols.setdefault(mk.row, []).append(mk.col)
        self._mark_lines = self._mark_rows() if grid is not None else []
        self._lines.clear()
        self._zoom_cache = None  # keyed by the grid's id, which a later grid may reuse
        if grid is not None and self._auto_fit:
            self.zoom = self._fit_index()
        if grid is not None and old is not None and old == self._frame_key():
            # Same shape, zoom and scroll: the border, column header and legend stay; only the rows (and the
            # `end` row of cu_seqlens) are repainted.
            sy = int(self.scroll_offset.y)
            # line y shows row sy + y - 1; `end` and the marked cells' lines after them
            bottom = min(self.size.height, grid.rows + 2 + len(self._mark_lines) - sy)
            if bottom > 1:
                self.refresh(Region(0, 1, self.size.width, bottom - 1))
        else:
            self._sync()
        if grid is not None and highlight is not None and highlight.row is not None:
            self.reveal(highlight)

    def _frame_key(self) -> tuple | None:
        """What the lines around the rows depend on (None: no grid)."""
        g = self.grid
        if g is None:
            return None
        return (g.rows, g.cols, self.zoom, self._cell_w(), self.size, int(self.scroll_offset.x),
                int(self.scroll_offset.y), self.virtual_size, len(self._mark_lines))

    def on_resize(self) -> None:
        """Fit again for the new width (a grid shown before the first layout was fitted to no width)."""
        if self.grid is not None and self._auto_fit:
            self.zoom = self._fit_index()
            self._lines.clear()
            self._sync()
            if self.highlight is not None and self.highlight.row is not None:
                self.reveal(self.highlight)

    def _fit_index(self) -> int:
        if self.grid is None:
            return 0
        width = max(4, self.size.width - self._label_w())
        num_w = max(2, len(str(int(self.grid.pages.max()) if self.grid.pages.size else 0))) + 2
        if self.grid.cols * num_w <= width:
            return 0
        return m.ZOOMS.index(m.fit_zoom(self.grid.cols, width))

    def reveal(self, cell: m.Cell) -> None:
        """Scroll the named cell into view."""
        y = (cell.row or 0)
        x = 0
        if cell.array == "page_table" and cell.col is not None:
            z = m.ZOOMS[self.zoom]
            x = (cell.col if z == 0 else cell.col // z) * self._cell_w()
        h = max(1, self.size.height - 2)
        w = max(1, self.size.width - self._label_w())
        sy = int(self.scroll_offset.y)
        sx = int(self.scroll_offset.x)
        ny = sy if sy <= y < sy + h else max(0, y - h // 2)
        nx = sx if sx <= x < sx + w - self._cell_w() else max(0, x - w // 2)
        self.scroll_to(x=nx, y=ny, animate=False, immediate=True)

    def action_zoom(self, d: int) -> None:
        """Zoom in (-1) or out (+1) one level."""
        self._auto_fit = False
        self.zoom = max(0, min(len(m.ZOOMS) - 1, self.zoom + d))
        self._sync()

    def action_fit(self) -> None:
        """Fit the widest row in the pane (and keep fitting on later steps)."""
        self._auto_fit = True
        self.zoom = self._fit_index()
        self._sync()

    def zoom_label(self) -> str:
        """What one character means now."""
        z = m.ZOOMS[self.zoom]
        return "page numbers" if z == 0 else f"{z} page{'s' if z > 1 else ''}/char"

    # -- drawing ---------------------------------------------------------------------------------

    def render_line(self, y: int) -> Strip:
        """Line 0: header; then one line per row; the last: the cu_seqlens end values; then the legend.
        Lines are cached per grid, zoom, scroll and highlight: a repaint of an unchanged grid costs nothing."""
        key = (id(self.grid), self.zoom, int(self.scroll_offset.x), int(self.scroll_offset.y), y, self.size.width,
               self.highlight, id(self.marks))
        got = self._lines.get(key)
        if got is None:
            if len(self._lines) > 512:
                self._lines.clear()
            got = self._lines[key] = self._render_line(y)
        return got

    def _render_line(self, y: int) -> Strip:
        width = self.size.width
        g = self.grid
        if g is None:
            sty = _S_DIM if self.empty_text == NO_PAGE_TABLE else _S_NOTE
            return Strip([Segment(self.empty_text.ljust(width)[:width], sty)], width) if y == 0 \
                else Strip.blank(width)
        lw = self._label_w()
        cw = self._cell_w()
        z = m.ZOOMS[self.zoom]
        sx = int(self.scroll_offset.x)
        gw = max(0, width - lw)
        if y == 0:
            label = f"{'row':>3} {'req':>5} {'cache_sl':>8} {'cu_q':>5} {'cu_k':>6} "
            segs = [Segment(label.ljust(lw)[:lw], _S_HEAD)]
            head = []
            for c in range(self._ncells()):
                first = c if z == 0 else c * max(1, z)
                tick = (z == 0) or (c % 10 == 0)
                lab = str(first) if tick else ""
                head.append(lab.rjust(cw)[:cw] if z == 0 else (lab if tick else " "))
            htxt = "".join(head) if z == 0 else _ticks(self._ncells(), z)
            segs.append(Segment(htxt[sx:sx + gw].ljust(gw), _S_HEAD))
            return Strip(segs, width)
        r = int(self.scroll_offset.y) + y - 1
        if r == g.rows:
            # cu_seqlens have rows+1 entries: the last one (the token totals) sits under the last row.
            q = _at(g.cu_seqlens_q, r)
            k = _at(g.cu_seqlens_k, r)
            segs = [Segment(f"{'end':>3} {'':>5} {'':>8} ", _S_DIM)]
            for name, val, w in (("cu_seqlens_q", q, 5), ("cu_seqlens_k", k, 6)):
                segs.extend(self._seqlens_segs(name, r, val, w, _S_DIM))
            return Strip(segs).crop_extend(0, width, None)
        nm = len(self._mark_lines)
        if g.rows < r <= g.rows + nm:
            return Strip(self._mark_lines[r - g.rows - 1]).crop_extend(0, width, None)
        if r == g.rows + nm + 1:
            return Strip(self._legend(width)).crop_extend(0, width, None)
        if r > g.rows + nm + 1:
            return Strip.blank(width)
        rid = g.request_ids[r]
        label_style = _S_DIM if r >= g.live_rows else Style()
        segs = [Segment(f"{r:>3} ", label_style), Segment(f"{'pad' if rid is None else rid:>5} ", label_style)]
        for name, arr, w in (("cache_seqlens", g.cache_seqlens, 8), ("cu_seqlens_q", g.cu_seqlens_q, 5),
                             ("cu_seqlens_k", g.cu_seqlens_k, 6)):
            segs.extend(self._seqlens_segs(name, r, _at(arr, r), w, label_style))
        used = sum(len(s.text) for s in segs)
        segs.append(Segment(" " * max(0, lw - used)))
        # Only the columns in view (a 100k-token row is hundreds of cells), one run per stretch of one style.
        c0 = sx // cw
        runs: list[list] = []
        if z == 0:
            c1 = min(g.cols, -(-(sx + gw) // cw))
            kinds, pages = g.cls[r, c0:c1].tolist(), g.pages[r, c0:c1].tolist()
            for c, (k, page) in enumerate(zip(kinds, pages, strict=True), c0):
                sty = self._cell_style(k, r, c)
                txt = f"{page}{m.SYMBOLS[k]}".rjust(cw - 1) + " "
                if runs and runs[-1][1] is sty:
                    runs[-1][0] += txt
                else:
                    runs.append([txt, sty])
        else:
            cls, first_col = self._zoomed(g, z)
            c1 = min(cls.shape[1], sx + gw)
            for c, k in enumerate(cls[r, c0:c1].tolist(), c0):
                sty = self._cell_style(k, r, int(first_col[c]), z)
                if runs and runs[-1][1] is sty:
                    runs[-1][0] += m.SYMBOLS[k]
                else:
                    runs.append([m.SYMBOLS[k], sty])
        segs.extend(_crop([Segment(t, sty) for t, sty in runs], sx - c0 * cw, gw))
        return Strip(segs, width) if width >= lw else Strip(segs).crop(0, width)

    def _zoomed(self, grid: m.Grid, z: int) -> tuple[np.ndarray, np.ndarray]:
        """The zoomed-out classes of `grid`, computed once per grid and zoom (not once per drawn line)."""
        key = (id(grid), z)
        if self._zoom_cache is None or self._zoom_cache[0] != key:
            self._zoom_cache = (key, m.zoom_cells(grid, z))
        return self._zoom_cache[1]

    def _seqlens_segs(self, name: str, r: int, text: str, w: int, base: Style) -> list[Segment]:
        """One seqlens entry and the character after it: `✗` (`◇` related) when a violation names it."""
        got = self.marks.seqlens(name, r)
        hl = self.highlight
        if not got:
            hit = hl is not None and hl.array == name and hl.row == r
            return [Segment(f"{text:>{w}}", _S_HIT if hit else base), Segment(" ")]
        focus = any(self.marks.is_focus(mk) for mk in got)
        return [Segment(f"{text:>{w}}", _S_HIT if focus else _S_MARK), Segment(symbol(got[0]), _S_MARK)]

    def _mark_rows(self) -> list[list[Segment]]:
        """A line per marked cell of this pane (grid and seqlens): found vs expected as text, the ids that name it."""
        by: dict[tuple[str, int | None, int | None], list[CellMark]] = {}
        for mk in self.marks.marks:
            if mk.array in GRID_ARRAYS or mk.array in SEQLENS_ARRAYS:
                by.setdefault((mk.array, mk.row, mk.col), []).append(mk)
        out = []
        for got in by.values():
            mk = got[0]
            ids = " ".join(dict.fromkeys(x.check_id for x in got))
            focus = any(self.marks.is_focus(x) for x in got)
            out.append([Segment(f"{symbol(mk)} {marks_cell(mk)} = {mark_text(mk)}", _S_MARK_FOCUS if focus else
                                _S_MARK), Segment(f"  {ids}", _S_MARK_TEXT)])
        return out

    def _cell_style(self, k: int, r: int, col: int, z: int = 1) -> Style:
        hl = self.highlight
        base = _KIND_STYLES[k]
        if hl is not None and hl.array in ("page_table", "req_to_token_page_starts") and hl.row == r and (
                hl.col is None or col <= hl.col < col + max(1, z)):
            return _S_CELL_HIT
        cols = self._marked_cols.get(r)
        if cols is not None and any(c is None or col <= c < col + max(1, z) for c in cols):
            return base + _S_CELL_MARK
        if hl is not None and hl.array == "request" and hl.row == r:
            return base + Style(underline=True)
        return base

    def _legend(self, width: int) -> list[Segment]:
        segs = []
        for k, name in enumerate(m.CLASS_NAMES):
            segs.append(Segment(m.SYMBOLS[k], _KIND_STYLES[k]))
            segs.append(Segment(f" {name}  ", _S_DIM))
        segs.append(Segment(f"[{self.zoom_label()}; +/- zoom, f fit]", _S_DIM))
        return segs


def _grow_virtual(w: ScrollView, width: int, height: int) -> None:
    """Grow a pane's virtual size (never shrink it, widths in steps of 32): each change costs a whole-screen
    layout pass, which was most of a step's time when every step changed it a little. A smaller step just
    leaves blank room to scroll into."""
    cur = w.virtual_size
    nw = cur.width if width <= cur.width else -(-width // 32) * 32
    nh = max(cur.height, height)
    if (nw, nh) != (cur.width, cur.height):
        w.virtual_size = Size(nw, nh)


def _merge(segs: list[Segment]) -> list[Segment]:
    """Adjacent segments of one style as one: a grid line is hundreds of cells but a few runs."""
    out: list[Segment] = []
    for seg in segs:
        if out and out[-1].style == seg.style:
            out[-1] = Segment(out[-1].text + seg.text, seg.style)
        else:
            out.append(seg)
    return out


def _ticks(ncells: int, z: int) -> str:
    out = [" "] * ncells
    for c in range(0, ncells, 10):
        lab = str(c * z)
        for k, ch in enumerate(lab):
            if c + k < ncells:
                out[c + k] = ch
    return "".join(out)


def _at(arr: Sequence[int], i: int) -> str:
    try:
        return str(int(arr[i]))
    except (TypeError, IndexError):
        return "-"


def _crop(cells: Sequence[Segment], start: int, width: int) -> list[Segment]:
    """Cells `start` to `start + width` of a run of one-cell-per-character segments, padded to `width`."""
    out, x = [], 0
    end = start + width
    for seg in cells:
        n = len(seg.text)
        if x + n > start and x < end:
            a, b = max(0, start - x), min(n, end - x)
            out.append(Segment(seg.text[a:b], seg.style))
        x += n
        if x >= end:
            break
    used = sum(len(s.text) for s in out)
    if used < width:
        out.append(Segment(" " * (width - used)))
    return out


def violation_label(v: Violation) -> Text:
    """A tree leaf that fits the side column: step, request, and the cell with found vs expected (the step pane has
    the whole message); a violation without a cell shows the start of its message."""
    where = f"s{v.step}" + (f" r{v.request_id}" if v.request_id is not None else "")
    if v.array is not None and v.found is not None:
        idx = [str(x) for x in (v.row, v.col) if x is not None]
        cell = f"{v.array}[{','.join(idx)}]" if idx else v.array
        what = f"{cell} {v.found}" + (f"≠{v.expected}" if v.expected is not None else "")
    else:
        what = short_message(v)
    return Text.assemble((f"{where} ", "bold"), (what, ""))


class ViolationsPanel(Tree[Violation]):
    """Violations grouped by invariant; selecting one jumps to its step and highlights its cell."""

    BINDINGS = [Binding("j", "cursor_down", show=False), Binding("k", "cursor_up", show=False)]

    class Jump(Message):
        """The user picked a violation."""

        def __init__(self, violation: Violation) -> None:
            super().__init__()
            self.violation = violation

    MAX_PER_GROUP = 200

    def __init__(self, **kw: Unpack[WidgetArgs]) -> None:
        super().__init__("violations", **kw)
        self.show_root = False
        self._version = -1

    def fill(self, groups: list[tuple[str, list[Violation]]], version: int, descriptions: dict[str, str],
             current_step: int) -> None:
        """Rebuild the tree when the violation index changed."""
        if version == self._version:
            return
        self._version = version
        self.clear()
        if not groups:
            self.root.add_leaf(Text("no violations", style="grey50"))
            return
        # The cursor starts on the first violation at or after the current step (Tree's cursor is on no line after
        # a rebuild, so the first Enter would do nothing), and that violation's group is open.
        first = min((v for _, vs in groups for v in vs if v.step >= current_step),
                    key=lambda v: v.step, default=groups[0][1][0])
        at_cursor = None
        for cid, vs in groups:
            sev = vs[0].severity.value
            label = Text()
            label.append(f"{cid} ", style="bold #ff5f5f" if sev == "error" else "bold #ffaf00")
            label.append(f"×{len(vs)} ", style="bold")
            label.append(descriptions.get(cid, ""), style="grey62")
            node = self.root.add(label, expand=len(groups) <= 3 or cid == first.check_id)
            for v in vs[: self.MAX_PER_GROUP]:
                leaf = node.add_leaf(violation_label(v), data=v)
                if v is first:
                    at_cursor = leaf
            if len(vs) > self.MAX_PER_GROUP:
                node.add_leaf(Text(f"… {len(vs) - self.MAX_PER_GROUP} more (n / N walk them all)", style="grey50"))
        self.call_after_refresh(self._place_cursor, at_cursor)

    def _place_cursor(self, node: TreeNode[Violation] | None) -> None:
        if node is not None and node.line >= 0:
            self.move_cursor(node)
        elif self.cursor_line < 0 and self.last_line >= 0:
            self.cursor_line = 0

    def on_focus(self) -> None:
        """Enter works at once: a focused tree always has a cursor line."""
        if self.cursor_line < 0 and self.last_line >= 0:
            self.cursor_line = 0

    def on_tree_node_selected(self, event: Tree.NodeSelected) -> None:
        """Jump to a picked violation."""
        v = event.node.data
        if isinstance(v, Violation):
            self.post_message(self.Jump(v))


class ChainPanel(TextPane):
    """The draft chain of the verify this step belongs to: accepted tokens marked ✓, rejected ✗, bonus +."""

    def show(self, verify: Step | None, byte_level: bool, here: int) -> None:
        """Draw the chains of a verify step's rows."""
        if verify is None:
            self.update(Lines("no verify step in this iteration", style="grey50"))
            return
        t = Lines()
        t.append(f"verify step {verify.index}" + (" (this step)" if verify.index == here else "") + "\n",
                 style="bold")
        by_count = any(r.draft_tokens and not r.accepted_tokens and r.accept_length for r in verify.requests)
        room = (max(1, self.size.height - 2) if self.size.height else 8) - by_count
        shown = verify.requests if len(verify.requests) <= room else verify.requests[: room - 1]
        for r in shown:
            t.append(f"r{r.request_id:<3} ", style="bold")
            t.append("● ", style="grey62")
            for link in m.draft_chain(r.draft_tokens, r.accepted_tokens, r.accept_length):
                tok = m.token_text(link.token, byte_level)
                if link.bonus:
                    t.append(f"+{tok} ", style="bold cyan")
                elif link.accepted:
                    t.append(f"{tok}✓ ", style="bold green")
                else:
                    t.append(f"{tok}✗ ", style="red")
            t.append(f" acc {r.accept_length}\n", style="grey62")
        if len(shown) < len(verify.requests):
            t.append(f"… {len(verify.requests) - len(shown)} more rows (the requests table has them all)\n",
                     style="grey50")
        if by_count:  # the backend saw accept lengths, not tokens: ✓ / ✗ are counted, not compared
            t.append("tokens not recorded: ✓ by accept len", style=_S_NOTE)
        self.update(t)


class AcceptPanel(TextPane):
    """Acceptance per draft position: the whole run and a window of steps around the current one."""

    def show(self, run_hist: Sequence[int] | None, window_hist: Sequence[int], window: tuple[int, int]) -> None:
        """Draw two columns of per-position bars."""
        t = Lines()
        w = 10
        run_rates = m.accept_by_position(run_hist) if run_hist else []
        win_rates = m.accept_by_position(window_hist)
        mr = m.mean_accept(run_hist) if run_hist else None
        mw = m.mean_accept(window_hist)
        t.append(f"{'pos':<4}{'run':<{w + 6}}steps {window[0]}–{window[1]}\n", style="bold")
        for j in range(max(len(run_rates), len(win_rates))):
            a = run_rates[j] if j < len(run_rates) else None
            b = win_rates[j] if j < len(win_rates) else None
            t.append(f"d{j:<3}")
            t.append(m.bar(a or 0.0, w), style="green")
            t.append(f"{'' if a is None else f'{a:.2f}':>5} ")
            t.append(m.bar(b or 0.0, w), style="cyan")
            t.append(f"{'' if b is None else f'{b:.2f}':>5}\n")
        t.append(f"accept len  run {'-' if mr is None else f'{mr:.2f}'}  window {'-' if mw is None else f'{mw:.2f}'}",
                 style="grey70")
        if run_hist is None:
            t.append("  (run totals loading…)", style="grey50")
        self.update(t)
