"""Live mode on the CPU: a real `specscope run --control` child, driven through the TUI's keys."""

from __future__ import annotations

import os
import time

import pytest
from specscope.tracer.checks import check_steps
from specscope.tracer.store import TraceReader
from specscope.ui.tui.app import SpecscopeApp
from specscope.ui.tui.live import Breakpoints, LiveController
from tui_fixtures import _at_root, anyio_backend  # noqa: F401 - fixtures

RUN = ["--requests", "3", "--batch-size", "2", "--max-new-tokens", "12", "--prompt-len", "24,60",
       "--page-size", "16", "--inject", "stale-page-table"]
CONDITION = "mode == TARGET_VERIFY and graph == replay"


async def _until(pilot, pred, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the live run")
        await pilot.pause(0.05)


@pytest.mark.anyio
async def test_live_pause_step_breakpoints_and_quit(tmp_path) -> None:
    await _drive(str(tmp_path), "cpu")


@pytest.mark.gpu
@pytest.mark.anyio
async def test_live_on_the_gpu(tmp_path) -> None:
    """The same on CUDA: pauses flush with a device synchronize, the steps still arrive exactly."""
    await _drive(str(tmp_path), "cuda")


async def _drive(tmp_path: str, device: str) -> None:
    trace = os.path.join(tmp_path, "live.db")
    ctl = LiveController(["--device", device, *RUN], trace, Breakpoints(on_violation=False, step=5))
    ctl.launch()
    app = SpecscopeApp(trace, controller=ctl, follow=True)
    stops: dict[str, int] = {}
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            # 1. a step-number breakpoint: the engine itself pauses after step 5
            # (the controller learns of the pause first; the app shows it once its message is handled)
            await _until(pilot, lambda: ctl.state == "paused" and ctl.paused_at is not None and app.current == 5)
            assert ctl.paused_at == 5
            assert "breakpoint: step 5" in ctl.reason
            # 2. single step: exactly one more forward
            await pilot.press("s")
            await _until(pilot, lambda: ctl.paused_at == 6 and app.current == 6)
            # 3. a condition breakpoint (sync mode: the TUI judges each step before the engine goes on)
            assert ctl.breakpoint_text(CONDITION) is None
            await pilot.press("space")
            await _until(pilot, lambda: ctl.state == "paused" and (ctl.paused_at or 0) > 6)
            stops["condition"] = ctl.paused_at
            assert "condition" in ctl.reason
            # 4. break on the first violation after that
            assert ctl.breakpoint_text("off") is None and ctl.breakpoint_text("violation") is None
            await pilot.press("space")
            await _until(pilot, lambda: ctl.state == "paused" and ctl.paused_at != stops["condition"])
            stops["violation"] = ctl.paused_at
            assert ctl.reason.startswith("violation")
            await _until(pilot, lambda: app.current == stops["violation"] and app.highlight is not None)
            # 5. run to the next iteration
            assert ctl.breakpoint_text("off") is None
            await pilot.press("i")
            await _until(pilot, lambda: ctl.state == "paused" and ctl.paused_at != stops["violation"])
            stops["iteration"] = ctl.paused_at
            # 6. quit stops the run cleanly
            await pilot.press("q")
    finally:
        ctl.shutdown(10)
    assert ctl.returncode() == 0
    with TraceReader(trace) as r:
        assert r.is_closed()
        n = r.num_steps()
        assert n == stops["iteration"] + 1  # nothing ran after the last pause
        summaries = r.summaries()
        assert r.find_steps(CONDITION, after=6)[0] == stops["condition"]
        found = sorted({v.step for v in check_steps(r.steps(), r.run, waits_recorded=r.major >= 2)})
    assert next(s for s in found if s > stops["condition"]) == stops["violation"]
    it = summaries[stops["violation"]].iteration
    assert next(s.index for s in summaries[stops["violation"] + 1:] if s.iteration != it) == stops["iteration"]
