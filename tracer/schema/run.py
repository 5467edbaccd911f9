"""The run: the format's version, how the run was configured, its requests' lives and how it ended."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from .dict_form import known_fields

SCHEMA_MAJOR = 2
SCHEMA_MINOR = 1  # 2.1: violations carry the other facts of their relation (`related`)
SCHEMA_VERSION = f"{SCHEMA_MAJOR}.{SCHEMA_MINOR}"
MAGIC = "specscope-trace"


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
        return cls(**known_fields(cls, d))



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
        k = known_fields(cls, d)
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
        k = known_fields(cls, d)
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
