"""Fixtures for the TUI tests: the sample traces, and the repository root as the working directory (so the
paths the status line shows, and therefore the snapshots, do not depend on where pytest was started)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from tui_samples import ROOT, sample  # noqa: E402


@pytest.fixture(autouse=True)
def _at_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


@pytest.fixture
def clean_trace() -> str:
    """The default CPU sample."""
    return sample("cpu-default")


@pytest.fixture
def faulty_trace() -> str:
    """A CPU sample recorded with the stale-page-table fault (violations with page-table cells)."""
    return sample("cpu-fault-stale-page-table")


@pytest.fixture
def anyio_backend() -> str:
    """Textual runs on asyncio."""
    return "asyncio"
