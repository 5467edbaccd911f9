"""The offline TUI under Textual's pilot, on the sample traces: moving, searching, jumping, the palette."""

from __future__ import annotations

import pytest
from specscope.tracer.query import StepFilter
from specscope.tracer.store import TraceReader
from specscope.ui.tui import keymap
from specscope.ui.tui import model as m
from specscope.ui.tui.app import Accelerator, SpecscopeApp
from specscope.ui.tui.page_grid import PageGrid
from specscope.ui.tui.requests_table import RequestsTable
from specscope.ui.tui.step_list import StepList
from specscope.ui.views import violation_cell
from textual.command import CommandList, CommandPalette
from tui_fixtures import _at_root, anyio_backend, screen_lines, screen_text, until  # noqa: F401 - fixtures
from tui_samples import sample


@pytest.fixture
def clean_trace() -> str:
    """The default CPU sample."""
    return sample("cpu-default")


@pytest.fixture
def faulty_trace() -> str:
    """A CPU sample recorded with the stale-page-table fault (violations with page-table cells)."""
    return sample("cpu-fault-stale-page-table")


class FakeClock:
    """A clock the test advances, so held-key timing is exact."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t



async def _open(path: str, size: tuple[int, int] = (120, 40)):
    app = SpecscopeApp(path)
    return app, app.run_test(size=size)


@pytest.mark.anyio
async def test_step_keys_move_one_step_and_iteration_keys_jump(clean_trace: str) -> None:
    app = SpecscopeApp(clean_trace)
    async with app.run_test(size=(120, 40)) as pilot:
        await app.ready()
        app.accel.window = 0  # every press a lone press
        await pilot.press("right_square_bracket", "right_square_bracket", "right_square_bracket")
        assert app.current == 3
        await pilot.press("left_square_bracket")
        assert app.current == 2
        await pilot.press("right_curly_bracket")
        with TraceReader(clean_trace) as r:
            it = r.summary(2).iteration
            expect = next(s.index for s in r.iter_summaries(3) if s.iteration != it)
        assert app.current == expect
        await pilot.press("left_curly_bracket")
        assert app.source.summary(app.current).iteration != app.source.summary(expect).iteration or app.current == 0
        await pilot.press("end")
        assert app.current == app.source.num_steps() - 1
        await pilot.press("home")
        assert app.current == 0
        # j / k move the step list's cursor when it has the focus
        await pilot.press("j", "j", "k")
        assert app.current == 1
        assert app.query_one(StepList).cursor == 1


def test_held_key_accelerates_and_a_lone_press_does_not() -> None:
    clock = FakeClock()
    acc = Accelerator(window=0.1, clock=clock)
    strides = []
    for _ in range(60):  # a held key: repeats every 33 ms
        strides.append(acc.stride("]"))
        clock.t += 0.033
    assert strides[0] == 1 and strides[:3] == [1, 1, 1]
    assert strides == sorted(strides) and strides[-1] > 10
    clock.t += 0.5  # released, then pressed again
    assert acc.stride("]") == 1
    assert acc.stride("[") == 1  # another key starts over


def _settle_now(app: SpecscopeApp) -> None:
    """Fire the panes' redraw timer at once, as a busy machine does when the next repeat comes late."""
    timer = app._settle
    if timer is not None:
        timer.stop()
        app._settled()


@pytest.mark.anyio
async def test_held_key_moves_further_than_the_presses(clean_trace: str) -> None:
    """25 repeats 30 ms apart by the accelerator's clock move as far as its strides add up to, however late they
    come in wall time: the redraw timer firing between every two repeats does not end the hold."""
    clock = FakeClock()
    reference = Accelerator(window=0.1, clock=clock)
    want = 0
    for _ in range(25):
        want += reference.stride("]")
        clock.t += 0.03
    app = SpecscopeApp(clean_trace)
    async with app.run_test(size=(80, 24)) as pilot:
        await app.ready()
        clock.t += 1.0
        app.accel = Accelerator(window=0.1, clock=clock)
        for _ in range(25):
            await pilot.press("right_square_bracket")
            _settle_now(app)
            clock.t += 0.03
        assert app.current == want > 25
        clock.t += 1.0  # released
        await pilot.press("left_square_bracket")
        assert app.current == want - 1


def _palette_pick(app: SpecscopeApp) -> str:
    """The prompt of the command the open palette would run on enter ("" when none is highlighted)."""
    if not isinstance(app.screen, CommandPalette):
        return ""
    hits = app.screen.query_one(CommandList)
    if hits.highlighted is None or not hits.option_count:
        return ""
    return str(hits.get_option_at_index(hits.highlighted).prompt)


def _cells(app: SpecscopeApp) -> tuple[list[str], str]:
    """Every cell on screen: the text by line, and Textual's screenshot (characters and their styles)."""
    return screen_lines(app), app.export_screenshot()


@pytest.mark.anyio
async def test_partial_repaints_leave_the_screen_a_fresh_app_draws() -> None:
    """Each step repaints only the lines that changed (text panes, table rows, grid rows): after a walk over steps
    whose batch size changes (held, then lone presses, then a jump) the screen is cell for cell what an app
    opened at that step draws."""
    path = sample("h200-graphs-changing-bs")
    size = (120, 40)  # the side column too
    app = SpecscopeApp(path)
    async with app.run_test(size=size) as pilot:
        await app.ready()
        clock = FakeClock()
        app.accel = Accelerator(window=0.1, clock=clock)
        for _ in range(12):  # held: the debounced panes follow on release
            await pilot.press("right_square_bracket")
            clock.t += 0.03
        clock.t += 1.0
        for key in ["right_square_bracket"] * 9 + ["left_square_bracket"] * 4:
            await pilot.press(key)
            clock.t += 1.0
        assert app.goto_text("+37") is None  # a jump past the batch-size change, then lone steps
        for _ in range(4):
            await pilot.press("right_square_bracket")
            clock.t += 1.0
        _settle_now(app)  # the held key's panes, if their timer has not fired yet
        await pilot.pause()
        here, walked = app.current, _cells(app)
        scrolls = [(w.scroll_offset.x, w.scroll_offset.y) for w in (app._steps, app._requests, app._grid_w)]
    fresh = SpecscopeApp(path, start=here)
    async with fresh.run_test(size=size) as pilot:
        await fresh.ready()
        fresh.move_to(here, app.highlight)
        for w, (x, y) in zip((fresh._steps, fresh._requests, fresh._grid_w), scrolls, strict=True):
            w.scroll_to(x=x, y=y, animate=False, immediate=True)  # the walk's scroll positions (history, not state)
        await pilot.pause()
        drawn = _cells(fresh)
    for y, (a, b) in enumerate(zip(walked[0], drawn[0], strict=True)):
        assert a == b, (y, a, b)
    assert walked[1] == drawn[1]  # the styles too


@pytest.mark.anyio
async def test_go_to_step_and_bad_input(clean_trace: str) -> None:
    app = SpecscopeApp(clean_trace)
    async with app.run_test(size=(120, 40)) as pilot:
        await app.ready()
        n = app.source.num_steps()
        await pilot.press("g")
        await pilot.press(*str(n // 2), "enter")
        assert app.current == n // 2
        await pilot.press("g", "9", "9", "9", "9", "9", "enter")  # out of range: the prompt stays, says why
        assert "no step 99999" in screen_text(app)
        await pilot.press("escape")
        assert app.current == n // 2
        assert app.goto_text("+3") is None and app.current == n // 2 + 3
        assert app.goto_text("end") is None and app.current == n - 1
        with TraceReader(clean_trace) as r:
            first_it2 = r.find_steps(StepFilter(iteration=2))[0]
        assert app.goto_text("i2") is None and app.current == first_it2
        assert "not a step number" in app.goto_text("abc")


@pytest.mark.anyio
async def test_search_by_request_mode_and_condition(clean_trace: str) -> None:
    app = SpecscopeApp(clean_trace)
    async with app.run_test(size=(120, 40)) as pilot:
        await app.ready()
        with TraceReader(clean_trace) as r:
            verify = r.find_steps("verify", after=0)[0]
            cond = "mode == TARGET_VERIFY and bs != prev.bs"
            cond_hit = r.find_steps(cond, after=0)
            replay = r.find_steps("replay")[0]
        await pilot.press("slash", *"verify", "enter")
        assert app.current == verify
        app.move_to(0)
        await pilot.press("slash")
        await pilot.press(*"replay", "enter")
        assert app.current == replay
        app.move_to(0)
        assert app.search_text(cond) is None
        if cond_hit:
            assert app.current == cond_hit[0]
        err = app.search_text("mode === nonsense")
        assert err and "condition" in err
        # ctrl+n repeats the last search
        app.move_to(0)
        app.search_text("verify")
        first = app.current
        await pilot.press("ctrl+n")
        assert app.current > first and app.source.summary(app.current).mode.value == "TARGET_VERIFY"


@pytest.mark.anyio
async def test_violation_jumps_highlight_the_named_cell(faulty_trace: str) -> None:
    with TraceReader(faulty_trace) as r:
        found = sorted(r.violations(), key=lambda v: v.step)  # the verdicts the trace carries (what the app shows)
    steps = sorted({v.step for v in found})
    assert steps, "the faulty sample must have violations"
    app = SpecscopeApp(faulty_trace)
    async with app.run_test(size=(120, 40)) as pilot:
        await app.ready()
        app.move_to(0)
        first = next(s for s in steps if s > 0)
        await pilot.press("n")
        assert app.current == first
        v = app.focus_violation
        assert v is not None and v.step == first
        cell = violation_cell(v, app.source.step(first), infer=True)
        assert app.highlight == cell
        grid = app.query_one(PageGrid)
        assert grid.highlight == cell
        if cell is not None and cell.array == "page_table":
            # the highlighted cell is drawn in the highlight style on screen
            y = (cell.row or 0) + 1 - int(grid.scroll_offset.y)
            strip = grid.render_line(y)
            assert any(seg.style is not None and seg.style.bgcolor is not None
                       and seg.style.bgcolor.name == "#ffff5f" for seg in strip)
        second = next((s for s in steps if s > first), None)
        if second is not None:
            # n walks the step's own violations first, then goes on to the next step; N walks back the same way
            here = len(app.source.violations.at(first))
            for _ in range(here - 1):
                await pilot.press("n")
                assert app.current == first
            await pilot.press("n")
            assert app.current == second
            await pilot.press("N")
            assert app.current == first
        # picking a violation in the panel jumps to its step and cell
        last = found[-1]
        app.post_message(app.query_one("#violations").Jump(last))
        await pilot.pause()
        assert app.current == last.step
        assert app.highlight == violation_cell(last, app.source.step(last.step), infer=True)


@pytest.mark.anyio
async def test_palette_lists_every_action_and_runs_them(clean_trace: str) -> None:
    app = SpecscopeApp(clean_trace)
    async with app.run_test(size=(120, 40)) as pilot:
        await app.ready()
        titles = [c.title for c in app.get_system_commands(app.screen)]
        for k in keymap.actions(live=False):
            assert any(t.startswith(k.title) and f"({k.shown})" in t for t in titles), k.title
        with TraceReader(clean_trace) as r:
            it0 = r.summary(0).iteration
            expect = next(s.index for s in r.iter_summaries(1) if s.iteration != it0)
        await pilot.press("ctrl+p")
        await until(pilot, lambda: isinstance(app.screen, CommandPalette), "the palette")
        await pilot.press(*"Next iteration")
        # The palette searches on a worker and shows its hits in batches: enter picks the highlighted one.
        await until(pilot, lambda: _palette_pick(app).startswith("Next iteration"), "the palette's hit")
        await pilot.press("enter")
        await until(pilot, lambda: app.current == expect, f"step {expect}")


@pytest.mark.anyio
async def test_80x24_shows_detail_requests_and_grid(clean_trace: str) -> None:
    app = SpecscopeApp(clean_trace)
    async with app.run_test(size=(80, 24)) as pilot:
        await app.ready()
        with TraceReader(clean_trace) as r:
            i = r.find_steps("verify", after=20)[0]
        app.move_to(i)
        await pilot.pause()
        text = screen_text(app)
        assert f"step {i}" in text and "TARGET_VERIFY" in text
        assert "req" in text and "seq before" in text  # the request table's header
        assert "cache_sl" in text and "cu_q" in text  # the grid with the seqlens beside it
        table = app.query_one(RequestsTable)
        assert table.row_count == app.source.step(i).padded_batch_size
        # the side column swaps in with v
        await pilot.press("v")
        assert "violations by invariant" in screen_text(app)


@pytest.mark.anyio
async def test_mouse_click_picks_a_step_and_help_opens(clean_trace: str) -> None:
    app = SpecscopeApp(clean_trace)
    async with app.run_test(size=(120, 40)) as pilot:
        await app.ready()
        steps = app.query_one(StepList)
        await pilot.click(StepList, offset=(5, 5))  # border 1, header 1: row 3
        assert app.current == int(steps.scroll_offset.y) + 3
        await pilot.press("question_mark")
        assert "keys" in screen_text(app)
        await pilot.press("escape")
        await pilot.press("f1")
        assert "Next violation" in screen_text(app)
        await pilot.press("escape")


@pytest.mark.anyio
async def test_grid_zoom_keeps_the_worst_class(faulty_trace: str) -> None:
    app = SpecscopeApp(faulty_trace)
    async with app.run_test(size=(120, 40)) as pilot:
        await app.ready()
        await pilot.press("n")
        grid = app.query_one(PageGrid)
        assert grid.grid is not None
        g = grid.grid
        for z in m.ZOOMS[1:]:
            cls, _ = m.zoom_cells(g, z)
            assert cls.min() == g.cls.min()  # zooming out never hides the worst cell
        app.action_grid_zoom_out()
        assert m.ZOOMS[grid.zoom] > 0
        app.action_grid_fit()
        assert grid.zoom == grid._fit_index()


@pytest.mark.anyio
async def test_export_key_reports(clean_trace: str, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from specscope.ui.tui import export

    app = SpecscopeApp(clean_trace)
    async with app.run_test(size=(120, 40)) as pilot:
        await app.ready()
        app.move_to(40)
        msg = export.export_window(clean_trace, 40, app.source.num_steps(), folder=str(tmp_path))
        if msg.startswith("export not available"):
            return
        assert msg.startswith("exported steps 8:73"), msg
        assert (tmp_path / "cpu-default-steps-8-73.zip").exists()
        monkeypatch.chdir(tmp_path)
        await pilot.press("ctrl+e")
        assert app.message.startswith("exported")


@pytest.mark.anyio
async def test_follow_a_trace_another_writer_grows(clean_trace: str, tmp_path) -> None:
    import os

    from specscope.tracer.store import TraceWriter

    src = TraceReader(clean_trace)
    path = os.path.join(tmp_path, "growing.db")
    w = TraceWriter(path, src.run)
    for st in src.steps(0, 5):
        w.write_step(st)
    w.flush()
    app = SpecscopeApp(path)  # not closed: followed
    async with app.run_test(size=(120, 40)) as pilot:
        await app.ready()
        assert app.follow and app.current == 4
        for st in src.steps(5, 30):
            w.write_step(st)
        w.flush()
        await until(pilot, lambda: app.current == 29, "the cursor to follow the new steps")
        assert app.source.num_steps() == 30 and app.current == 29  # the cursor stayed on the newest step
        w.close()
        await until(pilot, lambda: "trace closed" in app._statusbar.plain, "the closed trace")
    src.close()
