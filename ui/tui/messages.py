"""Messages the app's workers post to it (the live controller's are in live.py)."""

from __future__ import annotations

from textual.message import Message


class TraceChanged(Message):
    """The loader worker loaded or checked more: violations, verdict coverage or the run's acceptance changed."""
