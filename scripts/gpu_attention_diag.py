#!/usr/bin/env python
"""On a GPU: clean runs with sampled attention, the differential checks (D1/D2) grouped by model, mode and graph phase,
and the worst relative error of each group — with draft extend captured and kept eager.

    python scripts/gpu_attention_diag.py OUT_DIR

Written to tell a kernel or recording problem of one forward kind from the rest; the H200 output is
benchmarks/results/gpu_attention_diag.txt.
"""

from __future__ import annotations

import collections
import os
import sys

from specscope.backend.engine_config import EngineConfig
from specscope.backend.session import run_session
from specscope.tracer.checks import check_steps
from specscope.tracer.differential import diff_step
from specscope.tracer.store import TraceReader

VARIANTS = [("graph-de-ra7", True, 7), ("eager-de-ra7", False, 7), ("graph-de-ra3", True, 3)]  # draft extend graph


def main(out: str) -> int:
    """Run each variant, print its D violations by group and the worst rel. error per group."""
    os.makedirs(out, exist_ok=True)
    for name, draft_extend_graph, every in VARIANTS:
        path = f"{out}/{name}.db"
        cfg = EngineConfig(model="tiny", draft="tiny-draft", device="cuda", dtype="bfloat16", batch_size=4,
                           num_requests=6, max_new_tokens=16, spec_steps=3, record_attention=every,
                           prompt_len=(16, 80), draft_extend_graph=draft_extend_graph)
        try:
            run_session(cfg, path, command=f"gpu_attention_diag {name}")
        except Exception as e:  # noqa: BLE001 - report and go on to the next variant
            print(name, "run failed", type(e).__name__, str(e)[:200])
            continue
        with TraceReader(path) as r:
            steps = list(r.steps())
            vs = [v for v in check_steps(steps, r.run) if v.check_id in ("D1", "D2")]
        groups = collections.Counter((v.check_id, steps[v.step].model, steps[v.step].mode.value,
                                      steps[v.step].graph.value) for v in vs)
        print(name, "steps", len(steps), "D violations", len(vs), dict(groups))
        for v in vs[:6]:
            print("   ", v.step, v.message[:200])
        worst: dict[tuple[str, ...], float] = collections.defaultdict(float)
        for s in steps:
            for which, _row, _rid, rel in diff_step(s):
                key = (which, s.model, s.mode.value, s.graph.value)
                worst[key] = max(worst[key], rel)
        for key, rel in sorted(worst.items()):
            print("    worst", key, f"{rel:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/attention-diag"))
