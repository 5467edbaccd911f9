"""Fixtures of the TUI tests, imported by each test module (a conftest.py here would be imported as the module
`conftest` and shadow tests/unit's, whose tests import helpers from it)."""

from __future__ import annotations

import html
import re
import time
from collections.abc import Callable
from typing import Any

import pytest
from tui_samples import ROOT

# How long a test waits for something the app does in the background: far above what it takes on a loaded
# machine, so only a hang fails; a condition met earlier ends the wait at once.
DEADLINE_S = 60.0


@pytest.fixture(autouse=True)
def _at_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """The repository root as the working directory, so the paths on screen (and the snapshots) are stable."""
    monkeypatch.chdir(ROOT)


@pytest.fixture
def anyio_backend() -> str:
    """Textual runs on asyncio."""
    return "asyncio"


async def until(pilot: Any, pred: Callable[[], object], what: str, timeout: float = DEADLINE_S) -> None:
    """Let the app run until `pred()` holds (AssertionError naming `what` after `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.02)


_SVG_TEXT = re.compile(r'<text class="[^"]*" x="([0-9.]+)" y="[0-9.]+" textLength="[0-9.]+" '
                       r'clip-path="url\(#[^)]*-line-(\d+)\)">([^<]*)</text>')
_CHAR_W = 20 * 0.61  # Rich's SVG export: 20 px lines, 0.61 width to height


def screen_lines(app: Any) -> list[str]:
    """What the screen shows, line by line, as plain text: read from Textual's public screenshot export (an SVG
    whose text runs sit at their cell's x), not from the compositor."""
    width, height = app.size
    rows = [[" "] * width for _ in range(height)]
    for x, line, text in _SVG_TEXT.findall(app.export_screenshot()):
        col, y = round(float(x) / _CHAR_W), int(line)
        for k, ch in enumerate(html.unescape(text).replace("\xa0", " ")):
            if y < height and col + k < width:
                rows[y][col + k] = ch
    return ["".join(r).rstrip() for r in rows]


def screen_text(app: Any) -> str:
    """`screen_lines` joined: everything on screen as plain text (what a user reads)."""
    return "\n".join(screen_lines(app))
