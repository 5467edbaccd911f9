"""Key-path latency mechanics: the frame after a move is drawn at once and complete, drawn lines leave no
reference cycles, and the look-ahead thread waits for the keys to pause."""

from __future__ import annotations

import asyncio
import gc
import time

import pytest
from rich.segment import Segment
from specscope.ui.tui import app as app_mod
from specscope.ui.tui import strip_cycles
from specscope.ui.tui.app import SpecscopeApp
from specscope.ui.tui.frames import MainScreen
from textual.strip import Strip
from tui_fixtures import _at_root, anyio_backend  # noqa: F401 - fixtures
from tui_samples import sample


def _count_frames(app: SpecscopeApp) -> list[float]:
    """Record the time of every frame the compositor hands to the driver."""
    frames: list[float] = []
    display = app._display

    def on_display(screen, renderable) -> None:
        if renderable is not None:
            frames.append(time.perf_counter())
        display(screen, renderable)

    app._display = on_display  # type: ignore[method-assign]
    return frames


@pytest.mark.anyio
async def test_a_lone_press_is_drawn_at_once_and_its_first_frame_holds_every_pane() -> None:
    """`]` is drawn by the main screen as soon as it is idle (not on Textual's next frame tick), and the first
    frame after the move repaints every pane that shows the step."""
    app = SpecscopeApp(sample("h200-graphs-changing-bs"))
    frames = _count_frames(app)
    async with app.run_test(size=(120, 40)) as pilot:
        await app.ready()
        app.accel.window = 0  # every press a lone one
        await pilot.pause(0.3)
        scr = app.screen
        assert isinstance(scr, MainScreen)
        painted: list[set[str]] = []
        update = scr._compositor.update_widgets

        def record(widgets) -> None:
            painted.append({w.id for w in widgets if w.id})
            update(widgets)

        scr._compositor.update_widgets = record  # type: ignore[method-assign]
        # (the draft chain and acceptance panes repaint only lines that changed: within an iteration, often none)
        panes = {"steps", "timeline", "detail", "requests", "grid", "status"}
        for _ in range(5):
            before, drawn, was = len(frames), scr.idle_frames, app.current
            painted.clear()
            app.simulate_key("right_square_bracket")
            deadline = time.monotonic() + 10
            while len(frames) == before and time.monotonic() < deadline:
                await asyncio.sleep(0.001)
            assert app.current == was + 1
            assert scr.idle_frames == drawn + 1  # drawn on idle, by the main screen
            assert painted and panes <= painted[0], painted  # the first frame has every pane of the new step
            await pilot.pause(0.2)


def test_whole_line_divide_makes_no_cycle() -> None:
    """The cycle-free `Strip.divide` is installed (the app imports it), gives Textual's answers, and a whole-line
    strip is freed by reference counting alone."""
    assert strip_cycles.apply() and Strip.divide is strip_cycles._divide
    s = Strip([Segment("abc"), Segment("defg")], 7)
    assert [x.text for x in s.divide([7])] == ["abcdefg"] and s.divide([7])[0] is s
    assert [x.text for x in s.divide([2, 5, 7])] == [x.text for x in strip_cycles._original(s, [2, 5, 7])]
    assert [x.text for x in s.divide([3, 9])] == [x.text for x in strip_cycles._original(s, [3, 9])] == ["abc"]
    t = Strip([Segment("xyz")], 3)
    t.divide([3])
    assert t._divide_cache.get((3,)) is None  # no [t] inside t
    u = Strip([Segment("xyz")], 3)
    strip_cycles._original(u, [3])
    assert u._divide_cache.get((3,))[0] is u  # Textual's own: the cycle this removes


@pytest.mark.anyio
async def test_stepping_leaves_almost_no_cyclic_garbage() -> None:
    """Walking steps creates (nearly) no garbage that only the cyclic collector can free (Textual's divide cache
    made ~250 objects of it per key on the 120x40 screen), so young collections stay rare on the key path."""
    app = SpecscopeApp(sample("h200-graphs-changing-bs"))
    async with app.run_test(size=(120, 40)) as pilot:
        await app.ready()
        app.accel.window = 0
        keys = ["right_square_bracket"] * 15 + ["left_square_bracket"] * 5
        start = app.current
        for key in keys:  # first walk: the panes grow to their sizes (a layout pass, which does make cycles)
            await pilot.press(key)
        app.move_to(start)
        await pilot.pause(0.2)
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for key in keys:  # the same walk again: the steady state of stepping
                await pilot.press(key)
            gc.collect()
            garbage = len(gc.garbage)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
        assert garbage < 5 * len(keys), garbage


@pytest.mark.anyio
async def test_look_ahead_waits_for_the_keys_to_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys faster than PREFETCH_IDLE_S never wake the neighbour thread (it would share the GIL with the drawing);
    once they pause, the next step in the direction of travel is decoded and classified ahead."""
    # An hour: every key surely comes before the look-ahead's timer, however slow the machine; the test then fires
    # the timer the last key armed itself (the keys' pause), so nothing here depends on how fast the loop runs.
    monkeypatch.setattr(app_mod, "PREFETCH_IDLE_S", 3600.0)
    app = SpecscopeApp(sample("h200-graphs-changing-bs"))
    asked: list[list[int]] = []
    prefetch = app.source.prefetch_steps

    def record(steps) -> None:
        asked.append(list(steps))
        prefetch(steps)

    app.source.prefetch_steps = record  # type: ignore[method-assign]
    async with app.run_test(size=(120, 40)) as pilot:
        await app.ready()
        app.accel.window = 0
        await pilot.pause()
        start = app.current
        for _ in range(4):
            await pilot.press("right_square_bracket")
        assert asked == []  # the keys did not pause long enough
        here = app.current
        assert here == start + 4
        timer = app._prefetch_timer
        assert timer is not None and not timer.cancelled()  # armed by the last key, waiting for the pause
        run, args = timer._callback, timer._args  # (cancel() clears them)
        timer.cancel()
        run(*args)  # the keys paused: what the timer runs, now
        assert asked and asked[0][0] == here + 1
        deadline = time.monotonic() + 60  # the neighbour thread decodes it; a loaded machine may take a while
        while here + 1 not in app.source._grids and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert here + 1 in app.source._grids  # ready before the next press asks for it
