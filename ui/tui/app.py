"""The specscope TUI: step through a trace (offline, following a growing one, or driving a live run)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from specscope.tracer.checks import BY_ID
from specscope.tracer.condition import ConditionError
from specscope.tracer.query import StepFilter
from specscope.tracer.schema import ForwardMode, Step, Violation
from specscope.ui.recording_notes import RecordingNotes, replay_without_metadata
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer

from . import model as m
from . import strip_cycles
from .frames import MainScreen
from .idle_gc import IdleCollector
from .lines import Lines
from .live import LiveChanged, LiveController, LiveNote, LivePaused
from .marks import StepMarks, catalogue_order, tk_flagged
from .screens import HelpScreen, PromptScreen
from .source import BLOCK, BackgroundLoader, TraceSource
from .step_violations import StepViolations
from .streams import Timeline
from .widgets import (
    NO_PAGE_TABLE,
    AcceptPanel,
    ChainPanel,
    DetailPanel,
    PageGrid,
    RequestsTable,
    StepList,
    TextPane,
    ViolationsPanel,
)

WINDOW = 200  # steps either side of the current one in the acceptance window
PREFETCH_IDLE_S = 0.05  # the neighbour thread decodes the next step once the keys pause this long (_prefetch_when_idle)


class Accelerator:
    """Held-key acceleration (Dolphie's replay keys): repeats that arrive faster than `window` seconds apart
    are a held key, and the stride grows the longer it is held; a lone press always moves one step."""

    STRIDES = ((3, 1), (8, 2), (16, 5), (28, 10), (40, 25))

    def __init__(self, window: float = 0.1, clock: Callable[[], float] = time.monotonic) -> None:
        self.window, self.clock = window, clock
        self.key: str | None = None
        self.last = -1e9
        self.streak = 0

    def stride(self, key: str) -> int:
        """Steps to move for this press of `key`."""
        now = self.clock()
        self.streak = self.streak + 1 if key == self.key and now - self.last <= self.window else 0
        self.key, self.last = key, now
        for limit, n in self.STRIDES:
            if self.streak < limit:
                return n
        return 100

    def held(self) -> bool:
        """Whether the last key is still repeating by this accelerator's clock."""
        return self.streak > 0 and self.clock() - self.last <= self.window


# Every action: (id, key shown, palette title, help). The palette, the help screen and the tests use this list.
ACTIONS: list[tuple[str, str, str, str]] = [
    ("next_step", "]", "Next step", "move to the next step (hold to accelerate)"),
    ("prev_step", "[", "Previous step", "move to the previous step (hold to accelerate)"),
    ("next_iteration", "}", "Next iteration", "first step of the next scheduler iteration"),
    ("prev_iteration", "{", "Previous iteration", "first step of the previous iteration"),
    ("first_step", "home", "First step", "go to step 0"),
    ("last_step", "end", "Last step", "go to the last step (and follow a live trace)"),
    ("goto", "g", "Go to step…", "a step number, +N / -N, 'end', or iN for iteration N"),
    ("search", "/", "Search…", "request id (r12), mode (verify), check id (I6), violation, bs change, or a condition"),
    ("search_next", "ctrl+n", "Search again (next match)", "repeat the last search forward"),
    ("search_prev", "ctrl+b", "Search again (previous match)", "repeat the last search backward"),
    ("next_violation", "n", "Next violation", "the step's next violation, then the next step with one; its cells "
     "are marked"),
    ("prev_violation", "N", "Previous violation", "the step's previous violation, then the previous step with one"),
    ("focus_next", "tab", "Focus next pane", "cycle the focus through the panes"),
    ("toggle_side", "v", "Show violations / draft / acceptance", "on narrow terminals, swap in the side column"),
    ("grid_zoom_in", "+", "Page grid: zoom in", "fewer logical pages per character (0 = page numbers)"),
    ("grid_zoom_out", "-", "Page grid: zoom out", "more logical pages per character, for 100k-token contexts"),
    ("grid_fit", "f", "Page grid: fit", "fit the widest row in the pane"),
    ("check", "c", "Check the trace", "run the invariant catalogue over the steps the trace has no verdicts for"),
    ("export", "ctrl+e", "Export bug-report bundle", "the steps around the current one, as a .zip"),
    ("help", "?", "Help", "every key (also F1)"),
    ("quit", "q", "Quit", "quit (a live run is stopped cleanly; its trace stays complete)"),
]
LIVE_ACTIONS: list[tuple[str, str, str, str]] = [
    ("live_toggle", "space", "Live: pause / continue", "pause the run at the next forward, or let it run"),
    ("live_step", "s", "Live: single step", "run exactly one forward, then pause"),
    ("live_iteration", "i", "Live: run to next iteration", "run until the first step of the next iteration"),
    ("live_continue", "C", "Live: continue", "run freely (breakpoints stay armed)"),
    ("live_breakpoints", "b", "Live: breakpoints…", "violation on / violation off, a step number, a condition, off"),
]


class SpecscopeApp(App[int]):
    """Offline viewer of one trace; `controller` (live.py) adds following and driving a run."""

    TITLE = "specscope"
    CSS = """
    Screen { layout: vertical; }
    #status { height: 1; background: $boost; color: $text; padding: 0 1; text-wrap: nowrap; text-overflow: ellipsis; }
    #notice { height: 1; background: $boost; padding: 0 1; text-wrap: nowrap; text-overflow: ellipsis; display: none; }
    DetailPanel, ChainPanel, Timeline { text-wrap: nowrap; text-overflow: ellipsis; }
    #main { height: 1fr; }
    #left { width: 34; }
    #center { width: 1fr; }
    #side { width: 38; display: none; }
    .-wide #side { display: block; }
    .-huge #left { width: 62; }
    .-huge #side { width: 60; }
    .-side-open #side { display: block; width: 1fr; }
    .-side-open #center { display: none; }
    StepList, PageGrid, RequestsTable, ViolationsPanel, DetailPanel, Timeline, ChainPanel, AcceptPanel {
        border-top: solid $primary-darken-2; border-title-color: $text-muted; }
    StepViolations { border-top: solid #ff5f5f; border-title-color: #ff5f5f; height: 4; display: none;
                     scrollbar-size-vertical: 1; padding: 0 1; }
    StepList:focus, PageGrid:focus, RequestsTable:focus, ViolationsPanel:focus, StepViolations:focus {
        border-top: solid $accent; border-title-color: $accent; }
    StepList { height: 1fr; scrollbar-size-vertical: 1; }
    Timeline { height: 9; }
    DetailPanel { height: 6; padding: 0 1; }
    RequestsTable { height: 6; max-height: 40%; }
    PageGrid { height: 1fr; min-height: 6; }
    ViolationsPanel { height: 1fr; }
    ChainPanel { height: 10; padding: 0 1; }
    AcceptPanel { height: 9; padding: 0 1; }
    """
    BINDINGS = [
        Binding("right_square_bracket", "next_step", "step ▶", key_display="]"),
        Binding("left_square_bracket", "prev_step", "◀ step", key_display="["),
        Binding("right_curly_bracket", "next_iteration", "iter ▶", show=False, key_display="}"),
        Binding("left_curly_bracket", "prev_iteration", "◀ iter", show=False, key_display="{"),
        Binding("home", "first_step", show=False),
        Binding("end", "last_step", show=False),
        Binding("g", "goto", "go to"),
        Binding("slash", "search", "search", key_display="/"),
        Binding("ctrl+n", "search_next", show=False),
        Binding("ctrl+b", "search_prev", show=False),
        Binding("n", "next_violation", "next viol"),
        Binding("N", "prev_violation", "prev viol", show=False),
        Binding("v", "toggle_side", "side", show=False),
        Binding("plus,equals_sign", "grid_zoom_in", show=False),
        Binding("minus", "grid_zoom_out", show=False),
        Binding("f", "grid_fit", show=False),
        Binding("c", "check", show=False),
        Binding("ctrl+e", "export", "export", show=False),
        Binding("question_mark,f1", "help", "help", key_display="?"),
        Binding("q", "quit", "quit"),
        Binding("space", "live_toggle", "pause/run", show=False),
        Binding("s", "live_step", "1 step", show=False),
        Binding("i", "live_iteration", "next iter", show=False),
        Binding("C", "live_continue", show=False),
        Binding("b", "live_breakpoints", show=False),
    ]

    def __init__(self, path: str, *, controller: LiveController | None = None, follow: bool | None = None,
                 auto_check: bool = True, start: int | None = None) -> None:
        # A workaround for Textual's Strip.divide, which makes a reference cycle of every whole-line strip: with it
        # the cyclic collector stays off the key path (strip_cycles.py has the measurement). Applied here, by the
        # app that needs it, and only to a Textual whose divide still makes the cycle.
        strip_cycles.apply()
        super().__init__()
        self.path = path
        self.abs_path = os.path.abspath(path)
        self.source = TraceSource(self.abs_path, display=path)
        self.controller = controller
        self.follow = (not self.source.is_closed()) if follow is None else follow
        self.current = 0
        self.highlight: m.Cell | None = None
        self.focus_violation: Violation | None = None  # the violation of the current step n / N walked to
        self.message_step: int | None = None  # the step a status-line message is about (shown only there)
        self.accel = Accelerator()
        self.last_search: StepFilter | None = None
        self.last_search_text = ""
        # Live: the controller feeds the checker as steps arrive; following: the loader keeps checking.
        self.loader = BackgroundLoader(self.source, auto_check=auto_check and controller is None,
                                       follow=self.follow and controller is None)
        self.run_hist: list[int] | None = None
        self._start = start
        self._tail = True  # following the newest step of a growing trace
        self._viol_version = -1
        self._accept_pending = False
        self._window_hist = m.SlidingHist()
        self._shown = 0
        self._prefetch_timer: asyncio.TimerHandle | None = None
        self.collector = IdleCollector()
        self._settle: Any = None
        self.message = ""
        self._notes_key: tuple[RecordingNotes, int] | None = None  # what the notice line shows, at which width
        if controller is not None:
            controller.attach(self, self.source)

    # -- layout ----------------------------------------------------------------------------------

    def get_default_screen(self) -> Screen:
        """The main screen draws the frame after a move at once (frames.py)."""
        return MainScreen(id="_default")

    def compose(self) -> ComposeResult:
        """Status line, three columns, footer."""
        src = self.source
        yield TextPane(id="status")
        yield TextPane(id="notice")  # what the recording could not record; shown only when there is something
        with Horizontal(id="main"):
            with Vertical(id="left"):
                yield StepList(src, id="steps")
                yield Timeline(src, id="timeline")
            with Vertical(id="center"):
                yield StepViolations(id="stepviol")
                yield DetailPanel(id="detail")
                yield RequestsTable(id="requests")
                yield PageGrid(id="grid")
            with Vertical(id="side"):
                yield ViolationsPanel(id="violations")
                yield ChainPanel(id="chain")
                yield AcceptPanel(id="accept")
        yield Footer()

    def on_mount(self) -> None:
        """Titles, first step, background loading, polling for live traces."""
        titles = {"steps": "steps", "timeline": "plan / compute streams", "detail": "step",
                  "requests": "requests", "grid": "page table × logical page  (cache_seqlens, cu_seqlens_q/k)",
                  "violations": "violations by invariant", "chain": "draft chain", "accept": "acceptance by position"}
        for wid, title in titles.items():
            self.query_one(f"#{wid}").border_title = title
        # Kept, not queried: a modal screen on top would hide them from `query_one`.
        self._steps, self._detail = self.query_one(StepList), self.query_one(DetailPanel)
        self._requests, self._grid_w = self.query_one(RequestsTable), self.query_one(PageGrid)
        self._timeline, self._chain = self.query_one(Timeline), self.query_one(ChainPanel)
        self._accept, self._violations = self.query_one(AcceptPanel), self.query_one(ViolationsPanel)
        self._statusbar = self.query_one("#status", TextPane)
        self._notice = self.query_one("#notice", TextPane)
        self._show_notes()
        self._stepviol = self.query_one(StepViolations)
        self._main_screen = self.screen
        self._layout_classes(self.size.width)
        self.loader.start()
        src = self.source
        n = src.num_steps()
        first = self._start if self._start is not None else (src.last_index() if self.follow and n else
                                                             src.first_index())
        self._steps.focus()
        if n:
            self.move_to(first)
        else:
            self._status()
        self.set_interval(0.25, self._tick)
        self.collector.start()
        if self.controller is not None:
            self.controller.start()

    def on_resize(self, event: Any) -> None:
        """Use a large terminal's space: the side column appears at 120 columns, wider panes at 170."""
        self._layout_classes(event.size.width)
        if hasattr(self, "_notice"):
            self._show_notes(event.size.width)

    def _layout_classes(self, width: int) -> None:
        scr = getattr(self, "_main_screen", self.screen)
        scr.set_class(width >= 120, "-wide")
        scr.set_class(width >= 170, "-huge")

    # -- the current step --------------------------------------------------------------------------

    def move_to(self, i: int, cell: m.Cell | None = None, violation: Violation | None = None) -> None:
        """Show step `i` (an index; one the trace lacks, as in a bundle's gap, goes to the nearest held step);
        `cell` is highlighted in the grid, seqlens or request table."""
        src = self.source
        if src.num_steps() == 0:
            return
        i = src.snap(int(i))
        if self.message and self.message_step != i:
            self.message, self.message_step = "", None  # what the status line said was about another step
        self._tail = i == src.last_index()
        self.collector.moved()
        self.current = i
        self._steps.set_cursor(src.row_of(i))
        self._show(i, cell, violation)
        if isinstance(scr := getattr(self, "_main_screen", None), MainScreen):
            scr.frame_now = True  # the frame with the new step is drawn as soon as the screen is idle

    def _show(self, i: int, cell: m.Cell | None, violation: Violation | None) -> None:
        src = self.source
        st = src.step(i)
        s = src.summary(i)
        assert s is not None, "a held step has a summary"
        viols = catalogue_order(src.violations.at(i))
        focus = violation if violation is not None and violation in viols else (viols[0] if viols else None)
        self.focus_violation = focus
        if cell is None and focus is not None:
            cell = m.violation_cell(focus, st)
        self.highlight = cell
        marks = StepMarks.of(viols, st, focus)
        self._show_violations(i, viols, marks)
        capture = src.capture_of(i) if st.graph.value == "replay" else None
        notes = src.notes
        self._detail.show(st, s, capture, src.run.attention_kernel, max(len(viols), s.num_violations), marks,
                          tk_flagged(viols), notes)
        row = None
        if cell is not None and cell.row is not None and (cell.array == "request" or cell.array not in (
                "page_table", "cache_seqlens", "cu_seqlens_q", "cu_seqlens_k", "req_to_token_page_starts")):
            row = cell.row
        self._requests.show(st, src.byte_level, row, marks)
        no_md = replay_without_metadata(notes, st.graph.value, [a.name for a in st.arrays], list(st.scalars))
        self._grid_w.show(src.grid(i), cell, marks, empty=f"not recorded ({notes.replay_reason()}): page table, "
                          "cache_seqlens, cu_seqlens" if no_md else NO_PAGE_TABLE)
        if self.accel.streak > 0 and self.accel.key is not None:
            # A held key: the streams and side panes follow once it is released (Dolphie debounces its replay
            # keys the same way), so each repeat redraws only the step list, detail, requests and grid.
            if self._settle is not None:
                self._settle.stop()
            self._settle = self.set_timer(0.12, self._settled)
        else:
            self._timeline.show(i)
            self._side(st)
        self._status()
        src.prefetch(i - WINDOW - BLOCK, i + WINDOW + BLOCK)
        # The next step in the direction of travel, decoded on a thread (source.prefetch_steps): rows, not indexes
        # (a bundle's skip), since the next press most likely moves as far again.
        d = (src.row_of(i) - src.row_of(self._shown)) or 1
        # ... and where `n` / `N` would jump (their summaries too, for the step list around them).
        jumps = [j for j in (src.violations.next_step(i), src.violations.next_step(i, backward=True))
                 if j is not None]
        self._prefetch_when_idle([src.offset(i, d), src.offset(i, -d), *jumps])
        for j in jumps:
            src.prefetch(j - BLOCK, j + BLOCK)
        self._shown = i

    def _show_violations(self, i: int, viols: list[Violation], marks: StepMarks) -> None:
        """The step's violations first, in full; the pane's title says where `n` / `N` stand."""
        pane = self._stepviol
        pane.max_lines = max(3, min(12, (self.size.height - 24) // 2 + 6))  # 80x24: 6 lines; 40 rows: 12
        pane.show(i, viols, marks)
        if viols:
            k = viols.index(marks.focus) + 1 if marks.focus in viols else 1
            pane.border_title = (f"step {i}: {len(viols)} violation{'s' if len(viols) != 1 else ''} "
                                 f"· {k}/{len(viols)} · n / N walk")

    def _prefetch_when_idle(self, steps: list[int]) -> None:
        """Have the neighbour thread decode `steps` once the keys pause for PREFETCH_IDLE_S (each move re-arms it).
        Decoding on that thread while the UI thread draws costs the UI more than decoding itself: the two share
        the GIL (the decode is mostly Python and numpy calls that keep it), so keys that come faster than that
        find the step undecoded and the UI thread decodes it (~4 ms); a lone press finds it ready."""
        if self._prefetch_timer is not None:
            self._prefetch_timer.cancel()
            self._prefetch_timer = None
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not inside the app's loop (a test driving the app by hand): at once
            self.source.prefetch_steps(steps)
            return
        self._prefetch_timer = loop.call_later(PREFETCH_IDLE_S, self.source.prefetch_steps, steps)

    def _settled(self) -> None:
        self._settle = None
        # The accelerator's clock, not this redraw timer, says when the key is up: a repeat that came late on a
        # busy machine must not start the stride over.
        if not self.accel.held():
            self.accel.streak = 0
        if self.source.num_steps():
            self._timeline.show(self.current)
            self._side(self.source.step(self.current))

    def _side(self, st: Step) -> None:
        src = self.source
        if not self._main_screen.has_class("-wide") and not self._main_screen.has_class("-side-open"):
            return  # hidden: drawn when shown
        verify = st if st.mode == ForwardMode.TARGET_VERIFY else self._verify_near(st)
        self._chain.show(verify, src.byte_level, st.index)
        self._show_accept(st.index)
        self._fill_violations()

    def _show_accept(self, i: int) -> None:
        """Acceptance for the run and ±WINDOW steps; after a far jump the window's summaries are fetched in the
        background and the pane fills in on the next tick (the jump itself never waits for them)."""
        src = self.source
        # A window of indexes, clipped to the ones held (a bundle's start late).
        a, b = max(src.first_index(), i - WINDOW), min(src.last_index() + 1, i + WINDOW + 1)
        hist = self._window_hist.window(a, b, src.cached_summaries)
        self._accept_pending = hist is None
        if hist is not None:
            self._accept.show(self.run_hist, hist, (a, b - 1))

    def _verify_near(self, st: Step) -> Step | None:
        for j in list(range(st.index + 1, st.index + 12)) + list(range(st.index - 1, st.index - 12, -1)):
            s = self.source.summary(j)
            if s is not None and s.iteration == st.iteration and s.mode == ForwardMode.TARGET_VERIFY:
                return self.source.step(j)
        return None

    def _fill_violations(self) -> None:
        vi = self.source.violations
        if vi.version != self._viol_version:
            self._viol_version = vi.version
            descriptions = {k: inv.description for k, inv in BY_ID.items()}
            self._violations.fill(vi.groups(), vi.version, descriptions, self.current)

    def _status(self) -> None:
        src = self.source
        t = Lines()
        t.append("specscope ", style="bold")
        if self.controller is not None:  # first: the run's state must survive a narrow terminal's cut
            t.append(self.controller.status_text(short=True) + "  ", style="bold #ffd75f")
        t.append(f"step {self.current}/{max(0, src.last_index())}  ", style="bold")
        # What is true of the current step first (its violations, where n / N stand), then of the trace.
        here = catalogue_order(src.violations.at(self.current)) if src.num_steps() else []
        if here:
            ids = " ".join(dict.fromkeys(v.check_id for v in here))
            k = here.index(self.focus_violation) + 1 if self.focus_violation in here else 1
            t.append(f"here: {ids} ({k}/{len(here)})  ", style="bold #ff5f5f")
        nv = src.violations.total()
        if src.loading_violations:
            t.append("violations: loading…  ", style="grey62")
        else:
            t.append(f"{nv} violation{'s' if nv != 1 else ''} in trace", style="bold #ff5f5f" if nv else "green")
            # Verdicts cover the steps the trace's own checks (or `check --write`) reached, and the ones this
            # viewer's checker judged since: say how far only while that is short of the last step.
            last = src.last_index()
            ct = -1 if src.checked_through is None else src.checked_through
            done = max(ct, src.tui_checked_through)
            if done < last:
                if done >= 0:
                    t.append(f" (checked through step {done})", style="grey62")
                else:
                    t.append(" (unchecked: press c)", style="grey62")
            t.append("  ")
        if self.controller is not None:
            t.append(self.controller.status_text(), style="#ffd75f")
        elif self.follow and not src.is_closed():
            t.append("following", style="#ffd75f")
        else:  # a run cut short says so: its last steps may be missing, and that can be the bug
            end = src.end_state()
            if not end.clean:
                t.append(end.label, style="bold #ff8700")
            elif self.follow:
                t.append("trace closed", style="#ffd75f")
        if self.loader.error:
            t.append(f"  {self.loader.error}", style="red")
        if self.message:
            t.append(f"  {self.message}", style="italic")
        t.append(f"  {src.display}", style="grey62")
        self._statusbar.update(t)

    def _show_notes(self, width: int | None = None) -> None:
        """The notice line under the status line: what the recording could not record, fitted to the terminal
        (the help screen has the full text); hidden for a trace that records everything."""
        notes = self.source.notes
        w = max(20, (self.size.width if width is None else width) - 2)
        key = (notes, w)
        if key == self._notes_key:
            return
        self._notes_key = key
        self._notice.display = bool(notes)
        if notes:
            self._notice.update(Lines(notes.headline(w), style="bold #ffaf00"))

    def notify_line(self, text: str) -> None:
        """A one-line message in the status bar, about the current step: it goes when the view moves to another."""
        self.message, self.message_step = text, self.current
        self._status()

    def on_unmount(self) -> None:
        """The collector's settings back to the process's; the neighbour thread ends."""
        self.collector.stop()
        if self._prefetch_timer is not None:
            self._prefetch_timer.cancel()
        self.source.stop_neighbours()

    def _tick(self) -> None:
        """Follow a growing trace; pick up background results; collect garbage while idle."""
        self.collector.tick()
        src = self.source
        grew = 0
        if self.follow or self.controller is not None:
            grew = src.refresh()
            if grew:
                self._show_notes()
                if self.controller is not None:  # no following loader in live mode: read how far verdicts reach
                    src.checked_through = src.reader.checked_through()
                self._steps.sync_size()
                if self._tail and (self.controller is None or self.controller.follow_tail()):
                    self.move_to(src.last_index())
        if self.run_hist is None and src.run_hist is not None:
            self.run_hist = src.run_hist
        if self._accept_pending and (self._main_screen.has_class("-wide") or
                                     self._main_screen.has_class("-side-open")):
            self._show_accept(self.current)
        if src.violations.version != self._viol_version:
            self._steps.refresh()
            if self._main_screen.has_class("-wide") or self._main_screen.has_class("-side-open"):
                self._fill_violations()
        self._status()

    async def ready(self, timeout: float = 10.0) -> None:
        """Wait until background loading (and checking) is done, then redraw; for tests and benchmarks."""
        deadline = time.monotonic() + timeout
        # The loader, and the first layout (panes sized: what fits on screen depends on it).
        while (not self.loader.initial.is_set() or not self._steps.size.height) and time.monotonic() < deadline:
            await self._sleep(0.02)
        self.run_hist = self.source.run_hist if self.source.run_hist is not None else \
            self.source.reader.accept_histogram()
        self._viol_version = -1
        if self.source.num_steps():
            self.move_to(self.current, self.highlight)
            while self._accept_pending and time.monotonic() < deadline:
                await self._sleep(0.02)
                self._show_accept(self.current)
        self._steps.refresh()

    async def _sleep(self, s: float) -> None:
        await asyncio.sleep(s)

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
        t = text.strip().lower()
        src = self.source
        try:
            if t in ("end", "$", "last"):
                target = src.last_index()
            elif t.startswith(("+", "-")):
                # N steps on, as `]` moves one: rows of the list, so a bundle's gap counts as no steps.
                row = src.row_of(self.current) + int(t)
                held = src.index_at(row)
                target = self.current + int(t) if held is None else held
            elif t.startswith("i"):
                hits = self.source.reader.find_steps(StepFilter(iteration=int(t[1:])), limit=1)
                if not hits:
                    return f"no step in iteration {t[1:]}"
                target = hits[0]
            else:
                target = int(t)
        except ValueError:
            return f"not a step number: {text!r} (a number, +N, -N, end, or iN for iteration N)"
        if not src.has(target):  # indexes, not rows: a bundle keeps the original run's numbers
            return f"no step {target} (the trace has {src.steps_text()})"
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
        hit = self.source.find(f, self.current, backward=backward)
        wrapped = False
        if hit is None:
            hit = self.source.find(f, -1 if not backward else self.source.last_index() + 1, backward=backward)
            if hit is None:
                return f"no step matches {text!r}"
            wrapped = True
        self.move_to(hit)
        self.notify_line(f"search wrapped: {text}" if wrapped else f"/{text}")
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
            self._side(self.source.step(self.current))

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
        self.loader = BackgroundLoader(self.source, max_steps=1 << 62)  # asked for: check whatever the size
        self.source.loading_violations = True
        self.loader.start()
        self.notify_line("checking…")

    def action_export(self) -> None:
        """Export the window around the current step as a bug-report bundle, when this build has it."""
        from .export import export_window

        # The window is of indexes: its end is past the last one, not the count (a bundle's start late).
        self.notify_line(export_window(self.abs_path, self.current, self.source.last_index() + 1))

    def action_help(self) -> None:
        """The help screen."""
        rows = [(k, f"{title} — {what}") for _, k, title, what in ACTIONS]
        sections = [("Browse", rows[:13]), ("Panes", rows[13:18]), ("Other", rows[18:])]
        if self.controller is not None:
            sections.insert(1, ("Live run", [(k, f"{t} — {w}") for _, k, t, w in LIVE_ACTIONS]))
        sections.append(("Panes (focused)", [("j / k", "rows of the focused pane (steps, requests, grid, "
                                                        "violations)"), ("h / l", "page grid: scroll pages"),
                                             ("Enter", "violations: jump to the step, highlight the cell")]))
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
        self.move_to(event.index)
        self.notify_line(event.reason)

    def on_live_changed(self, event: LiveChanged) -> None:
        """The run's state changed (running, finished)."""
        self._tick()

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

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """Every action, with its key, in the Ctrl+P palette (plus Textual's own: theme, screenshot, keys)."""
        acts = ACTIONS + (LIVE_ACTIONS if self.controller is not None else [])
        for aid, key, title, what in acts:
            yield SystemCommand(f"{title}  ({key})", what, self._palette_callback(aid))
        for cmd in super().get_system_commands(screen):
            if cmd.title != "Quit":
                yield cmd

    def _palette_callback(self, aid: str) -> Callable[[], Any]:
        def run() -> Any:
            if aid == "focus_next":
                return self.action_focus_next()
            return getattr(self, f"action_{aid}")()

        return run
