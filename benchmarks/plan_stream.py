"""Overlap plan stream: share of plan-stream time hidden under compute (target >= 90 %), and compute-stream
idle time inside iterations, measured from the CUDA-event spans of a traced GPU run.

    python benchmarks/plan_stream.py --out benchmarks/results/plan_stream.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch
from specscope.backend.engine_config import EngineConfig
from specscope.backend.session import run_session
from specscope.tracer.analysis import iteration_streams, summarize_streams
from specscope.tracer.store import TraceReader

HERE = Path(__file__).resolve().parent


def measure(label: str, model: str, draft: str, bs: int, new: int, prompt: tuple[int, int], rnd: bool,
            keep: str | None) -> dict:
    cfg = EngineConfig(model=model, draft=draft, device="cuda", dtype="bfloat16", batch_size=bs, num_requests=bs,
                       max_new_tokens=new, spec_steps=3, cuda_graph=True, plan_stream=True, prompt_len=prompt,
                       arrival_gap=(0, 0), ignore_eos=True, graph_batch_sizes=(bs,))
    path = keep or os.path.join(tempfile.mkdtemp(), "plan.db")
    run_session(cfg, path, command="benchmarks/plan_stream.py", random_weights=rnd, overwrite=True)
    with TraceReader(path) as r:
        rows = iteration_streams(r.steps())
    s = summarize_streams(rows[2:])  # skip warm-up iterations
    s.update(model=label, batch_size=bs)
    print(f"{label:28s} bs {bs:3d}  plan hidden {s['plan_hidden_share']:.3f}  compute idle "
          f"{s['compute_idle_share']:.3f}  ({s['iterations']} iterations)", flush=True)
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/plan_stream.json")
    ap.add_argument("--skip-8b", action="store_true")
    args = ap.parse_args()
    rows = [measure("tiny", "tiny", "tiny-draft", bs, 64, (64, 160), False, None) for bs in (1, 16, 64)]
    if not args.skip_8b:
        rows.append(measure("llama3-8b (random weights)", str(HERE / "configs/llama3-8b"),
                            str(HERE / "configs/llama3-8b-draft"), 64, 32, (256, 512), True, None))
    out = dict(benchmark="plan_stream", target_hidden_share=0.90, gpu=torch.cuda.get_device_name(),
               torch=torch.__version__, cuda=torch.version.cuda, date=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
               command="python benchmarks/plan_stream.py " + " ".join(os.sys.argv[1:]), rows=rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
