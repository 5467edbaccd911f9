#!/usr/bin/env python
"""Write docs/checks.md from the invariant catalogue, the fault list and the detection-table JSON files.

    python scripts/render_checks_doc.py docs/detection-cpu.json docs/detection-h200.json > docs/checks.md
"""

from __future__ import annotations

import json
import sys

from specscope.backend.faults import FAULTS
from specscope.tracer.checks import CATALOGUE


def main() -> None:
    tables = [json.load(open(p)) for p in sys.argv[1:]]
    out = ["# Checks: the invariant catalogue and what each injected fault trips", "",
           "`specscope check TRACE` runs every invariant below over every recorded step (exit 0 clean, 1 on any",
           "error-severity violation, 2 if the trace cannot be read; `--json` lists `id`, `severity`, `step`,",
           "`request_id`, `message`). The ids follow `reference/sglang-trtllm-mha.md` §7 (I20, I23-I27 are not",
           "checked from traces: no host syncs are visible in metadata, our fix-up hook has no buffers, the",
           "workspace is not snapshotted, and the kernel preconditions are enforced before launch by",
           "`backend/flashinfer_kernels.py` instead). D1/D2 run on steps recorded with `--record-attention N`.", "",
           "## Catalogue", "", "| id | severity | invariant | from |", "|---|---|---|---|"]
    for inv in CATALOGUE:
        out.append(f"| {inv.check_id} | {inv.severity.value} | {inv.description} | {inv.upstream} |")
    out += ["", "## Faults", "", "`specscope run --inject NAME` (list them with `specscope run --list-faults`).", "",
            "| fault | re-creates | expected id |", "|---|---|---|"]
    for f in FAULTS:
        out.append(f"| `{f.name}` | {f.description} | {f.expected_check} |")
    for t in tables:
        out += ["", f"## Detection on {t['device']}", "",
                f"Made by `{t['command']}` on {t['date']}: the embedded models, 6 requests, batch 4, 16 new tokens,",
                "3 draft steps, attention sampled every 7 steps, plus each fault's settings. *First step* is the",
                "trace step at which the expected invariant first fired; *clean* counts errors in the same run",
                "without the fault.", "",
                "| fault | settings | expected | first step | every invariant that fired (first step) | clean |",
                "|---|---|---|---|---|---|"]
        for r in t["rows"]:
            settings = ", ".join(f"{k}={v}" for k, v in r["settings"].items()) or "defaults"
            also = ", ".join(f"{k} ({v})" for k, v in sorted(r["also_caught_by"].items(), key=lambda kv: kv[1]))
            first = r["first_step"] if r["detected"] else "**missed**"
            out.append(f"| `{r['fault']}` | {settings} | {r['expected']} | {first} | {also} | {r['clean_errors']} |")
    out += ["", "## Notes", "",
            "- `max-seq-len-q-override` on the H200: XQA cannot regroup `bs*T` query rows into requests of K",
            "  tokens when `bs*T % K != 0`, so the first affected capture fails: our argument check raises before",
            "  the launch (K1), the run exits with one line, and the trace keeps the failing capture step with the",
            "  metadata it was handed (I3, I6). On the CPU the reference kernel regroups silently, as trtllm-gen does",
            "  on Blackwell, and the wrong windows show up as I5/I12/I13 (and D2 on sampled steps).",
            "- `no-plan-wait`: on the CPU the engine renders the race deterministically (the plan-stream work runs",
            "  before the producer's `seq_lens` write), so the stale values trip value invariants (I5, I12, I13,",
            "  ...) too. On the H200 the fault drops the plan stream's wait and delays the producer by ~5 ms; in",
            "  the recorded run",
            "  the stale read did not land (an engine host sync, since removed, ordered the two), so only the",
            "  structural I21 fired there.",
            "- Steps are numbered in issue order; capture steps come first (iteration -1)."]
    print("\n".join(out))


if __name__ == "__main__":
    main()
