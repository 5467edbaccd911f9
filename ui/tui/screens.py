"""Modal screens: a one-line prompt (go to, search, breakpoints) and the help screen."""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Input, Static


class PromptScreen(ModalScreen[str | None]):
    """Ask for one line; `validate` returns an error sentence (kept open) or None (accepted)."""

    BINDINGS = [Binding("escape", "cancel", "cancel")]

    def __init__(self, title: str, hint: str, value: str = "",
                 validate: Callable[[str], str | None] | None = None) -> None:
        super().__init__()
        self.title_text, self.hint, self.value, self.validate_fn = title, hint, value, validate

    def compose(self) -> ComposeResult:
        """Title, input, hint, error line."""
        with Vertical():
            yield Static(Text(self.title_text, style="bold"))
            yield Input(value=self.value, id="prompt")
            yield Static(self.hint, id="hint")
            yield Static("", id="error")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """Validate and close."""
        text = event.value.strip()
        if self.validate_fn is not None:
            err = self.validate_fn(text)
            if err:
                self.query_one("#error", Static).update(err)
                return
        self.dismiss(text)

    def action_cancel(self) -> None:
        """Close without an answer."""
        self.dismiss(None)


class HelpScreen(ModalScreen[None]):
    """Every key, grouped; `?`, F1 or Escape closes it."""

    BINDINGS = [Binding("escape,question_mark,f1,q", "close", "close")]

    def __init__(self, sections: list[tuple[str, list[tuple[str, str]]]], notes: list[str] | None = None) -> None:
        super().__init__()
        self.sections = sections
        self.notes = notes or []  # what the recording could not record, in full (the notice line's long form)

    def compose(self) -> ComposeResult:
        """The key table."""
        t = Text()
        if self.notes:
            t.append("What this trace could not record\n", style="bold #ffaf00")
            for line in self.notes:
                t.append(f"  {line}\n")
            t.append("\n")
        t.append("specscope tui — keys (also in the Ctrl+P palette)\n", style="bold")
        for title, rows in self.sections:
            t.append(f"\n{title}\n", style="bold #87d7ff")
            for key, what in rows:
                t.append(f"  {key:<16}", style="bold")
                t.append(f"{what}\n")
        t.append("\nPage-table grid symbols: see the legend under the grid. Mouse: click a step, a row, a "
                 "violation; wheel scrolls.", style="grey62")
        with VerticalScroll():
            yield Static(t)

    def action_close(self) -> None:
        """Close."""
        self.dismiss(None)
