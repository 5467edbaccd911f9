"""Styles and segment helpers the panes draw with (shared by the step list, requests table and page grid)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.segment import Segment
from rich.style import Style
from textual.geometry import Size
from textual.scroll_view import ScrollView

from . import model as m

if TYPE_CHECKING:
    pass


S_CURSOR = Style(bgcolor="#2b4f8a", bold=True)
S_ERR = Style(color="#ff5f5f", bold=True)
S_WARN = Style(color="#ffaf00")
S_DIM = Style(color="grey50")
S_HEAD = Style(color="grey70", bold=True, underline=True)
S_HIT = Style(color="black", bgcolor="#ffff5f", bold=True, blink=False)
S_CELL_HIT = Style(color="black", bgcolor="#ffff5f", bold=True, underline=True)
KIND_STYLES = tuple(Style.parse(x) for x in m.STYLES)
S_TABLE_HEAD = Style(bold=True, color="grey85", bgcolor="#1c3a5e")
S_ROW_CUR = Style(bgcolor="#23334a")
S_MARK = Style(color="#ff5f5f", bold=True, underline=True)
S_MARK_FOCUS = Style(color="black", bgcolor="#ffff5f", bold=True, underline=True)
S_MARK_TEXT = Style(color="#ff8787")
S_NOTE = Style(color="#ffaf00", italic=True)  # what the recording could not record
S_CELL_MARK = Style(underline=True, bold=True, reverse=True)


def grow_virtual(w: ScrollView, width: int, height: int) -> None:
    """Grow a pane's virtual size (never shrink it, widths in steps of 32): each change costs a whole-screen
    layout pass, which was most of a step's time when every step changed it a little. A smaller step just
    leaves blank room to scroll into."""
    cur = w.virtual_size
    nw = cur.width if width <= cur.width else -(-width // 32) * 32
    nh = max(cur.height, height)
    if (nw, nh) != (cur.width, cur.height):
        w.virtual_size = Size(nw, nh)


def merge_runs(segs: list[Segment]) -> list[Segment]:
    """Adjacent segments of one style as one: a grid line is hundreds of cells but a few runs."""
    out: list[Segment] = []
    for seg in segs:
        if out and out[-1].style == seg.style:
            out[-1] = Segment(out[-1].text + seg.text, seg.style)
        else:
            out.append(seg)
    return out



def crop_cells(cells: Sequence[Segment], start: int, width: int) -> list[Segment]:
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
