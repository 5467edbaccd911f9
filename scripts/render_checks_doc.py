#!/usr/bin/env python
"""Write docs/checks.md from the invariant catalogue, the fault list and the detection-table JSON files.

    python scripts/render_checks_doc.py docs/detection-cpu.json [docs/detection-h200.json] > docs/checks.md

A detection table without fault accounting in its rows (trace format 1) is left out: its entries came from engine
flags, which the catalogue does not read.
"""

from __future__ import annotations

import json
import sys

from check_coverage import matrix  # scripts/ is on sys.path when this script runs
from specscope.backend.faults import FAULTS
from specscope.tracer.checks import CATALOGUE, COLLAPSE_VERIFIES

H200 = ("python scripts/detection_table.py --device cuda --out docs/detection-h200.json  # on the H200, then:\n"
        "python scripts/render_checks_doc.py docs/detection-cpu.json docs/detection-h200.json > docs/checks.md")


def _esc(s: str) -> str:
    return s.replace("|", "\\|")


def main() -> None:
    tables = [json.load(open(p)) for p in sys.argv[1:]]
    tables = [t for t in tables if all("fired" in r for r in t["rows"])]
    out = ["# Checks: the invariant catalogue and what each injected fault trips", "",
           "`specscope check TRACE` runs every invariant below over every recorded step (exit 0 clean, 1 on any",
           "error-severity violation, 2 if the trace cannot be read; `--json` prints `violations`, each with `id`,",
           "`severity`, `step`, `request_id`, `message` and the cell: `array`, `row`, `col`, `found`, `expected`,",
           "and `not_recorded`: each invariant the trace's facts could not judge, why, on how many steps).",
           "`--write` stores the verdicts in the trace for the viewers, `--list [--json]` prints this catalogue.",
           "For a trace recorded with `--inject`, `check` also says how often each fault fired and what caught it,",
           "or why it never fired.",
           "",
           "**Every invariant is value-based**: it judges facts the trace recorded — the values the kernels",
           "consumed (metadata snapshots and request rows), the times the device recorded (spans: `%globaltimer`",
           "stamps the GPU wrote itself, the host clock on the CPU, integer nanoseconds on one clock), the wait edges",
           "the engine really enqueued, and the calls that raised (their message verbatim). None reads a flag the",
           "engine writes about itself or a fault switch; each step's `faults_fired` is accounting for the report",
           "above and never an input. So the catalogue checks a trace recorded from a backend specscope did not",
           "write.",
           "",
           "Recorded facts the stream checks use (names documented in `docs/trace-format.md`): span `producers`",
           "(compute stream, around the `req_to_token` and `seq_lens` writes a verify / draft extend depends on),",
           "span `metadata` (the stream that prepared the step's metadata: `plan` under the overlap plan stream,",
           "else `compute`), span `forward` (the launch); wait edges `plan` -> `compute`/`producers` and",
           "`compute` -> `plan`/`metadata`. On the CPU the plan stream is emulated in host order, so a wait the",
           "engine asks for is recorded as it would be enqueued and the spans' host times show the order the work",
           "ran in.",
           "",
           "The ids follow `reference/sglang-trtllm-mha.md` §7; I29-I35 are bug classes added with trace v2. I20,",
           "I23-I27 are not checked from traces: no host syncs are visible in metadata, our fix-up hook has no",
           "buffers, the workspace is not snapshotted, and the kernel preconditions are enforced before launch by",
           "`backend/flashinfer_kernels.py` instead (a rejected launch is a recorded call error, K1). D1/D2 run on",
           f"steps recorded with `--record-attention N`. I35 needs {COLLAPSE_VERIFIES} verifies in a row.", "",
           "## Order of the report",
           "",
           "`check` lists the invariants in the order of their first violation: by step, then severity (errors",
           "before warnings), then id (I5 before I16); `--json` rows follow the same order, and the fault report",
           "names its catches in it. The first wrong step explains a bug best: the value that was wrong there is the",
           "cause, and what later steps do with it (KV written to the wrong slot, positions shifted by the same",
           "amount, acceptance collapsing) often fires other invariants as consequences. Within one step an error",
           "names a value a kernel consumed wrongly, while a warning there is usually a symptom of the same value.",
           "Read from the top; the later groups are worth a look once the first is explained.",
           "",
           "## Catalogue", "", "| id | severity | invariant | value-based: the recorded facts it reads | from |",
           "|---|---|---|---|---|"]
    for inv in CATALOGUE:
        out.append(f"| {inv.check_id} | {inv.severity.value} | {_esc(inv.description)} | {_esc(inv.reads)} | "
                   f"{inv.upstream} |")
    coverage, unjustified = matrix()
    if unjustified:
        sys.exit("specscope: error: the fact-coverage matrix has empty cells without a reason: "
                 + ", ".join(unjustified) + " (scripts/check_coverage.py JUSTIFY)")
    out += ["", coverage]
    out += ["", "## Faults", "", "`specscope run --inject NAME` (list them with `specscope run --list-faults`).", "",
            "| fault | re-creates | expected id |", "|---|---|---|"]
    for f in FAULTS:
        gpu = " (GPU only)" if f.gpu_only else ""
        out.append(f"| `{f.name}`{gpu} | {_esc(f.description)} | {f.expected_check} |")
    for t in tables:
        out += ["", f"## Detection on {t['device']}", "",
                f"Made by `{t['command']}` on {t['date']}: the embedded models, 6 requests, batch 4, 16 new tokens,",
                "3 draft steps, attention sampled every 7 steps, plus each fault's settings. *First step* is the",
                "trace step at which the expected invariant first fired; *fired* is the fault's own accounting (how",
                "many steps it changed, and the first), which no check reads; *clean* counts errors in the same run",
                "without the fault.", "",
                "| fault | settings | expected | first step | fired (first) | every invariant that fired (first step) "
                "| clean |", "|---|---|---|---|---|---|---|"]
        for r in t["rows"]:
            settings = ", ".join(f"{k}={v}" for k, v in r["settings"].items()) or "defaults"
            also = ", ".join(f"{k} ({v})" for k, v in sorted(r["also_caught_by"].items(), key=lambda kv: kv[1]))
            first = r["first_step"] if r["detected"] else "**missed**"
            fired = f"{r['fired']} ({r['first_fired']})" if r["fired"] else "**never**"
            out.append(f"| `{r['fault']}` | {settings} | {r['expected']} | {first} | {fired} | {also} | "
                       f"{r['clean_errors']} |")
        missing = [f.name for f in FAULTS if f.name not in {r["fault"] for r in t["rows"]}
                   and (not f.gpu_only or "cpu" not in t["device"].lower())]
        if missing:
            out += ["", "Not in this table (faults the table's run did not inject): "
                    + ", ".join(f"`{m}`" for m in missing) + "."]
    if not any("cpu" not in t["device"].lower() for t in tables):
        out += ["", "## Detection on the H200", "",
                "No H200 table is given. To make it:",
                "", "```bash", H200, "```"]
    out += ["", "## Notes", "",
            "- `max-seq-len-q-override`: on the CPU the reference kernel regroups `bs*T` query rows into requests",
            "  of K tokens silently, as trtllm-gen does on Blackwell: I3/I6 fire at the first capture and the wrong",
            "  windows show up as I5/I12/I13 (and D2 on sampled steps). On SM90, XQA cannot regroup when",
            "  `bs*T % K != 0`: the argument check raises before the launch, the trace keeps the failing step with",
            "  the metadata it was handed and the error as a call error (K1, I3, I6), and the run exits with one line.",
            "- `no-plan-wait`: on the CPU the engine renders the race deterministically: the unordered plan work runs",
            "  before the producer's `seq_lens` write, so its `metadata` span starts inside `producers` (I21 from the",
            "  timestamps; no wait edge) and the stale values trip value invariants (I5, I12, I13, I34). On a GPU the",
            "  fault drops the plan stream's wait and delays the producer by 10 ms. On the H200 (2026-12-01) the plan",
            "  work still started after the delayed producers ended on the GPU clock (host syncs in the plan path",
            "  drain the compute stream first), so I21 fired on the missing wait edge, not on timestamps.",
            "- `stale-page-table`: I19 needs the stale cell to hold what the graph's page-table buffer held before",
            "  (recorded at an earlier capture or replay of the same buffer); a wrong cell nobody held is I10 only.",
            "- `wild-page-id` (GPU only) really faults: the illegal memory access is a sticky CUDA error. The run",
            "  exits with one line, and the trace keeps the host-side record of every step still pending (header,",
            "  requests, host arrays such as `seq_lens_cpu`; device snapshots may never have landed) with the step",
            "  the error hit marked by a fatal call error carrying the error verbatim (K1).",
            "- Steps are numbered in launch order (a forward is numbered when it is launched); capture steps come",
            "  first (iteration -1)."]
    print("\n".join(out))


if __name__ == "__main__":
    main()
