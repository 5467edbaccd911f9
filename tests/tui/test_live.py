"""Live mode on the CPU: a real `specscope run --control` child, driven through the TUI's keys."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from typing import Any

import pytest
from specscope.tracer.checks import check_steps
from specscope.tracer.store import TraceReader
from specscope.ui.tui.app import SpecscopeApp
from specscope.ui.tui.live import START_PAUSED_REASON, Breakpoints, LiveController
from tui_fixtures import _at_root, anyio_backend, screen_text  # noqa: F401 - fixtures

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


DEMO = ["demo", "--device", "cpu", "--requests", "2", "--max-new-tokens", "8"]


class _Terminal:
    """A standard stream that says it is a terminal: the demo opens its live TUI only on one."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def isatty(self) -> bool:
        """Always a terminal."""
        return True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)



def _committed(trace: str) -> int:
    """Steps the run has committed to its trace so far."""
    with TraceReader(trace) as r:
        return r.num_steps()


async def _drive_demo(app: SpecscopeApp, seen: dict[str, Any]) -> None:
    """The demo's own live app under the pilot: paused at step 0 saying what to press, `s`, space, `q`."""
    ctl = app.controller
    assert ctl is not None
    async with app.run_test(size=(120, 40)) as pilot:
        await _until(pilot, lambda: ctl.state == "paused" and ctl.paused_at == 0 and app.current == 0)
        await pilot.pause()
        seen["first screen"] = screen_text(app)
        seen["status"] = app._statusbar.plain
        seen["at start"] = _committed(ctl.trace)
        await pilot.press("s")
        await _until(pilot, lambda: ctl.state == "paused" and ctl.paused_at == 1 and app.current == 1)
        seen["after s"] = _committed(ctl.trace)
        await pilot.press("space")
        await _until(pilot, lambda: _committed(ctl.trace) > 2)
        seen["resumed"] = any(e.get("event") == "running" for e in ctl.events)
        await pilot.press("q")


def test_demo_starts_paused_and_says_what_to_press(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`specscope demo` on a terminal opens its live run paused at the first step with the keys on screen; `s`
    runs exactly one more step and space lets it run on."""
    from specscope.ui.cli import main

    seen: dict[str, Any] = {}

    def run(app: SpecscopeApp, *args: Any, **kwargs: Any) -> None:
        try:
            asyncio.run(_drive_demo(app, seen))
        except BaseException as e:  # re-raised below: the demo's own error handling would turn it into exit 2
            seen["error"] = e

    monkeypatch.setattr(SpecscopeApp, "run", run)
    monkeypatch.setattr(sys, "stdin", _Terminal(sys.stdin))
    monkeypatch.setattr(sys, "stdout", _Terminal(sys.stdout))
    trace = os.path.join(tmp_path, "demo.db")
    rc = main([*DEMO, "-o", trace])
    if "error" in seen:
        raise seen["error"]
    assert rc == 0
    screen = seen["first screen"]
    for words in ("PAUSED at 0", "space run", "s step", "q quit"):
        assert words in screen, (words, screen)
    assert START_PAUSED_REASON in seen["status"]
    assert seen["at start"] == 1 and seen["after s"] == 2  # nothing ran before the first key; `s` ran one step
    assert seen["resumed"]
    with TraceReader(trace) as r:
        assert r.is_closed() and r.num_steps() > 2


def test_demo_without_a_terminal_runs_to_the_end_without_waiting(tmp_path) -> None:
    """Off a terminal (and with --no-tui) the demo prints its summary and exits: nothing waits for a key."""
    for extra in ([], ["--no-tui"]):
        trace = os.path.join(tmp_path, f"demo{len(extra)}.db")
        # stdin a pipe nobody writes to: a demo that waited for a key would hang here until the timeout.
        p = subprocess.run([sys.executable, "-m", "specscope.ui.cli", *DEMO, *extra, "-o", trace],
                           stdin=subprocess.PIPE, capture_output=True, text=True, timeout=300)
        assert p.returncode in (0, 1), p.stderr  # 1: the checks found errors (the demo says so)
        assert "next: specscope info" in p.stderr
        with TraceReader(trace) as r:
            assert r.is_closed() and r.num_steps() > 2
