"""Panes drawn line by line from runs of (text, style): no Rich `Text` or Textual `Content` is built, wrapped and
divided on every repaint, and an update repaints only the lines whose runs changed.

A step move rewrote ~40 lines of these panes; through `render()` each cost a Text → Content conversion, a wrap
and a full-pane repaint (border title included), about a third of the frame.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, TypedDict

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget

if TYPE_CHECKING:
    from typing_extensions import Unpack

ELLIPSIS = "…"


@lru_cache(maxsize=1024)
def parse_style(spec: str) -> Style:
    """A parsed Rich style, parsed once per spelling."""
    return Style.parse(spec)


class Lines:
    """Styled lines built like `rich.text.Text`: `append(text, style)`; a newline in the text starts a line."""

    __slots__ = ("rows",)

    def __init__(self, text: str = "", style: str | Style | None = None) -> None:
        self.rows: list[list[Segment]] = [[]]
        if text:
            self.append(text, style)

    def append(self, text: str, style: str | Style | None = None) -> Lines:
        """Add a run of text in one style (a string is parsed once and cached)."""
        st = parse_style(style) if isinstance(style, str) else style
        rows = self.rows
        for k, part in enumerate(text.split("\n") if "\n" in text else (text,)):
            if k:
                rows.append([])
            if part:
                row = rows[-1]
                if row and row[-1].style == st:  # one run per style: fewer segments to crop, filter and chop
                    row[-1] = Segment(row[-1].text + part, st)
                else:
                    row.append(Segment(part, st))
        return self

    @property
    def plain(self) -> str:
        """The text without styles."""
        return "\n".join("".join(seg.text for seg in row) for row in self.rows)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Lines) and self.rows == other.rows

    __hash__ = None  # type: ignore[assignment]  # Python's way to say unhashable (mutable, with __eq__)


def fit(segments: list[Segment], width: int, base: Style, ellipsis: bool = True) -> Strip:
    """One line as a strip exactly `width` cells wide in the widget's base style; a longer line is cut, its last
    cell an ellipsis (the panes' `text-overflow: ellipsis`); the room after a short one is blank background, as
    Textual pads its own text."""
    segs = [Segment(s.text, base + s.style if s.style is not None else base) for s in segments]
    strip = Strip(segs)
    n = strip.cell_length
    if n > width and ellipsis and width > 0:
        strip = strip.crop(0, width - 1)
        last = segs[-1].style if segs else base
        for seg in reversed(list(strip)):
            if seg.text:
                last = seg.style
                break
        return Strip([*strip, Segment(ELLIPSIS, last)], width)
    if n < width:
        return Strip([*strip, Segment(" " * (width - n), _background(base))], width)
    return strip.crop(0, width)


@lru_cache(maxsize=64)
def _background(base: Style) -> Style:
    return Style(bgcolor=base.bgcolor)


class WidgetArgs(TypedDict, total=False):
    """The keyword arguments every Textual widget (and so every pane here) passes on to Textual."""

    name: str | None
    id: str | None
    classes: str | None
    disabled: bool


class LinePane(Widget):
    """A fixed-size pane of styled lines (see `Lines`). `update` diffs the new lines against the shown ones and
    repaints only those that differ; the pane never needs a layout pass."""

    def __init__(self, text: Lines | str = "", **kw: Unpack[WidgetArgs]) -> None:
        super().__init__(**kw)
        self._lines = text if isinstance(text, Lines) else Lines(text)
        self._strips: dict[int, Strip] = {}
        self._strips_key: tuple[object, ...] = ()
        self._base: Style | None = None

    @property
    def plain(self) -> str:
        """What the pane shows, without styles."""
        return self._lines.plain

    def update(self, text: Lines | str) -> None:
        """Replace the lines; repaint the ones that changed (nothing when none did)."""
        new = text if isinstance(text, Lines) else Lines(text)
        old_rows, rows = self._lines.rows, new.rows
        if old_rows == rows:
            return
        self._lines = new
        if not self.is_mounted or not self.size.width:
            self._strips.clear()
            self.refresh()
            return
        width = self.size.width
        y, n = 0, max(len(old_rows), len(rows))
        while y < n:
            if y < len(old_rows) and y < len(rows) and old_rows[y] == rows[y]:
                y += 1
                continue
            start = y
            while y < n and not (y < len(old_rows) and y < len(rows) and old_rows[y] == rows[y]):
                self._strips.pop(y, None)
                y += 1
            self.refresh(Region(0, start, width, y - start))

    def notify_style_update(self) -> None:
        """The CSS (or theme) changed: the base style with it."""
        self._base = None
        super().notify_style_update()

    def render_line(self, y: int) -> Strip:
        """Line `y` of the pane, cut (with an ellipsis) or padded to the pane's width."""
        width = self.size.width
        if self._base is None:
            # Textual recomputes `rich_style` (a walk over the ancestors) after every refresh: once per CSS change.
            self._base = self.rich_style
        key = (width, self._base)
        if key != self._strips_key:
            self._strips.clear()
            self._strips_key = key
        got = self._strips.get(y)
        if got is None:
            rows = self._lines.rows
            base = self._base
            got = fit(rows[y], width, base) if y < len(rows) else Strip.blank(width, _background(base))
            self._strips[y] = got
        return got


def text_width(text: str) -> int:
    """Cells a string takes (ASCII fast path)."""
    return len(text) if text.isascii() else cell_len(text)


class TextPane(LinePane):
    """A pane of styled lines with a fixed size: updating it repaints the changed lines only, without a layout
    pass (which costs a whole-screen relayout per step with auto-sized panes)."""

