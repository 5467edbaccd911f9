"""Bug-report bundle size with attention recorded on every step: 50 steps at bs 64 from a real CPU engine run.

Records (or takes) a trace of `specscope run --device cpu --batch-size 64 --record-attention 1 ...`, picks the first
window of N consecutive steps in which all 64 requests are live (no graph captures, no prefill of a newcomer), and
bundles it three ways with the same writer:

- `before`: attn_q / attn_out / attn_kv widened to float32 (a recorder that does not keep the pool's width) and
  every call's full attn_kv (no delta);
- `width only`: the pool's width, full attn_kv per call;
- `after`: the pool's width, attn_kv delta-coded per model, byte planes (the default `specscope export --bundle`).

    python benchmarks/bundle_size.py --dtype bfloat16 --out bf16.json   # benchmarks/results/bundle_size.json holds a
    python benchmarks/bundle_size.py --dtype float32 --out f32.json     # bfloat16 and a float32 run, under one header
    python benchmarks/bundle_size.py --trace T.db          # an existing trace instead of recording one
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from specscope.tracer import kv_bases
from specscope.tracer.attention_call import DTYPE_ARRAY, recorded_dtype, widen
from specscope.tracer.export.bundle import bundle_steps, write_bundle
from specscope.tracer.reader import TraceReader
from specscope.tracer.writer import TraceWriter

# 64 requests arrive over ~64 iterations (the workload's arrival gaps), so they must live long enough to all be
# running at once: short prompts, many new tokens, EOS ignored.
RUN = ["--device", "cpu", "--batch-size", "64", "--requests", "64", "--prompt-len", "16,32", "--max-new-tokens", "360",
       "--ignore-eos", "--record-attention", "1", "--quiet"]


def full_window(r: TraceReader, n: int, bs: int) -> int:
    """First step of n consecutive non-capture steps that all run `bs` requests."""
    run = 0
    for s in r.iter_summaries():
        ok = s.graph.value != "capture" and s.batch_size == bs
        run = run + 1 if ok else 0
        if run == n:
            return s.index - n + 1
    raise SystemExit(f"no {n} consecutive steps at bs {bs} in {r.path}")


def as_float32_trace(r: TraceReader, start: int, stop: int, out: str) -> None:
    """The window (and the captures its replays came from) as a recorder that widens attention writes it: float32
    attention tensors, no dtype tag."""
    with TraceWriter(out, r.run) as w:
        for new, i in enumerate(bundle_steps(r, start, stop)):
            st = r.step(i)
            if st.array("attn_q") is not None:
                dt = recorded_dtype(st)
                arrays = []
                for a in st.arrays:
                    if a.name == DTYPE_ARRAY:
                        continue
                    if a.name in ("attn_q", "attn_out", "attn_kv"):
                        v = widen(a.values, dt, a.name).astype(np.float32)
                        a = dataclasses.replace(a, dtype="float32", values=v)
                    arrays.append(a)
                st = dataclasses.replace(st, arrays=tuple(arrays))
            w.write_step(dataclasses.replace(st, index=new, violations=()))


def main() -> int:
    """Record or open the trace, bundle the window three ways, print and save the sizes."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", help="an existing trace (default: record one)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="for a recorded run")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bundle-size-")
    trace, cmd = args.trace, None
    if trace is None:
        trace = os.path.join(work, f"bs64-{args.dtype}.db")
        cmd = ["specscope", "run", *RUN, "--dtype", args.dtype, "-o", trace]
        t0 = time.time()
        subprocess.run([sys.executable, "-m", "specscope.ui.cli", *cmd[1:]], check=True)
        print(f"recorded {trace} in {time.time() - t0:.0f} s: {shlex.join(cmd)}")
    res: dict[str, object] = {"trace": trace, "trace_bytes": os.path.getsize(trace), "steps": args.steps,
                              "batch_size": args.batch_size, "load_before": os.getloadavg()}
    with TraceReader(trace) as r:
        start = full_window(r, args.steps, args.batch_size)
        stop = start + args.steps
        res.update(record_command=r.run.command, window=[start, stop], dtype=r.run.config.get("dtype"),
                   python=platform.python_version())
        first = r.step(start)
        res["recorded_dtype"] = recorded_dtype(first) if first.array("attn_q") is not None else None
        # attn_page_ids names the pages attn_kv holds (one each): the count without decoding the KV itself.
        ids = [r.step(i, arrays=("attn_page_ids",)).arrays for i in range(start, stop)]
        res["pages_per_row"] = round(float(np.mean([a[0].values.shape[0] for a in ids if a])) / args.batch_size, 2)
        sizes = {}
        for name, kw in (("width only", {"delta_kv": False}), ("after", {})):
            out = os.path.join(work, name.replace(" ", "-") + ".zip")
            t0 = time.process_time()
            m = write_bundle(r, out, start, stop, **kw)
            sizes[name] = {"bytes": os.path.getsize(out), "cpu_s": round(time.process_time() - t0, 2),
                           "kv_full_bytes": m["kv_full_bytes"], "kv_stored_bytes": m["kv_stored_bytes"],
                           "num_steps": m["num_steps"], "attention_steps": len(m["attention_steps"])}
        f32 = os.path.join(work, "f32.db")
        as_float32_trace(r, start, stop, f32)
    with TraceReader(f32) as r2:
        out = os.path.join(work, "before.zip")
        m = write_bundle(r2, out, 0, None, delta_kv=False)
        sizes["before"] = {"bytes": os.path.getsize(out), "kv_full_bytes": m["kv_full_bytes"],
                           "num_steps": m["num_steps"], "attention_steps": len(m["attention_steps"])}
    kv_bases.clear_cache()
    res["bundles"] = sizes
    res["load_after"] = os.getloadavg()
    for name in ("before", "width only", "after"):
        print(f"{name:>10}: {sizes[name]['bytes'] / 1e6:7.2f} MB  ({sizes[name]['attention_steps']} recorded calls, "
              f"{sizes[name]['num_steps']} steps)")
    print(f"window {start}:{stop} of {trace} ({res['dtype']}, {res['pages_per_row']} KV pages per row), "
          f"load {res['load_before']} -> {res['load_after']}")
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
