"""Tracer overhead on the GPU: engine iteration time traced / untraced, CUDA graphs on (target <= 1.02).

Each configuration runs the same workload (every request arrives at once, fixed length, EOS ignored) with
tracing off and on, alternating, and compares the median wall time of full-batch speculative iterations
(draft steps + verify + draft extend + the accept sync). Embedded tiny models and a Llama-3-8B-shaped
target with random weights (benchmarks/configs).

    python benchmarks/tracer_overhead.py --out benchmarks/results/tracer_overhead.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from specscope.backend.engine_config import EngineConfig
from specscope.backend.session import run_session

HERE = Path(__file__).resolve().parent


def full_batch_times(stats, bs: int) -> list[float]:
    """Iterations that decoded the whole batch and prefilled nothing."""
    return [t for t, n, p in zip(stats.iteration_s, stats.iteration_bs, stats.iteration_prefill, strict=True)
            if n == bs and not p]


def one(model: str, draft: str, bs: int, new_tokens: int, prompt: tuple[int, int], traced: bool,
        random_weights: bool) -> list[float]:
    cfg = EngineConfig(model=model, draft=draft, device="cuda", dtype="bfloat16", batch_size=bs, num_requests=bs,
                       max_new_tokens=new_tokens, spec_steps=3, page_size=64, cuda_graph=True,
                       plan_stream=False, seed=0, prompt_len=prompt, arrival_gap=(0, 0), ignore_eos=True,
                       graph_batch_sizes=(bs,))
    path = None
    if traced:
        path = os.path.join(tempfile.mkdtemp(), "t.db")
    res = run_session(cfg, path, command="benchmarks/tracer_overhead.py", random_weights=random_weights)
    times = full_batch_times(res.stats, bs)
    # Drop the first iterations (allocator and JIT warm-up) and keep steady state.
    return times[3:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/tracer_overhead.json")
    ap.add_argument("--batch-sizes", default="1,16,64")
    ap.add_argument("--repeats", type=int, default=2, help="untraced/traced pairs per configuration")
    ap.add_argument("--skip-8b", action="store_true")
    args = ap.parse_args()
    models = [("tiny", "tiny", "tiny-draft", 96, (64, 160), False)]
    if not args.skip_8b:
        models.append(("llama3-8b (random weights)", str(HERE / "configs/llama3-8b"),
                       str(HERE / "configs/llama3-8b-draft"), 48, (256, 512), True))
    rows = []
    for label, model, draft, new, prompt, rnd in models:
        for bs in [int(b) for b in args.batch_sizes.split(",")]:
            off, on = [], []
            for _ in range(args.repeats):
                off += one(model, draft, bs, new, prompt, False, rnd)
                on += one(model, draft, bs, new, prompt, True, rnd)
            med_off, med_on = statistics.median(off), statistics.median(on)
            rows.append(dict(model=label, batch_size=bs, iterations_untraced=len(off), iterations_traced=len(on),
                             untraced_ms=med_off * 1e3, traced_ms=med_on * 1e3, ratio=med_on / med_off))
            print(f"{label:28s} bs {bs:3d}  untraced {med_off * 1e3:8.3f} ms  traced {med_on * 1e3:8.3f} ms  "
                  f"ratio {med_on / med_off:.3f}", flush=True)
    out = dict(benchmark="tracer_overhead", target_ratio=1.02, gpu=torch.cuda.get_device_name(),
               capability=".".join(map(str, torch.cuda.get_device_capability())), torch=torch.__version__,
               cuda=torch.version.cuda, date=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
               command="python benchmarks/tracer_overhead.py " + " ".join(os.sys.argv[1:]), rows=rows)
    try:
        import flashinfer

        out["flashinfer"] = flashinfer.__version__
    except ImportError:
        pass
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
