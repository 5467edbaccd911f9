"""Fixtures of the TUI tests, imported by each test module (a conftest.py here would be imported as the module
`conftest` and shadow tests/unit's, whose tests import helpers from it)."""

from __future__ import annotations

import pytest
from tui_samples import ROOT


@pytest.fixture(autouse=True)
def _at_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """The repository root as the working directory, so the paths on screen (and the snapshots) are stable."""
    monkeypatch.chdir(ROOT)


@pytest.fixture
def anyio_backend() -> str:
    """Textual runs on asyncio."""
    return "asyncio"
