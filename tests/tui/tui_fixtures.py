"""Fixtures of the TUI tests, imported by each test module (a conftest.py here would be imported as the module
`conftest` and shadow tests/unit's, whose tests import helpers from it)."""

from __future__ import annotations

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
