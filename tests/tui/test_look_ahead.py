"""The look-ahead: the neighbour thread decodes the next step once the keys pause, never while they come."""

from __future__ import annotations

import asyncio
import time

import pytest
from specscope.ui.tui import step_view
from specscope.ui.tui.app import SpecscopeApp
from tui_fixtures import _at_root, anyio_backend  # noqa: F401 - fixtures
from tui_samples import sample


@pytest.mark.anyio
async def test_look_ahead_waits_for_the_keys_to_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys faster than PREFETCH_IDLE_S never wake the neighbour thread (it would share the GIL with the drawing);
    once they pause, the next step in the direction of travel is decoded and classified ahead."""
    # An hour: every key surely comes before the look-ahead's timer, however slow the machine; the test then fires
    # the timer the last key armed itself (the keys' pause), so nothing here depends on how fast the loop runs.
    monkeypatch.setattr(step_view, "PREFETCH_IDLE_S", 3600.0)
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
        assert app.prefetch_wish[:1] == [here + 1]  # armed by the last key, waiting for the keys to pause
        app.run_prefetch()  # the keys paused: what the look-ahead timer runs, now
        assert asked and asked[0][0] == here + 1
        deadline = time.monotonic() + 60  # the neighbour thread decodes it; a loaded machine may take a while
        while here + 1 not in app.source._grids and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert here + 1 in app.source._grids  # ready before the next press asks for it
