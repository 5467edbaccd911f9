"""Query records: what the reader's queryable tables return (docs/trace-format.md, "Reader API")."""

from __future__ import annotations

from dataclasses import dataclass, field

from .enums import ForwardMode, GraphPhase


@dataclass(frozen=True)
class StepSummary:
    """One row of the step summary table: everything a step list shows, without decoding the step body."""

    index: int
    iteration: int
    mode: ForwardMode
    model: str
    step_id: int | None
    batch_size: int
    padded_batch_size: int
    graph: GraphPhase
    tokens_per_request: int  # T
    num_draft_tokens: int  # K
    page_size: int
    start_ns: int
    end_ns: int
    num_errors: int  # violations of severity error in the violations table (all sources)
    num_warnings: int
    scalars: dict[str, int] = field(default_factory=dict)
    accept_hist: tuple[int, ...] = ()  # TARGET_VERIFY: element L = rows whose accept length is L; () otherwise

    @property
    def duration_ns(self) -> int:
        """Host duration of the step."""
        return self.end_ns - self.start_ns

    @property
    def num_violations(self) -> int:
        """Errors plus warnings."""
        return self.num_errors + self.num_warnings


@dataclass(frozen=True)
class SpanRow:
    """A stream span with the step it belongs to (the spans table)."""

    step: int
    model: str
    mode: ForwardMode
    stream: str  # "plan", "compute", "host"
    name: str
    start_ns: int
    end_ns: int


@dataclass(frozen=True)
class RequestRow:
    """One request in one step (the step_requests table): a request's history is its rows in step order."""

    step: int
    iteration: int
    mode: ForwardMode
    model: str
    request_id: int
    slot: int
    seq_len_before: int
    seq_len_after: int
    num_q_tokens: int
    accept_length: int


@dataclass(frozen=True)
class FaultReport:
    """How often an injected fault actually changed a step (accounting only: never an input to detection)."""

    fault: str
    fired: int
    first_step: int | None
