"""The TUI's status bar says how the run behind a trace ended: a run cut short (Ctrl-C, a killed engine, an
error) names its end and the step it ended at, since its last steps may be missing and that can be the bug."""

from __future__ import annotations

from pathlib import Path

import pytest
from specscope.ui.tui.app import SpecscopeApp
from stepgen import write_ended_trace
from tui_fixtures import _at_root, anyio_backend, screen_text, until  # noqa: F401 - fixtures

NUM_STEPS = 30


def _trace(path: Path, end: tuple[str, str] | None) -> str:
    return write_ended_trace(str(path), NUM_STEPS, end)



async def _status(path: str) -> str:
    """The status bar's line (the screen's first) once the violations are loaded."""
    app = SpecscopeApp(path)
    async with app.run_test(size=(200, 40)) as pilot:
        await app.ready()
        await until(pilot, lambda: "violation" in screen_text(app).splitlines()[0], "the status bar")
        return screen_text(app).splitlines()[0]


@pytest.mark.anyio
@pytest.mark.parametrize(("end", "label"), [
    (("interrupted", "SIGINT"), f"interrupted (SIGINT) at step {NUM_STEPS - 1}"),
    (("engine_ended", ""), "interrupted (the engine process ended)"),
    (("error", "RuntimeError: boom"), f"ended by an error (RuntimeError) at step {NUM_STEPS - 1}"),
])
async def test_a_run_cut_short_says_so_in_the_status_bar(tmp_path: Path, end: tuple[str, str], label: str) -> None:
    assert label in await _status(_trace(tmp_path / "cut.db", end))


@pytest.mark.anyio
async def test_a_clean_run_shows_no_end_label(tmp_path: Path) -> None:
    text = await _status(_trace(tmp_path / "clean.db", None))
    assert "interrupted" not in text and "ended by" not in text and "not closed" not in text
