"""The step list: every step of the trace, one virtualized row each."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.segment import Segment
from rich.style import Style
from specscope.tracer.schema import ForwardMode, StepSummary
from specscope.ui.views import fmt_ns
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.reactive import var
from textual.scroll_view import ScrollView
from textual.strip import Strip

from .lines import WidgetArgs
from .marks import (
    tk_flagged,
)
from .pane_style import S_CURSOR, S_ERR, S_HEAD, S_WARN
from .source import TraceSource

if TYPE_CHECKING:
    from typing_extensions import Unpack


MODE_SHORT = {"EXTEND": "extend", "DECODE": "decode", "DRAFT_DECODE": "draft", "TARGET_VERIFY": "verify",
              "DRAFT_EXTEND": "d-ext"}
GRAPH_SHORT = {"eager": "E", "capture": "C", "replay": "R"}


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
                f" {g} {tk:<5} {fmt_ns(s.duration_ns, compact=True):>7} {v}")
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

    cursor: var[int] = var(0, init=False)  # the highlighted row; `watch_cursor` keeps it in view

    def __init__(self, source: TraceSource, **kw: Unpack[WidgetArgs]) -> None:
        super().__init__(**kw)
        self.source = source

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

    def watch_cursor(self, old: int, i: int) -> None:
        """Keep the highlighted row in view (centred when it jumps); without a scroll only the two rows that
        changed are redrawn."""
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
            self.cursor = row
            self.post_message(self.Picked(i))

    def render_line(self, y: int) -> Strip:
        """Header on line 0, then one summary per line."""
        width = self.size.width
        if y == 0:
            return Strip([Segment(step_header_text(width).ljust(width)[:width], S_HEAD)], width)
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
            style = S_ERR if s.num_errors or any(v.severity.value == "error" for v in here) else S_WARN
        elif s.mode == ForwardMode.TARGET_VERIFY:
            style = Style(color="#87d7ff")
        elif s.model == "draft":
            style = Style(color="#d7d7af")
        if row == self.cursor:
            style = style + S_CURSOR
        return Strip([Segment(text, style)], width)

    def on_click(self, event: events.Click) -> None:
        """Pick the clicked row."""
        off = event.get_content_offset(self)
        if off is not None and off.y >= 1:
            i = self.source.index_at(int(self.scroll_offset.y) + off.y - 1)
            if i is not None:
                self.post_message(self.Picked(i))
