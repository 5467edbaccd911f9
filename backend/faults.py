"""Named fault switches that re-create known upstream bug classes. Each changes nothing unless switched on."""

from __future__ import annotations

from dataclasses import dataclass

# Why a fault may not fire, and what to try: `specscope check` prints it for a fault that never fired, and reading
# a trace never imports the engine, so the table lives in the tracer; re-exported beside the faults it describes.
from ..tracer.fault_hints import FAULT_HINTS as FAULT_HINTS


@dataclass(frozen=True)
class Fault:
    """One injectable bug: its name, what it re-creates, and the invariant that should catch it.

    When a fault changes a step the engine records its name in that step's `faults_fired` (fault accounting
    for `specscope check`; never an input to detection)."""

    name: str
    description: str
    expected_check: str
    gpu_only: bool = False


FAULTS: tuple[Fault, ...] = (
    Fault("max-seq-len-q-override",
          "target-verify graph _apply overwrites max_seq_len_q with the backend's cached K (PR #27495); "
          "bites when the runner's tokens per request T differ from K (use --verify-tokens)", "I6"),
    Fault("zero-cache-seqlens-at-capture",
          "draft-decode capture binds cache_seqlens without copying seq_lens into it (PR #26521, G1)", "I17"),
    Fault("draft-extend-capture-q-len",
          "draft-extend graph capture freezes max_seq_len_q = 1 (SGLang's v1 draft extend took it from the accept "
          "counts, 1 at capture; TMB L622-627, G5): the context kernel runs T query tokens per row as one", "I8"),
    Fault("stale-page-table",
          "page table not refreshed before a graph replay: the kernel reads last batch's pages (G3)", "I19"),
    Fault("padded-row-seqlen",
          "padded graph rows get a real row's seq_len instead of the fill value, so they read past page 0",
          "I18"),
    Fault("no-plan-wait",
          "plan stream not ordered after the producers of seq_lens / req_to_token (PR #28034, G10)", "I21"),
    Fault("missing-fixup-hook",
          "a backend without update_verify_buffers_to_fill_after_draft under the plan stream (PR #25925, G9)",
          "I28"),
    Fault("wild-page-id",
          "a verify page-table cell holds a page id far outside the KV pool (garbage metadata); no argument check "
          "looks at page ids, so the kernel faults with an illegal memory access, a sticky CUDA error",
          "K1", gpu_only=True),
)

FAULT_NAMES = tuple(f.name for f in FAULTS)

# The smallest engine settings (EngineConfig fields) under which each fault bites; tests and docs use them.
FAULT_SETTINGS: dict[str, dict[str, object]] = {
    "max-seq-len-q-override": {"spec_steps": 3, "verify_tokens": 2},
    "zero-cache-seqlens-at-capture": {},
    "draft-extend-capture-q-len": {},
    "stale-page-table": {"page_size": 16},
    "padded-row-seqlen": {"batch_size": 6, "num_requests": 10},
    "no-plan-wait": {"plan_stream": True},
    "missing-fixup-hook": {"plan_stream": True},
    "wild-page-id": {},
}

def parse_faults(names: list[str] | tuple[str, ...] | None) -> frozenset[str]:
    """Validate fault names; raises ValueError naming the unknown one and listing the known ones."""
    out = set()
    for n in names or ():
        if n not in FAULT_NAMES:
            raise ValueError(f"unknown fault {n!r}; known faults: {', '.join(FAULT_NAMES)}")
        out.add(n)
    return frozenset(out)
