"""The TUI's one keymap: every key, from which the app's Textual bindings, the Ctrl+P palette and the help screen
are all made (nothing else lists keys)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from textual.app import App, SystemCommand
from textual.binding import Binding, BindingType


@dataclass(frozen=True)
class Key:
    """One entry: `keys` as Textual names them (comma-separated), `shown` as the user reads them; `footer` is the
    footer's label (None: not in the footer); `action` None is a help-only row (a pane's own keys)."""

    action: str | None
    keys: str
    shown: str
    title: str
    help: str
    section: str
    footer: str | None = None
    bind: bool = True  # False: Textual binds it itself (tab)

    @property
    def live(self) -> bool:
        """Whether the key drives a live run (listed only when there is one)."""
        return self.section == LIVE


BROWSE, LIVE, PANES, OTHER, FOCUSED = "Browse", "Live run", "Panes", "Other", "Panes (focused)"
SECTIONS = (BROWSE, LIVE, PANES, OTHER, FOCUSED)  # the help screen's order

KEYMAP: tuple[Key, ...] = (
    Key("next_step", "right_square_bracket", "]", "Next step", "move to the next step (hold to accelerate)", BROWSE,
        "step ▶"),
    Key("prev_step", "left_square_bracket", "[", "Previous step", "move to the previous step (hold to accelerate)",
        BROWSE, "◀ step"),
    Key("next_iteration", "right_curly_bracket", "}", "Next iteration", "first step of the next scheduler iteration",
        BROWSE),
    Key("prev_iteration", "left_curly_bracket", "{", "Previous iteration", "first step of the previous iteration",
        BROWSE),
    Key("first_step", "home", "home", "First step", "go to step 0", BROWSE),
    Key("last_step", "end", "end", "Last step", "go to the last step (and follow a live trace)", BROWSE),
    Key("goto", "g", "g", "Go to step…", "a step number, +N / -N, 'end', or iN for iteration N", BROWSE, "go to"),
    Key("search", "slash", "/", "Search…", "request id (r12), mode (verify), check id (I6), violation, bs change, "
        "or a condition", BROWSE, "search"),
    Key("search_next", "ctrl+n", "ctrl+n", "Search again (next match)", "repeat the last search forward", BROWSE),
    Key("search_prev", "ctrl+b", "ctrl+b", "Search again (previous match)", "repeat the last search backward",
        BROWSE),
    Key("next_violation", "n", "n", "Next violation", "the step's next violation, then the next step with one; its "
        "cells are marked", BROWSE, "next viol"),
    Key("prev_violation", "N", "N", "Previous violation", "the step's previous violation, then the previous step "
        "with one", BROWSE),
    Key("focus_next", "tab", "tab", "Focus next pane", "cycle the focus through the panes", BROWSE, bind=False),
    Key("live_toggle", "space", "space", "Live: pause / continue", "pause the run at the next forward, or let it run",
        LIVE),
    Key("live_step", "s", "s", "Live: single step", "run exactly one forward, then pause", LIVE),
    Key("live_iteration", "i", "i", "Live: run to next iteration", "run until the first step of the next iteration",
        LIVE),
    Key("live_continue", "C", "C", "Live: continue", "run freely (breakpoints stay armed)", LIVE),
    Key("live_breakpoints", "b", "b", "Live: breakpoints…", "violation on / violation off, a step number, a "
        "condition, off", LIVE),
    Key("toggle_side", "v", "v", "Show violations / draft / acceptance", "on narrow terminals, swap in the side "
        "column", PANES),
    Key("grid_zoom_in", "plus,equals_sign", "+", "Page grid: zoom in", "fewer logical pages per character (0 = page "
        "numbers)", PANES),
    Key("grid_zoom_out", "minus", "-", "Page grid: zoom out", "more logical pages per character, for 100k-token "
        "contexts", PANES),
    Key("grid_fit", "f", "f", "Page grid: fit", "fit the widest row in the pane", PANES),
    Key("check", "c", "c", "Check the trace", "run the invariant catalogue over the steps the trace has no verdicts "
        "for", PANES),
    Key("export", "ctrl+e", "ctrl+e", "Export bug-report bundle", "the steps around the current one, as a .zip",
        OTHER),
    Key("help", "question_mark,f1", "?", "Help", "every key (also F1)", OTHER, "help"),
    Key("quit", "q", "q", "Quit", "quit (a live run is stopped cleanly; its trace stays complete)", OTHER, "quit"),
    Key(None, "", "j / k", "", "rows of the focused pane (steps, requests, grid, violations)", FOCUSED),
    Key(None, "", "h / l", "", "page grid: scroll pages", FOCUSED),
    Key(None, "", "Enter", "", "violations: jump to the step, highlight the cell", FOCUSED),
)


def bindings() -> list[BindingType]:
    """The app's Textual bindings (footer labels and shown keys included); live keys are bound offline too, where
    they say that this is not a live run."""
    out: list[BindingType] = []
    for k in KEYMAP:
        if k.action is None or not k.bind:
            continue
        display = k.shown if k.shown != k.keys.split(",")[0] else None
        out.append(Binding(k.keys, k.action, k.footer or "", show=k.footer is not None, key_display=display))
    return out


def actions(live: bool) -> list[Key]:
    """The keys with an action, in table order: the palette's entries (live ones only for a live run)."""
    return [k for k in KEYMAP if k.action is not None and (live or not k.live)]


def help_sections(live: bool) -> list[tuple[str, list[tuple[str, str]]]]:
    """(section, [(key, what)]) for the help screen, in SECTIONS order."""
    out = []
    for sec in SECTIONS:
        rows = [(k.shown, f"{k.title} — {k.help}" if k.title else k.help) for k in KEYMAP
                if k.section == sec and (live or not k.live)]
        if rows:
            out.append((sec, rows))
    return out


def palette(app: App[Any], live: bool) -> Iterator[SystemCommand]:
    """The Ctrl+P palette's entries: every action with its key, running the app's `action_*` method."""
    for k in actions(live):
        yield SystemCommand(f"{k.title}  ({k.shown})", k.help, _runner(app, f"action_{k.action}"))


def _runner(app: App[Any], method: str) -> Callable[[], Any]:
    def run() -> Any:
        return getattr(app, method)()

    return run
