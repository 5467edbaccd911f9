"""The specscope TUI: step through a trace (offline, following a growing one, or driving a live run)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from specscope.tracer.condition import ConditionError
from specscope.tracer.query import StepFilter
from specscope.tracer.schema import Violation
from specscope.ui.recording_notes import RecordingNotes
from specscope.ui.views import Cell, catalogue_order
from textual import work
from textual.app import App, ComposeResult, SystemCommand
from textual.reactive import var
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Footer

from . import keymap, navigation, step_view
from . import model as m
from .acceleration import Accelerator
from .acceptance import AcceptPanel
from .draft_chain import ChainPanel
from .idle_gc import IdleCollector
from .lines import TextPane
from .live import LiveChanged, LiveController, LiveNote, LivePaused
from .loader import BackgroundLoader
from .messages import TraceChanged
from .page_grid import PageGrid
from .pane_columns import PaneColumns
from .requests_table import RequestsTable
from .screens import HelpScreen, PromptScreen
from .source import TraceSource
from .step_detail import DetailPanel
from .step_list import StepList
from .step_violations import StepViolations
from .streams import Timeline
from .violations_panel import ViolationsPanel


class SpecscopeApp(App[int]):
    """Offline viewer of one trace; `controller` (live.py) adds following and driving a run."""

    TITLE = "specscope"
    # Every pane's and screen's style; beside this file's real path (a strict editable install links the modules only).
    CSS_PATH = Path(__file__).resolve().with_name("app.tcss")
    BINDINGS = keymap.bindings()  # the one keymap (keymap.py) makes these, the palette and the help
    # The step shown (an index): setting it (`move_to`) draws it (`watch_current`), even when it is the same step.
    current: var[int] = var(0, always_update=True, init=False)
    # The live run's state (controller.state: running, paused, finished; "" offline); the status line follows it.
    live_state: var[str] = var("", init=False)

    def __init__(self, path: str, *, controller: LiveController | None = None, follow: bool | None = None,
                 auto_check: bool = True, start: int | None = None, collector: IdleCollector | None = None) -> None:
        super().__init__()
        self.path = path
        self.abs_path = os.path.abspath(path)
        self.source = TraceSource(self.abs_path, display=path)
        self.controller = controller
        self.follow = (not self.source.is_closed()) if follow is None else follow
        self.highlight: Cell | None = None
        self.focus_violation: Violation | None = None  # the violation of the current step n / N walked to
        self.message_step: int | None = None  # the step a status-line message is about (shown only there)
        self.accel = Accelerator()
        self.last_search: StepFilter | None = None
        self.last_search_text = ""
        # Live: the controller feeds the checker as steps arrive; following: the loader keeps checking.
        self.loader = BackgroundLoader(self.source, auto_check=auto_check and controller is None,
                                       follow=self.follow and controller is None, on_change=self._loader_changed)
        self.run_hist: list[int] | None = None
        self._start = start
        self._tail = True  # following the newest step of a growing trace
        self._viol_version = -1
        self._accept_pending = False
        self._window_hist = m.SlidingHist()
        self._shown = 0
        self._prefetch_timer: Timer | None = None
        self.prefetch_wish: list[int] = []  # the steps the look-ahead decodes once the keys pause
        self._pending: tuple[Cell | None, Violation | None] = (None, None)  # what the next step shows marked
        # The process's collector (its entry point tunes gc, idle_gc.py): told of moves, run when the keys pause.
        self.collector = collector
        self._settle: Any = None
        self.message = ""
        self._notes_key: tuple[RecordingNotes, int] | None = None  # what the notice line shows, at which width
        if controller is not None:
            controller.attach(self, self.source)

    # -- layout ----------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        """Status line, three columns, footer."""
        src = self.source
        yield TextPane(id="status")
        yield TextPane(id="notice")  # what the recording could not record; shown only when there is something
        yield PaneColumns(src, id="main")
        yield Footer()

    def on_mount(self) -> None:
        """First step, background loading, polling for live traces."""
        # Kept, not queried: a modal screen on top would hide them from `query_one`.
        self._steps, self._detail = self.query_one(StepList), self.query_one(DetailPanel)
        self._requests, self._grid_w = self.query_one(RequestsTable), self.query_one(PageGrid)
        self._timeline, self._chain = self.query_one(Timeline), self.query_one(ChainPanel)
        self._accept, self._violations = self.query_one(AcceptPanel), self.query_one(ViolationsPanel)
        self._statusbar = self.query_one("#status", TextPane)
        self._notice = self.query_one("#notice", TextPane)
        step_view.show_notes(self)
        self._stepviol = self.query_one(StepViolations)
        self._main_screen = self.screen
        self._layout_classes(self.size.width)
        self._load()
        src = self.source
        n = src.num_steps()
        first = self._start if self._start is not None else (src.last_index() if self.follow and n else
                                                             src.first_index())
        self._steps.focus()
        if n:
            self.move_to(first)
        else:
            step_view.show_status(self)
        self.set_interval(0.25, self._tick)
        if self.controller is not None:
            self.controller.start()

    def on_resize(self, event: Any) -> None:
        """Use a large terminal's space: the side column appears at 120 columns, wider panes at 170."""
        self._layout_classes(event.size.width)
        if hasattr(self, "_notice"):
            step_view.show_notes(self, event.size.width)

    def _layout_classes(self, width: int) -> None:
        scr = getattr(self, "_main_screen", self.screen)
        scr.set_class(width >= 120, "-wide")
        scr.set_class(width >= 170, "-huge")

    # -- the current step --------------------------------------------------------------------------

    def move_to(self, i: int, cell: Cell | None = None, violation: Violation | None = None) -> None:
        """Show step `i` (an index; one the trace lacks, as in a bundle's gap, goes to the nearest held step);
        `cell` is highlighted in the grid, seqlens or request table."""
        src = self.source
        if src.num_steps() == 0:
            return
        i = src.snap(int(i))
        if self.message and self.message_step != i:
            self.message, self.message_step = "", None  # what the status line said was about another step
        self._tail = i == src.last_index()
        self._pending = (cell, violation)
        self.current = i  # watch_current draws it

    def watch_current(self, i: int) -> None:
        """Draw step `i` in every pane, its cursor row in the step list; the frame follows at once."""
        cell, violation = self._pending
        self._pending = (None, None)
        if self.collector is not None:
            self.collector.moved()
        self._steps.cursor = self.source.row_of(i)
        step_view.show_step(self, i, cell, violation)

    def run_prefetch(self) -> None:
        """What the look-ahead timer runs once the keys pause: decode `prefetch_wish` on the neighbour thread."""
        if self._prefetch_timer is not None:
            self._prefetch_timer.stop()
        self._prefetch_timer = None
        self.source.prefetch_steps(self.prefetch_wish)

    def _settled(self) -> None:
        self._settle = None
        # The accelerator's clock, not this redraw timer, says when the key is up: a repeat that came late on a
        # busy machine must not start the stride over.
        if not self.accel.held():
            self.accel.streak = 0
        if self.source.num_steps():
            self._timeline.show(self.current)
            step_view.show_side(self, self.source.step(self.current))

    def notify_line(self, text: str) -> None:
        """A one-line message in the status bar, about the current step: it goes when the view moves to another."""
        self.message, self.message_step = text, self.current
        step_view.show_status(self)

    def on_unmount(self) -> None:
        """The loader worker and the neighbour thread end."""
        self.loader.stop.set()  # the loader worker's thread ends at its next pass
        if self._prefetch_timer is not None:
            self._prefetch_timer.stop()
        self.source.stop_neighbours()

    def _tick(self) -> None:
        """Follow a growing trace; pick up background results; collect garbage while idle."""
        if self.collector is not None:
            self.collector.tick()
        src = self.source
        grew = 0
        if self.follow or self.controller is not None:
            grew = src.refresh()
            if grew:
                step_view.show_notes(self)
                if self.controller is not None:  # no following loader in live mode: read how far verdicts reach
                    src.checked_through = src.reader.checked_through()
                self._steps.sync_size()
                if self._tail and (self.controller is None or self.controller.follow_tail()):
                    self.move_to(src.last_index())
        if self._accept_pending and self._side_shown():
            step_view.show_accept(self, self.current)
        self._sync_violations()  # a live run's checker adds verdicts as its steps arrive
        step_view.show_status(self)

    @work(thread=True, group="loader")

    def _load(self) -> None:
        """The loader's work (violations, checking, following) in a thread worker; it posts TraceChanged."""
        self.loader.run()

    def _loader_changed(self) -> None:
        self.post_message(TraceChanged())  # from the worker's thread: post_message is thread-safe

    def on_trace_changed(self, event: TraceChanged) -> None:
        """The loader loaded or checked more: the run's acceptance, the violation marks and tree, the status."""
        src = self.source
        if not hasattr(self, "_steps"):
            return  # before the panes exist
        if self.run_hist is None and src.run_hist is not None:
            self.run_hist = src.run_hist
            if src.num_steps() and not self.accel.streak and self._side_shown():
                step_view.show_accept(self, self.current)
        self._sync_violations()
        step_view.show_status(self)

    def _side_shown(self) -> bool:
        return self._main_screen.has_class("-wide") or self._main_screen.has_class("-side-open")

    def _sync_violations(self) -> None:
        """New verdicts (the loader's, or a live run's checker's): the step list's marks and the violation tree."""
        if self.source.violations.version != self._viol_version:
            self._steps.refresh()
            if self._side_shown():
                step_view.fill_violations(self)

    async def ready(self, timeout: float = 10.0) -> None:
        """Wait until background loading (and checking) is done, then redraw; for tests and benchmarks."""
        deadline = time.monotonic() + timeout
        # The loader, and the first layout (panes sized: what fits on screen depends on it).
        while (not self.loader.initial.is_set() or not self._steps.size.height) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        self.run_hist = self.source.run_hist if self.source.run_hist is not None else \
            self.source.reader.accept_histogram()
        self._viol_version = -1
        if self.source.num_steps():
            self.move_to(self.current, self.highlight)
            while self._accept_pending and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
                step_view.show_accept(self, self.current)
        self._steps.refresh()

    # -- navigation actions ------------------------------------------------------------------------

    def action_next_step(self) -> None:
        """Next step (held: accelerating); steps are rows: a bundle's gap is one move."""
        self.move_to(self.source.offset(self.current, self.accel.stride("]")))

    def action_prev_step(self) -> None:
        """Previous step (held: accelerating)."""
        self.move_to(self.source.offset(self.current, -self.accel.stride("[")))

    def action_next_iteration(self) -> None:
        """First step of the next iteration."""
        j = self.source.iteration_step(self.current)
        if j is None:
            self.notify_line("no later iteration")
        else:
            self.move_to(j)

    def action_prev_iteration(self) -> None:
        """First step of the previous iteration."""
        j = self.source.iteration_step(self.current, backward=True)
        self.move_to(self.source.first_index() if j is None else j)

    def action_first_step(self) -> None:
        """The first step (step 0 of a recorded trace; a bundle's first)."""
        self.move_to(self.source.first_index())

    def action_last_step(self) -> None:
        """The last step."""
        self.move_to(self.source.last_index())

    def goto_text(self, text: str) -> str | None:
        """Go to what a go-to box says; returns an error sentence or None."""
        target = navigation.goto_target(self.source, self.current, text)
        if isinstance(target, str):
            return target
        self.move_to(target)
        return None

    def action_goto(self) -> None:
        """Ask for a step."""
        def validate(text: str) -> str | None:
            return self.goto_text(text)

        self.push_screen(PromptScreen("Go to step", "a number, +N / -N, end, or iN (first step of iteration N)",
                                      validate=validate))

    def search_text(self, text: str, backward: bool = False) -> str | None:
        """Search forward (backward) from the current step; returns an error sentence or None."""
        try:
            f = StepFilter.parse(text)
        except (ConditionError, ValueError) as e:
            return str(e)
        self.last_search, self.last_search_text = f, text
        hit = navigation.search(self.source, self.current, f, backward)
        if hit is None:
            return f"no step matches {text!r}"
        self.move_to(hit[0])
        self.notify_line(f"search wrapped: {text}" if hit[1] else f"/{text}")
        return None

    def action_search(self) -> None:
        """Ask for a search."""
        self.push_screen(PromptScreen(
            "Search steps", "r12 · verify · replay · I6 · violation · error · bs change · "
            "mode == TARGET_VERIFY and bs != prev.bs", value=self.last_search_text, validate=self.search_text))

    def action_search_next(self) -> None:
        """Repeat the last search forward."""
        if self.last_search_text:
            err = self.search_text(self.last_search_text)
            if err:
                self.notify_line(err)

    def action_search_prev(self) -> None:
        """Repeat the last search backward."""
        if self.last_search_text:
            err = self.search_text(self.last_search_text, backward=True)
            if err:
                self.notify_line(err)

    def _jump_violation(self, backward: bool) -> None:
        """The current step's next (previous) violation; past its last (first), the next (previous) step's first
        (last)."""
        vi = self.source.violations
        here = catalogue_order(vi.at(self.current))
        if self.focus_violation in here:
            k = here.index(self.focus_violation) + (-1 if backward else 1)
            if 0 <= k < len(here):
                self.move_to(self.current, violation=here[k])
                return
        j = vi.next_step(self.current, backward=backward)
        if j is None and self.source.loading_violations:
            j = self.source.find(StepFilter(has_violation=True), self.current, backward)
        if j is None:
            self.notify_line("no " + ("earlier" if backward else "later") + " violation")
            return
        vs = catalogue_order(vi.at(j))
        self.move_to(j, violation=(vs[-1] if backward else vs[0]) if vs else None)

    def action_next_violation(self) -> None:
        """Next step with a violation; its first violation's cell is highlighted."""
        self._jump_violation(False)

    def action_prev_violation(self) -> None:
        """Previous step with a violation."""
        self._jump_violation(True)

    def on_violations_panel_jump(self, event: ViolationsPanel.Jump) -> None:
        """A violation picked in the panel."""
        v = event.violation
        self.move_to(v.step, violation=v)

    def on_step_list_picked(self, event: StepList.Picked) -> None:
        """A step clicked or paged to in the step list."""
        self.move_to(event.index)

    def action_toggle_side(self) -> None:
        """Swap the side column (violations, draft chain, acceptance) in on narrow terminals."""
        self._main_screen.toggle_class("-side-open")
        if self.source.num_steps():
            step_view.show_side(self, self.source.step(self.current))

    def action_grid_zoom_in(self) -> None:
        """Page grid: fewer pages per character."""
        self._grid_w.action_zoom(-1)

    def action_grid_zoom_out(self) -> None:
        """Page grid: more pages per character."""
        self._grid_w.action_zoom(1)

    def action_grid_fit(self) -> None:
        """Page grid: fit the pane."""
        self._grid_w.action_fit()

    def action_check(self) -> None:
        """Check the steps the trace has no verdicts for (in the background)."""
        if not self.loader.initial.is_set():
            self.notify_line("still loading; checking starts with it")
            return
        # Asked for: check whatever the size.
        self.loader = BackgroundLoader(self.source, max_steps=1 << 62, on_change=self._loader_changed)
        self.source.loading_violations = True
        self._load()
        self.notify_line("checking…")

    def action_export(self) -> None:
        """Export the window around the current step as a bug-report bundle, when this build has it."""
        from .export import export_window

        # The window is of indexes: its end is past the last one, not the count (a bundle's start late).
        self.notify_line(export_window(self.abs_path, self.current, self.source.last_index() + 1))

    def action_help(self) -> None:
        """The help screen."""
        sections = keymap.help_sections(live=self.controller is not None)
        self.push_screen(HelpScreen(sections, notes=self.source.notes.lines()))

    async def action_quit(self) -> None:
        """Quit; a live run is stopped first and its trace closed."""
        if self.controller is not None:
            self.notify_line("stopping the run…")
            await self.controller.stop()
        self.loader.stop.set()
        self.exit(0)

    # -- live events (messages live.py's controller posts, from its thread or from a breakpoint edit) --------

    def on_live_paused(self, event: LivePaused) -> None:
        """The run paused after step `event.index`: show that step (it is committed) and say why."""
        self.source.refresh()
        self._steps.sync_size()
        if self.controller is not None:
            self.live_state = self.controller.state
        self.move_to(event.index)
        self.notify_line(event.reason)

    def on_live_changed(self, event: LiveChanged) -> None:
        """The run's state changed (running, finished)."""
        if self.controller is not None:
            self.live_state = self.controller.state
        self._tick()

    def watch_live_state(self, state: str) -> None:
        """The status line says what the run does now."""
        step_view.show_status(self)

    def on_live_note(self, event: LiveNote) -> None:
        """A note from the controller (the breakpoints just set) for the status line."""
        self.notify_line(event.text)

    # -- live actions (no-ops offline) ----------------------------------------------------------------

    def _live(self) -> LiveController | None:
        if self.controller is None:
            self.notify_line("not a live run (specscope tui --live ...)")
        return self.controller

    def action_live_toggle(self) -> None:
        """Pause or continue the run."""
        if c := self._live():
            c.toggle()

    def action_live_step(self) -> None:
        """One forward, then pause."""
        if c := self._live():
            c.step()

    def action_live_iteration(self) -> None:
        """Run to the next iteration."""
        if c := self._live():
            c.next_iteration()

    def action_live_continue(self) -> None:
        """Run freely."""
        if c := self._live():
            c.resume()

    def action_live_breakpoints(self) -> None:
        """Edit the breakpoints."""
        if c := self._live():
            self.push_screen(PromptScreen(
                f"Breakpoints (now {c.breaks.describe().removeprefix('break: ')})",
                "violation (on) · violation off · step N · a condition, e.g. mode == TARGET_VERIFY and bs != "
                "prev.bs · off (all)", value="", validate=c.breakpoint_text))

    # -- the palette ---------------------------------------------------------------------------------

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        """Every action, with its key, in the Ctrl+P palette (plus Textual's own: theme, screenshot, keys)."""
        yield from keymap.palette(self, live=self.controller is not None)
        yield from (cmd for cmd in super().get_system_commands(screen) if cmd.title != "Quit")
