"""A step: one forward over one batch, and the parts it carries (request rows, metadata snapshots, spans, waits,
call errors)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .dict_form import known_fields
from .enums import ForwardMode, GraphPhase
from .violation import Violation


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
        k = known_fields(cls, d)
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
        return cls(**known_fields(cls, d))


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
        return cls(**known_fields(cls, d))


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
        return cls(**known_fields(cls, d))


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
