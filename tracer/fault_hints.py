"""Why an injected fault may not fire in a run, and the settings under which it does.

`specscope check` prints the hint of each fault a trace's run injected but that never changed a step. The
table lives in the torch-free tracer, so reading a trace never imports the engine's package; the engine's fault
catalogue (`backend/faults.py`) re-exports it beside the faults themselves.
"""

from __future__ import annotations

# fault name -> (why it did not fire in this run, the settings to try)
FAULT_HINTS: dict[str, tuple[str, str]] = {
    "max-seq-len-q-override": ("the override changes nothing while the verify runner's tokens per request T equal "
                               "the backend's K", "--verify-tokens 2 --spec-steps 3 with CUDA graphs"),
    "zero-cache-seqlens-at-capture": ("it acts at draft-decode graph capture only",
                                      "--cuda-graph and --spec-steps >= 2"),
    "draft-extend-capture-q-len": ("it acts at draft-extend graph capture only", "--cuda-graph and --spec-steps >= 1"),
    "stale-page-table": ("it acts on graph replays that read at least one page-table column",
                         "--cuda-graph and enough new tokens for requests to cross pages (--page-size 16)"),
    "padded-row-seqlen": ("it acts only on replays with padded rows (live batch smaller than the captured size)",
                          "--batch-size 6 --requests 10, so batch sizes fall between captured sizes"),
    "no-plan-wait": ("it acts on speculative iterations with the plan stream", "--plan-stream --spec-steps 3"),
    "missing-fixup-hook": ("the hook is called only under the plan stream", "--plan-stream --spec-steps 3"),
    "wild-page-id": ("it acts on target-verify metadata", "--device cuda --spec-steps 3"),
}
