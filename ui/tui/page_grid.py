"""The page-table grid: request × logical page → physical page, classified, with the seqlens beside it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.segment import Segment
from rich.style import Style
from specscope.ui.views import Cell, CellMark
from textual.binding import Binding
from textual.geometry import Region
from textual.scroll_view import ScrollView
from textual.strip import Strip

from . import model as m
from .lines import WidgetArgs
from .marks import (
    GRID_ARRAYS,
    SEQLENS_ARRAYS,
    StepMarks,
    mark_text,
    symbol,
)
from .marks import cell_name as marks_cell
from .pane_style import (
    KIND_STYLES,
    S_CELL_HIT,
    S_CELL_MARK,
    S_DIM,
    S_HEAD,
    S_HIT,
    S_MARK,
    S_MARK_FOCUS,
    S_MARK_TEXT,
    S_NOTE,
    crop_cells,
    grow_virtual,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack


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
        self.highlight: Cell | None = None
        self.marks = StepMarks()
        self._marked_cols: dict[int, list[int | None]] = {}  # row -> page-table columns marked (None: whole row)
        self._mark_lines: list[list[Segment]] = []
        self._auto_fit = True
        self._zoom_cache: tuple[tuple[int, int], tuple[np.ndarray, np.ndarray]] | None = None
        self._lines: dict[tuple[object, ...], Strip] = {}
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
        grow_virtual(self, self._label_w() + self._ncells() * self._cell_w(), rows + 2)
        self.refresh()

    def show(self, grid: m.Grid | None, highlight: Cell | None, marks: StepMarks | None = None,
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

    def _frame_key(self) -> tuple[object, ...] | None:
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

    def reveal(self, cell: Cell) -> None:
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
            sty = S_DIM if self.empty_text == NO_PAGE_TABLE else S_NOTE
            return Strip([Segment(self.empty_text.ljust(width)[:width], sty)], width) if y == 0 \
                else Strip.blank(width)
        lw = self._label_w()
        cw = self._cell_w()
        z = m.ZOOMS[self.zoom]
        sx = int(self.scroll_offset.x)
        gw = max(0, width - lw)
        if y == 0:
            label = f"{'row':>3} {'req':>5} {'cache_sl':>8} {'cu_q':>5} {'cu_k':>6} "
            segs = [Segment(label.ljust(lw)[:lw], S_HEAD)]
            head = []
            for c in range(self._ncells()):
                first = c if z == 0 else c * max(1, z)
                tick = (z == 0) or (c % 10 == 0)
                lab = str(first) if tick else ""
                head.append(lab.rjust(cw)[:cw] if z == 0 else (lab if tick else " "))
            htxt = "".join(head) if z == 0 else _ticks(self._ncells(), z)
            segs.append(Segment(htxt[sx:sx + gw].ljust(gw), S_HEAD))
            return Strip(segs, width)
        r = int(self.scroll_offset.y) + y - 1
        if r == g.rows:
            # cu_seqlens have rows+1 entries: the last one (the token totals) sits under the last row.
            q = _at(g.cu_seqlens_q, r)
            k = _at(g.cu_seqlens_k, r)
            segs = [Segment(f"{'end':>3} {'':>5} {'':>8} ", S_DIM)]
            for name, val, w in (("cu_seqlens_q", q, 5), ("cu_seqlens_k", k, 6)):
                segs.extend(self._seqlens_segs(name, r, val, w, S_DIM))
            return Strip(segs).crop_extend(0, width, None)
        nm = len(self._mark_lines)
        if g.rows < r <= g.rows + nm:
            return Strip(self._mark_lines[r - g.rows - 1]).crop_extend(0, width, None)
        if r == g.rows + nm + 1:
            return Strip(self._legend(width)).crop_extend(0, width, None)
        if r > g.rows + nm + 1:
            return Strip.blank(width)
        rid = g.request_ids[r]
        label_style = S_DIM if r >= g.live_rows else Style()
        segs = [Segment(f"{r:>3} ", label_style), Segment(f"{'pad' if rid is None else rid:>5} ", label_style)]
        for name, arr, w in (("cache_seqlens", g.cache_seqlens, 8), ("cu_seqlens_q", g.cu_seqlens_q, 5),
                             ("cu_seqlens_k", g.cu_seqlens_k, 6)):
            segs.extend(self._seqlens_segs(name, r, _at(arr, r), w, label_style))
        used = sum(len(s.text) for s in segs)
        segs.append(Segment(" " * max(0, lw - used)))
        # Only the columns in view (a 100k-token row is hundreds of cells), one run per stretch of one style.
        c0 = sx // cw
        runs: list[list[Any]] = []  # [text, style] pairs, the text grown in place
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
        segs.extend(crop_cells([Segment(t, sty) for t, sty in runs], sx - c0 * cw, gw))
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
            return [Segment(f"{text:>{w}}", S_HIT if hit else base), Segment(" ")]
        focus = any(self.marks.is_focus(mk) for mk in got)
        return [Segment(f"{text:>{w}}", S_HIT if focus else S_MARK), Segment(symbol(got[0]), S_MARK)]

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
            out.append([Segment(f"{symbol(mk)} {marks_cell(mk)} = {mark_text(mk)}", S_MARK_FOCUS if focus else
                                S_MARK), Segment(f"  {ids}", S_MARK_TEXT)])
        return out

    def _cell_style(self, k: int, r: int, col: int, z: int = 1) -> Style:
        hl = self.highlight
        base = KIND_STYLES[k]
        if hl is not None and hl.array in ("page_table", "req_to_token_page_starts") and hl.row == r and (
                hl.col is None or col <= hl.col < col + max(1, z)):
            return S_CELL_HIT
        cols = self._marked_cols.get(r)
        if cols is not None and any(c is None or col <= c < col + max(1, z) for c in cols):
            return base + S_CELL_MARK
        if hl is not None and hl.array == "request" and hl.row == r:
            return base + Style(underline=True)
        return base

    def _legend(self, width: int) -> list[Segment]:
        segs = []
        for k, name in enumerate(m.CLASS_NAMES):
            segs.append(Segment(m.SYMBOLS[k], KIND_STYLES[k]))
            segs.append(Segment(f" {name}  ", S_DIM))
        segs.append(Segment(f"[{self.zoom_label()}; +/- zoom, f fit]", S_DIM))
        return segs



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
