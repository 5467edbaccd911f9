"""The first thing the step view shows: every violation of the current step in full (wrapped, never cut), each
with the cells it names and found vs expected as text, the one `n` / `N` walked to marked `▶`."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.segment import Segment
from rich.style import Style
from specscope.tracer.schema import Violation
from textual.binding import Binding
from textual.geometry import Size
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from .lines import WidgetArgs
from .marks import StepMarks, cell_name, mark_text, short_message, symbol

if TYPE_CHECKING:
    from typing_extensions import Unpack

_S_ERR = Style(color="#ff5f5f", bold=True)
_S_WARN = Style(color="#ffaf00", bold=True)
_S_FOCUS = Style(color="black", bgcolor="#ffff5f", bold=True)
_S_MSG = Style()
_S_REL = Style(color="#87afff")
_S_DIM = Style(color="grey50")
MAX_LINES = 12  # the pane's tallest (without its border); more lines scroll


class StepViolations(ScrollView, can_focus=True):
    """The current step's violations; shown only on a step that has some (`count`)."""

    BINDINGS = [Binding("j,down", "scroll_down", show=False), Binding("k,up", "scroll_up", show=False)]

    count: reactive[int] = reactive(0, layout=True)
    """Violations of the step shown (0 hides the pane)."""

    def __init__(self, **kw: Unpack[WidgetArgs]) -> None:
        super().__init__(**kw)
        self.violations: tuple[Violation, ...] = ()
        self.marks = StepMarks()
        self.step = -1
        self.max_lines = MAX_LINES
        self._rows: list[list[Segment]] = []
        self._width = -1

    def watch_count(self, count: int) -> None:
        """A clean step has nothing to say here: the pane goes."""
        self.display = count > 0

    def show(self, step: int, violations: Sequence[Violation], marks: StepMarks) -> None:
        """Draw step `step`'s violations; the one `marks.focus` names is marked and scrolled into view."""
        self.step, self.violations, self.marks = step, tuple(violations), marks
        self.count = len(self.violations)
        self._width = -1
        self._layout_rows()

    def on_resize(self) -> None:
        """Wrap again for the new width."""
        self._width = -1
        self._layout_rows()

    def _layout_rows(self) -> None:
        width = max(20, self.size.width or 80)
        if width == self._width:
            return
        self._width = width
        rows: list[list[Segment]] = []
        focus_at = 0
        for k, v in enumerate(self.violations):
            focused = self.marks.focus is not None and v is self.marks.focus
            if focused:
                focus_at = len(rows)
            sev = _S_ERR if v.severity.value == "error" else _S_WARN
            head = f"{'▶' if focused else ' '} {k + 1}/{len(self.violations)} {v.check_id} {v.severity.value}"
            own = [mk for mk in self.marks.marks if mk.check_id == v.check_id and mk.message == v.message]
            cells = "; ".join(f"{symbol(mk)} {cell_name(mk)} = {mark_text(mk)}" for mk in own)
            first = [Segment(head, _S_FOCUS if focused else sev)]
            rows.extend(self._wrap(first, cells, width, _S_REL if own and own[0].is_related else _S_MSG))
            for line in textwrap.wrap(short_message(v), max(10, width - 4)) or [""]:
                rows.append([Segment("    " + line, _S_MSG)])
        self._rows = rows
        lines = len(rows)
        self.virtual_size = Size(width, lines)
        # Fits the violations up to max_lines: a layout pass only when that height changes.
        self.styles.height = min(lines, self.max_lines) + 1  # the border's line
        if self.marks.focus is not None:
            h = max(1, self.size.height - 1)
            top = int(self.scroll_offset.y)
            if not top <= focus_at < top + h - 1:
                self.scroll_to(y=focus_at, animate=False, immediate=True)
        self.refresh()

    @staticmethod
    def _wrap(head: list[Segment], text: str, width: int, style: Style) -> list[list[Segment]]:
        """`head` then `text` wrapped after it (continuation lines indented)."""
        used = sum(len(s.text) for s in head) + 1
        if not text:
            return [head]
        parts = textwrap.wrap(text, max(10, width - used)) or [""]
        out = [[*head, Segment(" "), Segment(parts[0], style)]]
        rest = " ".join(parts[1:])
        for line in textwrap.wrap(rest, max(10, width - 4)) if rest else []:
            out.append([Segment("    " + line, style)])
        return out

    def render_line(self, y: int) -> Strip:
        """One wrapped line from the scroll position."""
        width = self.size.width
        r = int(self.scroll_offset.y) + y
        if not 0 <= r < len(self._rows):
            return Strip.blank(width)
        return Strip(self._rows[r]).crop_extend(0, width, None)

    @property
    def plain(self) -> str:
        """Every line as text (for tests)."""
        return "\n".join("".join(s.text for s in row) for row in self._rows)
