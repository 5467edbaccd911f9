"""Trace schema v2: the frozen, typed records a specscope trace is made of.

Units live in names (`*_ns` nanoseconds, `num_*` counts, `is_*` booleans). Every record is a frozen
dataclass that round-trips through `to_dict` / `from_dict` (plain JSON types; arrays stay numpy).
`docs/trace-format.md` documents every field.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

SCHEMA_MAJOR = 2
SCHEMA_MINOR = 1  # 2.1: violations carry the other facts of their relation (`related`)
SCHEMA_VERSION = f"{SCHEMA_MAJOR}.{SCHEMA_MINOR}"
MAGIC = "specscope-trace"


class ForwardMode(str, enum.Enum):
    """Forward modes, named as SGLang names them."""

    EXTEND = "EXTEND"
    DECODE = "DECODE"
    DRAFT_DECODE = "DRAFT_DECODE"
    TARGET_VERIFY = "TARGET_VERIFY"
    DRAFT_EXTEND = "DRAFT_EXTEND"


class GraphPhase(str, enum.Enum):
    """How a step ran: without a graph, while capturing one, or by replaying one."""

    EAGER = "eager"
    CAPTURE = "capture"
    REPLAY = "replay"


class Severity(str, enum.Enum):
    """Severity of an invariant violation."""

    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True)
class RunInfo:
    """One per trace: how the run was configured and where it ran."""

    command: str  # the exact command line that produced the trace
    config: dict[str, Any]  # every engine setting (batch size, spec steps, page size, graphs, ...)
    target_model: str  # path or "tiny"
    draft_model: str | None  # path, "tiny", or None for plain decode
    device: str  # e.g. "NVIDIA H200" or "cpu"
    device_capability: str | None  # e.g. "9.0"; None on the CPU
    attention_kernel: str  # "reference", "xqa+fmha_v2", "trtllm-gen", ...
    versions: dict[str, str]  # python, torch, flashinfer, specscope, cuda
    git_commit: str | None
    start_ns: int  # wall clock (time.time_ns) when the run began
    hostname: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunInfo:
        """Inverse of `to_dict`; ignores unknown keys (minor-version additions)."""
        return cls(**_known(cls, d))


@dataclass(frozen=True)
class RequestState:
    """One live row of a step's batch: what one request looked like to this forward."""

    request_id: int
    slot: int  # row of req_to_token (req_pool_index)
    seq_len_before: int  # committed KV length S before this step's tokens
    seq_len_after: int  # committed KV length after the step (after acceptance for TARGET_VERIFY)
    num_q_tokens: int  # query tokens this row contributed to the forward
    draft_tokens: tuple[int, ...] = ()  # TARGET_VERIFY: the drafted tokens (root excluded)
    accepted_tokens: tuple[int, ...] = ()  # TARGET_VERIFY: tokens committed (bonus included)
    accept_length: int = 0  # TARGET_VERIFY: len(accepted_tokens); 0 for other modes

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        d = dataclasses.asdict(self)
        d["draft_tokens"] = list(self.draft_tokens)
        d["accepted_tokens"] = list(self.accepted_tokens)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RequestState:
        """Inverse of `to_dict`."""
        k = _known(cls, d)
        k["draft_tokens"] = tuple(int(t) for t in k.get("draft_tokens", ()))
        k["accepted_tokens"] = tuple(int(t) for t in k.get("accepted_tokens", ()))
        return cls(**k)


@dataclass(frozen=True)
class ArraySnapshot:
    """A metadata tensor as the kernel consumed it: values plus dtype, shape and device address.

    `values` holds the recorded part (live and padded rows; only the live columns of page tables),
    so `values.shape` may be smaller than `shape`, which is the full tensor's shape.
    """

    name: str
    dtype: str  # numpy dtype name of the source tensor, e.g. "int32"
    shape: tuple[int, ...]  # full shape of the tensor the kernel saw
    data_ptr: int  # device address; 0 when unknown
    values: np.ndarray

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ArraySnapshot):
            return NotImplemented
        return (
            (self.name, self.dtype, tuple(self.shape), self.data_ptr)
            == (other.name, other.dtype, tuple(other.shape), other.data_ptr)
            and self.values.dtype == other.values.dtype
            and np.array_equal(self.values, other.values)
        )

    # No `__hash__ = None`: with __eq__ written here, dataclass(frozen=True) sets its field hash over it anyway,
    # and hashing `values` (an ndarray) raises TypeError, so a snapshot stays unhashable.


@dataclass(frozen=True)
class StreamSpan:
    """A timed region on one stream: "plan", "compute" (GPU) or "host"."""

    stream: str
    name: str  # phase, e.g. "metadata", "attention", "draft", "verify"
    start_ns: int
    end_ns: int

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StreamSpan:
        """Inverse of `to_dict`."""
        return cls(**_known(cls, d))


@dataclass(frozen=True)
class StreamWait:
    """A recorded wait edge: before its next work, `stream` waited for the end of span `on_span` of `on_stream`.

    E.g. StreamWait("plan", "compute", "producers"): the plan stream waited on the event recorded after the
    producers of seq_lens / req_to_token. A wait the engine never enqueued is simply absent.
    """

    stream: str
    on_stream: str
    on_span: str

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StreamWait:
        """Inverse of `to_dict`."""
        return cls(**_known(cls, d))


@dataclass(frozen=True)
class CallError:
    """A call made for this step that raised: what was called, the exception type and its message verbatim.

    `call` is "kernel:<entry point>" for a kernel launch (or its argument check), or the backend method's
    name, e.g. "update_verify_buffers_to_fill_after_draft"; `fatal` is True when the error ended the run
    (a sticky CUDA error).
    """

    call: str
    error_type: str
    message: str
    fatal: bool = False

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CallError:
        """Inverse of `to_dict`."""
        return cls(**_known(cls, d))


@dataclass(frozen=True)
class Cell:
    """One recorded value a violation names besides its own cell: the other side of the relation it checks."""

    array: str  # as in Violation.array: a Step.arrays name, a scalar name, or a request field
    row: int | None = None
    col: int | None = None
    value: str | None = None  # the value recorded there, as text
    step: int | None = None  # the step it was recorded at, when not the violation's own step (e.g. the capture)

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form, without the unset fields."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Cell:
        """Inverse of `to_dict`."""
        return cls(**_known(cls, d))


@dataclass(frozen=True)
class Violation:
    """One invariant that a step broke."""

    check_id: str  # e.g. "I5"
    severity: Severity
    step: int
    message: str  # names the step, the request and the values that disagree
    request_id: int | None = None
    # Where the wrong value is, so a viewer can highlight the cell: the array (as named in Step.arrays, or a
    # request field such as "accept_length"), its row (batch row) and column (e.g. logical page), the value
    # found and the value the invariant expected (as text: a number or a short list).
    array: str | None = None
    row: int | None = None
    col: int | None = None
    found: str | None = None
    expected: str | None = None
    # The other facts the relation ties this cell to, each where it was recorded with its value (e.g. the request
    # row's slot that a page-table cell disagrees with), so a viewer can mark both sides. Empty for single facts.
    related: tuple[Cell, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (`related` only when there is one)."""
        d = dataclasses.asdict(self)
        d["severity"] = self.severity.value
        if self.related:
            d["related"] = [c.to_dict() for c in self.related]
        else:
            del d["related"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Violation:
        """Inverse of `to_dict`."""
        k = _known(cls, d)
        k["severity"] = Severity(k["severity"])
        k["related"] = tuple(Cell.from_dict(c) for c in k.get("related") or ())
        return cls(**k)

    def cells(self) -> list[Cell]:
        """Every recorded cell this violation names: its own (value = found) first, then the related ones."""
        own = [Cell(self.array, self.row, self.col, self.found)] if self.array is not None else []
        return own + list(self.related)


@dataclass(frozen=True)
class Step:
    """One forward of one model (target or draft) over one batch, with everything it consumed."""

    index: int  # 0-based, in recording order; sparse in a bundle (the original trace's indexes)
    iteration: int  # scheduler iteration this step belongs to
    mode: ForwardMode
    model: str  # "target" or "draft"
    step_id: int | None  # DRAFT_DECODE: draft step i (0-based); None otherwise
    batch_size: int  # live rows
    padded_batch_size: int  # rows the kernel ran (captured graph size), >= batch_size
    graph: GraphPhase
    tokens_per_request: int  # T: query tokens per row in this forward (EXTEND: max extend length)
    num_draft_tokens: int  # K: configured tokens per verify (spec steps + 1; 1 for plain decode)
    page_size: int
    start_ns: int  # host monotonic clock (time.perf_counter_ns) at step start
    end_ns: int
    scalars: dict[str, int] = field(default_factory=dict)  # max_seq_len_q, max_seq_len_k, frozen_*, ...
    requests: tuple[RequestState, ...] = ()
    arrays: tuple[ArraySnapshot, ...] = ()
    spans: tuple[StreamSpan, ...] = ()
    violations: tuple[Violation, ...] = ()  # attached before writing (legacy v1 engine checks; v2 engines attach none)
    waits: tuple[StreamWait, ...] = ()  # wait edges enqueued for this step's work
    errors: tuple[CallError, ...] = ()  # calls for this step that raised (kernel argument checks, missing hooks, ...)
    faults_fired: tuple[str, ...] = ()  # --inject faults that changed this step (accounting only, never a check input)

    def array(self, name: str) -> ArraySnapshot | None:
        """The snapshot called `name`, or None."""
        for a in self.arrays:
            if a.name == name:
                return a
        return None

    def header_dict(self) -> dict[str, Any]:
        """The scalar fields (no requests, arrays, spans or violations) in plain-JSON form."""
        return {
            "index": self.index,
            "iteration": self.iteration,
            "mode": self.mode.value,
            "model": self.model,
            "step_id": self.step_id,
            "batch_size": self.batch_size,
            "padded_batch_size": self.padded_batch_size,
            "graph": self.graph.value,
            "tokens_per_request": self.tokens_per_request,
            "num_draft_tokens": self.num_draft_tokens,
            "page_size": self.page_size,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "scalars": dict(self.scalars),
        }


@dataclass(frozen=True)
class RequestRecord:
    """A request's whole life: written when it finishes (or when the run ends)."""

    request_id: int
    prompt_tokens: tuple[int, ...]
    output_tokens: tuple[int, ...]
    arrival_iteration: int
    finish_iteration: int | None  # None if the run ended first
    finish_reason: str  # "length", "stop", "unfinished"

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        d = dataclasses.asdict(self)
        d["prompt_tokens"] = list(self.prompt_tokens)
        d["output_tokens"] = list(self.output_tokens)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RequestRecord:
        """Inverse of `to_dict`."""
        k = _known(cls, d)
        k["prompt_tokens"] = tuple(int(t) for t in k["prompt_tokens"])
        k["output_tokens"] = tuple(int(t) for t in k["output_tokens"])
        return cls(**k)


# `meta.end_state` states (docs/trace-format.md, "How the run ended"); "unclosed" and "unknown" are never stored.
END_STATES = ("closed", "stopped", "interrupted", "engine_ended", "cuda_error", "error", "unclosed", "unknown")
END_STATE_KEY = "end_state"


@dataclass(frozen=True)
class EndState:
    """How the run that wrote a trace ended: the record its writer stored at close (`meta.end_state`), or, for a
    trace without one, what its `closed_ns` alone says (`recorded` False)."""

    state: str  # one of END_STATES
    step: int | None  # the last committed step's index (None: no step committed)
    lost_in_flight: int | None  # steps the engine had begun that never reached the trace (None: nobody knows)
    detail: str = ""  # "SIGINT"; the ending error's type and first line; what a viewer's stop said
    error_step: int | None = None  # cuda_error / error: the step that carries the ending error, where one does
    recorded: bool = True  # False: no end record (older writers; a trace still live or whose writer was killed)

    @property
    def clean(self) -> bool:
        """The run ended as it meant to: a clean close, or a stop its controller asked for."""
        return self.state in ("closed", "stopped")

    @property
    def label(self) -> str:
        """The end in a few words, e.g. "interrupted (SIGINT) at step 317" (a status bar's text)."""
        at = "before its first step" if self.step is None else f"at step {self.step}"
        err_at = at if self.error_step is None else f"at step {self.error_step}"
        kind = self.detail.split(":", 1)[0] or "an exception"
        return {
            "closed": "closed",
            "stopped": f"stopped on request {at}",
            "interrupted": f"interrupted ({self.detail or 'SIGINT'}) {at}",
            "engine_ended": "interrupted (the engine process ended)",
            "cuda_error": f"ended by a CUDA error {err_at}",
            "error": f"ended by an error ({kind}) {err_at}",
            "unclosed": "not closed (live, or its writer was killed)",
        }.get(self.state, "unknown (the end record is unreadable)")

    def describe(self) -> str:
        """`label` with what was committed and what was lost, one sentence (`specscope info`'s end line)."""
        if not self.recorded and self.state == "closed":
            return "closed (no end record: this trace predates them, so an interrupted run reads as closed too)"
        out = self.label
        if self.state == "closed" and self.step is not None:
            out += f" after step {self.step}"
        elif self.state in ("engine_ended", "unclosed", "unknown") or self.error_step not in (None, self.step):
            out += "; no step committed" if self.step is None else f"; last committed step {self.step}"
        if self.lost_in_flight is None:
            if self.state == "engine_ended":
                out += "; the steps it had in flight are unknown"
        elif self.lost_in_flight:
            n = self.lost_in_flight
            were = "steps in flight were" if n != 1 else "step in flight was"
            out += f"; {n} {were} lost (begun, never committed)"
        else:
            out += "; no step in flight was lost"
        if self.detail and self.state not in ("closed", "interrupted"):
            out += f" [{self.detail}]"
        return out

    def record(self) -> dict[str, Any]:
        """The stored form (`meta.end_state`'s JSON object)."""
        return {"state": self.state, "step": self.step, "lost_in_flight": self.lost_in_flight,
                "detail": self.detail, "error_step": self.error_step}

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form, with `recorded`, `label` and `description` (what `specscope info --json` shows)."""
        return {**self.record(), "recorded": self.recorded, "label": self.label, "description": self.describe()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EndState:
        """Inverse of `record` / `to_dict` (ignores unknown keys; an unknown state reads as "unknown")."""
        k = _known(cls, d)
        state = str(k.get("state"))
        return cls(state=state if state in END_STATES else "unknown", step=_opt_int(k.get("step")),
                   lost_in_flight=_opt_int(k.get("lost_in_flight")), detail=str(k.get("detail") or ""),
                   error_step=_opt_int(k.get("error_step")), recorded=bool(k.get("recorded", True)))

    @classmethod
    def from_meta(cls, meta: dict[str, str], last_step: int | None) -> EndState:
        """The end state a trace's `meta` rows give (`last_step`: its highest committed index, for a trace without
        the record): the stored record; else "closed" when `closed_ns` is there, as older traces always read, and
        "unclosed" when it is not."""
        raw = meta.get(END_STATE_KEY)
        if raw is None:
            return cls("closed" if "closed_ns" in meta else "unclosed", last_step, None, recorded=False)
        try:
            d = json.loads(raw)
            if not isinstance(d, dict):
                raise TypeError("not an object")
            return cls.from_dict({**d, "recorded": True})
        except (ValueError, TypeError):
            return cls("unknown", last_step, None, detail=" ".join(raw.split())[:200])


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def step_from_parts(
    header: dict[str, Any],
    requests: list[dict[str, Any]],
    arrays: list[ArraySnapshot],
    spans: list[dict[str, Any]],
    violations: list[dict[str, Any]],
    waits: Sequence[dict[str, Any]] = (),
    errors: Sequence[dict[str, Any]] = (),
    faults_fired: Sequence[str] = (),
) -> Step:
    """Assemble a Step from its stored parts (the inverse of `Step.header_dict` and friends)."""
    return Step(
        index=int(header["index"]),
        iteration=int(header["iteration"]),
        mode=ForwardMode(header["mode"]),
        model=str(header["model"]),
        step_id=None if header.get("step_id") is None else int(header["step_id"]),
        batch_size=int(header["batch_size"]),
        padded_batch_size=int(header["padded_batch_size"]),
        graph=GraphPhase(header["graph"]),
        tokens_per_request=int(header["tokens_per_request"]),
        num_draft_tokens=int(header["num_draft_tokens"]),
        page_size=int(header["page_size"]),
        start_ns=int(header["start_ns"]),
        end_ns=int(header["end_ns"]),
        scalars={str(k): int(v) for k, v in header.get("scalars", {}).items()},
        requests=tuple(RequestState.from_dict(r) for r in requests),
        arrays=tuple(arrays),
        spans=tuple(StreamSpan.from_dict(s) for s in spans),
        violations=tuple(Violation.from_dict(v) for v in violations),
        waits=tuple(StreamWait.from_dict(w) for w in waits),
        errors=tuple(CallError.from_dict(e) for e in errors),
        faults_fired=tuple(str(f) for f in faults_fired),
    )


def _known(cls: type, d: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in d.items() if k in names}


# -- query records: what the reader's queryable tables return (docs/trace-format.md, "Reader API") ------------


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
