"""The current step drawn into the panes: from the app's state (step, cell, violation walked to) to what each
pane shows, and the status line. Functions of the app; the panes draw, these say what."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

from specscope.tracer.checks import BY_ID
from specscope.tracer.schema import ForwardMode, Step, Violation
from specscope.ui.recording_notes import replay_without_metadata
from specscope.ui.views import Cell, catalogue_order, violation_cell

from .lines import Lines, TextPane
from .marks import StepMarks, tk_flagged
from .page_grid import NO_PAGE_TABLE, PageGrid
from .source import BLOCK

if TYPE_CHECKING:
    from collections.abc import Callable

    from specscope.ui.recording_notes import RecordingNotes
    from textual.geometry import Size
    from textual.screen import Screen
    from textual.timer import Timer

    from . import model as m
    from .acceleration import Accelerator
    from .acceptance import AcceptPanel
    from .draft_chain import ChainPanel
    from .live import LiveController
    from .loader import BackgroundLoader
    from .requests_table import RequestsTable
    from .source import TraceSource
    from .step_detail import DetailPanel
    from .step_violations import StepViolations
    from .streams import Timeline
    from .violations_panel import ViolationsPanel


class StepApp(Protocol):
    """What drawing a step reads and sets on the app: its state, its panes and two timers (SpecscopeApp is one)."""

    source: TraceSource
    controller: LiveController | None
    follow: bool
    highlight: Cell | None
    focus_violation: Violation | None
    accel: Accelerator
    loader: BackgroundLoader
    run_hist: list[int] | None
    message: str
    prefetch_wish: list[int]
    _viol_version: int
    _accept_pending: bool
    _window_hist: m.SlidingHist
    _shown: int
    _prefetch_timer: Timer | None
    _settle: Any
    _notes_key: tuple[RecordingNotes, int] | None
    _notice: TextPane
    _stepviol: StepViolations
    _main_screen: Screen[Any]
    _detail: DetailPanel
    _requests: RequestsTable
    _grid_w: PageGrid
    _timeline: Timeline
    _chain: ChainPanel
    _accept: AcceptPanel
    _violations: ViolationsPanel
    _statusbar: TextPane

    @property
    def current(self) -> int: ...
    @property
    def size(self) -> Size: ...
    def set_timer(self, delay: float, callback: Callable[[], Any] | None = None) -> Timer: ...
    def run_prefetch(self) -> None: ...
    def _settled(self) -> None: ...

WINDOW = 200  # steps either side of the current one in the acceptance window
PREFETCH_IDLE_S = 0.05  # the neighbour thread decodes the next step once the keys pause this long


def show_step(app: StepApp, i: int, cell: Cell | None, violation: Violation | None) -> None:
    """Draw step `i` in every pane: its violations first, the cell `cell` (or the focused violation's) marked."""
    src = app.source
    st = src.step(i)
    s = src.summary(i)
    assert s is not None, "a held step has a summary"
    viols = catalogue_order(src.violations.at(i))
    focus = violation if violation is not None and violation in viols else (viols[0] if viols else None)
    app.focus_violation = focus
    if cell is None and focus is not None:
        cell = violation_cell(focus, st, infer=True)
    app.highlight = cell
    marks = StepMarks.of(viols, st, focus)
    show_violations(app, i, viols, marks)
    capture = src.capture_of(i) if st.graph.value == "replay" else None
    notes = src.notes
    app._detail.show(st, s, capture, src.run.attention_kernel, max(len(viols), s.num_violations), marks,
                      tk_flagged(viols), notes)
    row = None
    if cell is not None and cell.row is not None and (cell.array == "request" or cell.array not in (
            "page_table", "cache_seqlens", "cu_seqlens_q", "cu_seqlens_k", "req_to_token_page_starts")):
        row = cell.row
    app._requests.show(st, src.byte_level, row, marks)
    no_md = replay_without_metadata(notes, st.graph.value, [a.name for a in st.arrays], list(st.scalars))
    app._grid_w.show(src.grid(i), cell, marks, empty=f"not recorded ({notes.replay_reason()}): page table, "
                      "cache_seqlens, cu_seqlens" if no_md else NO_PAGE_TABLE)
    if app.accel.streak > 0 and app.accel.key is not None:
        # A held key: the streams and side panes follow once it is released (Dolphie debounces its replay
        # keys the same way), so each repeat redraws only the step list, detail, requests and grid.
        if app._settle is not None:
            app._settle.stop()
        app._settle = app.set_timer(0.12, app._settled)
    else:
        app._timeline.show(i)
        show_side(app, st)
    show_status(app)
    src.prefetch(i - WINDOW - BLOCK, i + WINDOW + BLOCK)
    # The next step in the direction of travel, decoded on a thread (source.prefetch_steps): rows, not indexes
    # (a bundle's skip), since the next press most likely moves as far again.
    d = (src.row_of(i) - src.row_of(app._shown)) or 1
    # ... and where `n` / `N` would jump (their summaries too, for the step list around them).
    jumps = [j for j in (src.violations.next_step(i), src.violations.next_step(i, backward=True))
             if j is not None]
    prefetch_when_idle(app, [src.offset(i, d), src.offset(i, -d), *jumps])
    for j in jumps:
        src.prefetch(j - BLOCK, j + BLOCK)
    app._shown = i


def show_violations(app: StepApp, i: int, viols: list[Violation], marks: StepMarks) -> None:
    """The step's violations first, in full; the pane's title says where `n` / `N` stand."""
    pane = app._stepviol
    pane.max_lines = max(3, min(12, (app.size.height - 24) // 2 + 6))  # 80x24: 6 lines; 40 rows: 12
    pane.show(i, viols, marks)
    if viols:
        k = viols.index(marks.focus) + 1 if marks.focus in viols else 1
        pane.border_title = (f"step {i}: {len(viols)} violation{'s' if len(viols) != 1 else ''} "
                             f"· {k}/{len(viols)} · n / N walk")


def show_side(app: StepApp, st: Step) -> None:
    """The side column (draft chain, acceptance, violation tree) for step `st`, when it is shown."""
    src = app.source
    if not app._main_screen.has_class("-wide") and not app._main_screen.has_class("-side-open"):
        return  # hidden: drawn when shown
    verify = st if st.mode == ForwardMode.TARGET_VERIFY else verify_near(app, st)
    app._chain.show(verify, src.byte_level, st.index)
    show_accept(app, st.index)
    fill_violations(app)


def show_accept(app: StepApp, i: int) -> None:
    """Acceptance for the run and ±WINDOW steps; after a far jump the window's summaries are fetched in the
    background and the pane fills in on the next tick (the jump itself never waits for them)."""
    src = app.source
    # A window of indexes, clipped to the ones held (a bundle's start late).
    a, b = max(src.first_index(), i - WINDOW), min(src.last_index() + 1, i + WINDOW + 1)
    hist = app._window_hist.window(a, b, src.cached_summaries)
    app._accept_pending = hist is None
    if hist is not None:
        app._accept.show(app.run_hist, hist, (a, b - 1))


def verify_near(app: StepApp, st: Step) -> Step | None:
    """The verify step of `st`'s iteration within 11 steps either side, or None."""
    for j in list(range(st.index + 1, st.index + 12)) + list(range(st.index - 1, st.index - 12, -1)):
        s = app.source.summary(j)
        if s is not None and s.iteration == st.iteration and s.mode == ForwardMode.TARGET_VERIFY:
            return app.source.step(j)
    return None


def fill_violations(app: StepApp) -> None:
    """Rebuild the violation tree when the violation index changed."""
    vi = app.source.violations
    if vi.version != app._viol_version:
        app._viol_version = vi.version
        descriptions = {k: inv.description for k, inv in BY_ID.items()}
        app._violations.fill(vi.groups(), vi.version, descriptions, app.current)


def show_status(app: StepApp) -> None:
    """The status line: the run's state, the step, its violations, the trace's, how far verdicts reach."""
    src = app.source
    t = Lines()
    t.append("specscope ", style="bold")
    if app.controller is not None:  # first: the run's state must survive a narrow terminal's cut
        t.append(app.controller.status_text(short=True) + "  ", style="bold #ffd75f")
    t.append(f"step {app.current}/{max(0, src.last_index())}  ", style="bold")
    # What is true of the current step first (its violations, where n / N stand), then of the trace.
    here = catalogue_order(src.violations.at(app.current)) if src.num_steps() else []
    if here:
        ids = " ".join(dict.fromkeys(v.check_id for v in here))
        k = here.index(app.focus_violation) + 1 if app.focus_violation in here else 1
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
    if app.controller is not None:
        t.append(app.controller.status_text(), style="#ffd75f")
    elif app.follow and not src.is_closed():
        t.append("following", style="#ffd75f")
    else:  # a run cut short says so: its last steps may be missing, and that can be the bug
        end = src.end_state()
        if not end.clean:
            t.append(end.label, style="bold #ff8700")
        elif app.follow:
            t.append("trace closed", style="#ffd75f")
    if app.loader.error:
        t.append(f"  {app.loader.error}", style="red")
    if app.message:
        t.append(f"  {app.message}", style="italic")
    t.append(f"  {src.display}", style="grey62")
    app._statusbar.update(t)


def prefetch_when_idle(app: StepApp, steps: list[int]) -> None:
    """Have the neighbour thread decode `steps` once the keys pause for PREFETCH_IDLE_S (each move re-arms it).
    Decoding on that thread while the UI thread draws costs the UI more than decoding itself: the two share
    the GIL (the decode is mostly Python and numpy calls that keep it), so keys that come faster than that
    find the step undecoded and the UI thread decodes it (~4 ms); a lone press finds it ready."""
    if app._prefetch_timer is not None:
        app._prefetch_timer.stop()
        app._prefetch_timer = None
    app.prefetch_wish = steps
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # not inside the app's loop (a test driving the app by hand): at once
        app.run_prefetch()
        return
    app._prefetch_timer = app.set_timer(PREFETCH_IDLE_S, app.run_prefetch)


def show_notes(app: StepApp, width: int | None = None) -> None:
    """The notice line under the status line: what the recording could not record, fitted to the terminal
    (the help screen has the full text); hidden for a trace that records everything."""
    notes = app.source.notes
    w = max(20, (app.size.width if width is None else width) - 2)
    key = (notes, w)
    if key == app._notes_key:
        return
    app._notes_key = key
    app._notice.display = bool(notes)
    if notes:
        app._notice.update(Lines(notes.headline(w), style="bold #ffaf00"))
