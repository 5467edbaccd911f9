#!/usr/bin/env python
"""Inject every fault on one device, check the trace, and record which invariants caught it and when.

    python scripts/detection_table.py --device cpu --out docs/detection-cpu.json
    python scripts/detection_table.py --device cuda --out docs/detection-h200.json   # on a GPU host

Each fault runs under its smallest biting settings (backend/faults.py FAULT_SETTINGS) on the embedded models;
the same run without the fault must be clean. The first detected step is the trace's step index. Beside the
detection, each row keeps the fault's own accounting (how often it fired, first where), which the checks never
read. GPU-only faults are skipped on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from specscope.backend.engine_config import EngineConfig
from specscope.backend.faults import FAULT_SETTINGS, FAULTS
from specscope.backend.session import run_session
from specscope.tracer.checks import check_steps
from specscope.tracer.schema import Severity
from specscope.tracer.store import TraceReader


def run(device: str, faults: frozenset[str], settings: dict, tmp: Path, name: str) -> tuple[list, int, str, list, str]:
    cfg = dict(model="tiny", draft="tiny-draft", device=device, dtype="auto", batch_size=4, num_requests=6,
               max_new_tokens=16, spec_steps=3, prompt_len=(16, 80), record_attention=7)
    cfg.update(settings)
    path = tmp / f"{name}.db"
    failure = ""
    try:
        device_name = run_session(EngineConfig(**cfg, faults=faults), str(path),
                                  command=f"detection_table {name}").device_name
    except Exception as e:  # noqa: BLE001 - a fault may crash the run (as upstream); its trace is still there
        failure = " ".join(f"{type(e).__name__}: {e}".split())
        print(f"  {name}: the run failed: {failure}", flush=True)
        device_name = device
    with TraceReader(str(path)) as r:
        return list(check_steps(r.steps(), r.run)), r.num_steps(), device_name, r.fault_report(), failure


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default=None, help="run one fault (used for faults that end the CUDA context)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    rows = []
    device_name = args.device
    for f in FAULTS:
        if (f.gpu_only and args.device == "cpu") or (args.only is not None and f.name != args.only):
            continue
        if f.gpu_only and args.only is None:
            # A GPU-only fault may fault for real (a sticky CUDA error ends the process's CUDA context), so it
            # runs in a process of its own, its clean twin first.
            sub = tmp / f"{f.name}.json"
            subprocess.run([sys.executable, __file__, "--device", args.device, "--only", f.name, "--out", str(sub)],
                           check=False)
            if sub.exists():
                rows.extend(json.loads(sub.read_text())["rows"])
                r = rows[-1]
                print(f"{f.name:32s} expected {f.expected_check:4s} first step {r['first_step']!s:>5s}  "
                      f"fired {r['fired']} (first {r['first_fired']})  all {sorted(r['also_caught_by'])}  "
                      f"clean errors {r['clean_errors']}", flush=True)
            else:
                print(f"  {f.name}: its process wrote no result", flush=True)
            continue
        settings = FAULT_SETTINGS[f.name]
        clean, _, _, _, clean_failure = run(args.device, frozenset(), settings, tmp, f.name + "-clean")
        bad, steps, device_name, report, failure = run(args.device, frozenset({f.name}), settings, tmp, f.name)
        errors = [v for v in bad if v.severity == Severity.ERROR]
        ids: dict[str, int] = {}
        for v in errors:
            ids.setdefault(v.check_id, v.step)
        rep = next((x for x in report if x.fault == f.name), None)
        rows.append(dict(fault=f.name, settings=settings, expected=f.expected_check,
                         detected=f.expected_check in ids, first_step=ids.get(f.expected_check),
                         also_caught_by=ids, steps=steps, fired=rep.fired if rep else 0,
                         first_fired=rep.first_step if rep else None, run_failed=failure,
                         clean_errors=sum(v.severity == Severity.ERROR for v in clean) + bool(clean_failure)))
        print(f"{f.name:32s} expected {f.expected_check:4s} first step {ids.get(f.expected_check)!s:>5s}  "
              f"fired {rows[-1]['fired']} (first {rows[-1]['first_fired']})  all {sorted(ids)}  "
              f"clean errors {rows[-1]['clean_errors']}", flush=True)
    Path(args.out).write_text(json.dumps(dict(device=device_name, date=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                                              command=f"python scripts/detection_table.py --device {args.device}",
                                              rows=rows), indent=1))
    if args.only is not None:
        os._exit(0)  # a fault that killed the CUDA context leaves device objects whose destructors would abort


if __name__ == "__main__":
    main()
