"""Trace schema v2: the frozen, typed records a specscope trace is made of.

Units live in names (`*_ns` nanoseconds, `num_*` counts, `is_*` booleans). Every record is a frozen
dataclass that round-trips through `to_dict` / `from_dict` (plain JSON types; arrays stay numpy).
`docs/trace-format.md` documents every field.

This package is the records' one public home (import them from `specscope.tracer.schema`); its parts hold them
by idea: `enums` (forward modes, graph phases, severities), `run` (the format version, the run, its requests and
how it ended), `step` (a step and its parts), `violation` (violations and the cells they name), `rows` (what the
reader's queryable tables return).
"""

from .enums import ForwardMode, GraphPhase, Severity
from .rows import FaultReport, RequestRow, SpanRow, StepSummary
from .run import (
    END_STATE_KEY,
    END_STATES,
    MAGIC,
    SCHEMA_MAJOR,
    SCHEMA_MINOR,
    SCHEMA_VERSION,
    EndState,
    RequestRecord,
    RunInfo,
)
from .step import ArraySnapshot, CallError, RequestState, Step, StreamSpan, StreamWait, step_from_parts
from .violation import Cell, Violation

__all__ = [
    "END_STATES",
    "END_STATE_KEY",
    "MAGIC",
    "SCHEMA_MAJOR",
    "SCHEMA_MINOR",
    "SCHEMA_VERSION",
    "ArraySnapshot",
    "CallError",
    "Cell",
    "EndState",
    "FaultReport",
    "ForwardMode",
    "GraphPhase",
    "RequestRecord",
    "RequestRow",
    "RequestState",
    "RunInfo",
    "Severity",
    "SpanRow",
    "Step",
    "StepSummary",
    "StreamSpan",
    "StreamWait",
    "Violation",
    "step_from_parts",
]
