"""The side column's violations tree, grouped by invariant."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from specscope.tracer.schema import Violation
from textual.binding import Binding
from textual.message import Message
from textual.widgets import Tree
from textual.widgets.tree import TreeNode

from .lines import WidgetArgs
from .marks import (
    short_message,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack


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

    def on_tree_node_selected(self, event: Tree.NodeSelected[Violation]) -> None:
        """Jump to a picked violation."""
        v = event.node.data
        if isinstance(v, Violation):
            self.post_message(self.Jump(v))
