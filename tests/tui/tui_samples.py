"""Paths of the sample traces the TUI tests use (relative to the repository root, the tests' working directory)."""

from __future__ import annotations

import os

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SAMPLES = os.path.join("samples", "traces")


def sample(name: str) -> str:
    """A sample trace, relative to the repository root."""
    return os.path.join(SAMPLES, f"{name}.db")
