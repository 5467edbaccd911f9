"""Where the recorder's resolved steps go: the `StepSink` protocol, which the writer process's client
(`process_writer.ProcessTraceWriter`) implements, and `InProcessSink`, a trace writer in the recording process itself
(an SGLang server's recorder: no child process beside the server's own)."""

from __future__ import annotations

from typing import Any, Protocol

from .pipe_format import parts_from_raw
from .schema import RequestRecord
from .store import TraceWriter


class StepSink(Protocol):
    """What the recorder writes through: steps in its compact form, request records, meta rows, the end record."""

    def write_raw_step(self, raw: dict[str, Any]) -> None:
        """One resolved step."""
        ...

    def write_raw_steps(self, raws: list[dict[str, Any]]) -> None:
        """A resolving pass's steps, in index order."""
        ...

    def write_request(self, rec: RequestRecord) -> None:
        """A finished request's whole record."""
        ...

    def write_meta(self, key: str, value: str) -> None:
        """A `meta` row (inserted, or replacing the value of `key`)."""
        ...

    def set_end(self, state: str, *, lost_in_flight: int | None, detail: str = "",
                error_step: int | None = None) -> None:
        """How the run ended (stored at close)."""
        ...

    def flush(self) -> None:
        """Return once everything written so far is committed."""
        ...

    def close(self) -> None:
        """Commit and close the trace."""
        ...


class InProcessSink:
    """A `StepSink` over a `TraceWriter` in this process (its own writer thread commits)."""

    def __init__(self, writer: TraceWriter) -> None:
        self.writer = writer

    def write_raw_step(self, raw: dict[str, Any]) -> None:
        """One resolved step, as columns."""
        self.writer.write_parts(parts_from_raw(raw))

    def write_raw_steps(self, raws: list[dict[str, Any]]) -> None:
        """A resolving pass's steps."""
        for raw in raws:
            self.writer.write_parts(parts_from_raw(raw))

    def write_request(self, rec: RequestRecord) -> None:
        """A finished request's whole record."""
        self.writer.write_request(rec)

    def write_meta(self, key: str, value: str) -> None:
        """A `meta` row."""
        self.writer.write_meta(key, value)

    def set_end(self, state: str, *, lost_in_flight: int | None, detail: str = "",
                error_step: int | None = None) -> None:
        """How the run ended."""
        self.writer.set_end(state, lost_in_flight=lost_in_flight, detail=detail, error_step=error_step)

    def flush(self) -> None:
        """Wait until everything written so far is committed."""
        self.writer.flush()

    def close(self) -> None:
        """Commit and close the trace."""
        self.writer.close()
