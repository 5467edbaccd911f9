"""The invariant catalogue (`reference/sglang-trtllm-mha.md` §7) checked over recorded steps. Torch-free.

Every invariant judges recorded facts only: the values the kernels consumed (metadata snapshots, request rows),
the times the device recorded (spans), the wait edges the engine enqueued, and the calls that raised. None
reads a flag the engine writes about itself or a fault switch, so the same catalogue checks a trace recorded
from a backend we did not write. This is the only package that knows check ids.

A violation names the step, the request and the values that disagree; where it is about one cell it also
names the array, row (batch row), column (logical page, or the token within the row for per-token arrays),
the value found and the value expected, so a viewer can highlight it. `Checker.feed` walks steps in order
and keeps the state some invariants need (capture/replay, page-table buffers, committed lengths, acceptance).

The modules, one idea each: `catalogue` (the declarations), `context` (the per-step view the checks read),
the per-step checks `form`, `within_row`, `across_rows` and `order`, the trackers that keep state between steps
`capture`, `requests` and `acceptance`, and `checker` (the streaming `Checker` that runs them in order).
"""

from .catalogue import (
    ACCEPTANCE,
    BONUS_ONLY_VERIFIES,
    BY_ID,
    CAPTURE,
    CATALOGUE,
    COLLAPSE_VERIFIES,
    FACTS,
    IDENTITY,
    ITERATION,
    LIFE,
    NUMERICS,
    RELATIONS,
    ROW,
    ROWS,
    Invariant,
)
from .checker import Checker, check_steps

__all__ = [
    "ACCEPTANCE", "BONUS_ONLY_VERIFIES", "BY_ID", "CAPTURE", "CATALOGUE", "COLLAPSE_VERIFIES", "FACTS", "IDENTITY",
    "ITERATION", "LIFE", "NUMERICS", "RELATIONS", "ROW", "ROWS", "Checker", "Invariant", "check_steps",
]
