#!/usr/bin/env python
"""Run a grid of clean (fault-free) configurations and report every error the catalogue finds (there must be none).

    python scripts/clean_grid.py --device cpu [--quick] [--out grid.json]

The grid covers seeds, batch sizes 1-12, page sizes 16-128, spec steps 0-7, T != K, temperature > 0, CUDA graphs
on and off and the plan stream on and off: not the full cross product (thousands of runs) but a covering set in
which every value of every axis appears with several values of the others. `--quick` runs every fourth config.
Exit 0 when every run is clean (I7 warnings allowed where T != K: the graph's static cu_seqlens_q keeps stride
K by design), 1 otherwise.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path

from specscope.backend.engine_config import EngineConfig
from specscope.backend.session import run_session
from specscope.tracer.checks import check_steps
from specscope.tracer.store import TraceReader


def grid() -> list[dict]:
    """The covering set of configurations."""
    out = []
    pages = (16, 32, 64, 128)
    for k, (bs, spec) in enumerate(itertools.product(range(1, 13), range(0, 8))):
        if (bs + spec) % 2:  # half of the (bs, spec) plane, still every bs with every parity of spec
            continue
        cfg = dict(seed=k, batch_size=bs, num_requests=bs + 2 + k % 3, page_size=pages[k % 4], spec_steps=spec,
                   cuda_graph=k % 3 != 2, plan_stream=spec > 0 and k % 2 == 0, max_new_tokens=10 + k % 7)
        if spec and k % 5 == 1:
            cfg["verify_tokens"] = max(2, spec + 1 + (2 if k % 2 else -1))  # T != K
        if spec and k % 4 == 3:
            cfg["temperature"] = 0.6 + 0.1 * (k % 3)
        out.append(cfg)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    rows, bad = [], 0
    cfgs = grid()[::4] if args.quick else grid()
    for n, kw in enumerate(cfgs):
        cfg = dict(model="tiny", draft="tiny-draft" if kw["spec_steps"] else None, device=args.device,
                   prompt_len=(16, 90), **kw)
        path = tmp / f"run{n}.db"
        t0 = time.perf_counter()
        run_session(EngineConfig(**cfg), str(path), command=f"clean_grid {n}")
        with TraceReader(str(path)) as r:
            vs = list(check_steps(r.steps(), r.run))
            steps = r.num_steps()
        allowed = "verify_tokens" in kw
        errors = [v for v in vs if not (allowed and v.check_id == "I7")]
        bad += bool(errors)
        rows.append(dict(config=kw, steps=steps, violations=[v.to_dict() for v in errors[:5]],
                         num_violations=len(errors)))
        print(f"{n + 1:3d}/{len(cfgs)} {'CLEAN' if not errors else 'FAIL '} {steps:4d} steps "
              f"{time.perf_counter() - t0:5.1f} s  {kw}" + (f"  {errors[0].message}" if errors else ""), flush=True)
    print(f"{len(cfgs) - bad} of {len(cfgs)} configurations clean")
    if args.out:
        Path(args.out).write_text(json.dumps(dict(device=args.device, date=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                                                  rows=rows), indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
