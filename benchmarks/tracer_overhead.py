"""Tracer overhead on the GPU: iteration time traced / untraced, CUDA graphs and the plan stream on (target <= 1.02),
with torch.profiler (CPU + CUDA activities) on the same engine as the anchor.

Each cell (model pair, batch size) runs the same workload (every request arrives at once, fixed length, EOS
ignored) in three arms, rotated in every repeat (off, on, profiler; then profiler, on, off; ...): no trace,
specscope's trace, and no trace under torch.profiler. Per run: the median wall time of steady iterations (the
whole batch decoding, no prefill, the first 3 dropped). Per repeat: the ratios on / off and profiler / off of
runs made back to back. Per cell: median and min-max of those ratios (single pairs vary +-25 % on shared
machines, so read the median). Models are loaded once per pair (benchmarks/engine_speed.py's Bench).

    python benchmarks/tracer_overhead.py                       # tiny and the 8B shape, bs 1/16/64, 5 repeats
    SPECSCOPE_SNAPSHOT_RING=0 python benchmarks/tracer_overhead.py --models tiny   # the per-step host copies

Writes benchmarks/results/tracer_overhead.json and .md (GPU, versions, date, command inside).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from engine_speed import Bench, BenchError, Preset, load_torch, presets, steady, summarize, versions  # noqa: E402

TARGET = 1.02
ARMS = ("off", "on", "profiler")


def run_arm(bench: Bench, p: Preset, bs: int, arm: str, plan_stream: bool, tmp: str) -> float:
    """One engine run in `arm`; returns the median wall ms of its steady iterations."""
    from specscope.backend.engine_config import EngineConfig

    torch = bench.torch
    bench._arm = "fused"  # the engine's default ops (flashinfer's fused kernels where they exist)
    cfg = EngineConfig(model=p.model, draft=p.draft, device=bench.device, dtype=bench.dtype, batch_size=bs,
                       num_requests=bs, max_new_tokens=p.new_tokens, spec_steps=bench.spec_steps, page_size=64,
                       cuda_graph=True, plan_stream=plan_stream, seed=0, prompt_len=p.prompt, arrival_gap=(0, 0),
                       ignore_eos=True, graph_batch_sizes=(bs,))
    path = os.path.join(tmp, f"{arm}-{time.perf_counter_ns()}.db") if arm == "on" else None
    prof = None
    if arm == "profiler":
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                  torch.profiler.ProfilerActivity.CUDA])
    with prof if prof is not None else contextlib.nullcontext():
        res = bench.session.run_session(cfg, path, command="benchmarks/tracer_overhead.py",
                                        random_weights=p.random_weights)
        if bench.device == "cuda":
            torch.cuda.synchronize()
    if path:
        os.remove(path)
    idx = steady(res.stats, bs)
    if not idx:
        raise BenchError(f"{p.label} bs {bs}: no steady iterations (raise the request length)")
    return statistics.median(res.stats.iteration_s[i] * 1e3 for i in idx)


def run_cell(bench: Bench, p: Preset, bs: int, repeats: int, plan_stream: bool, tmp: str) -> dict[str, Any]:
    """`repeats` rotations of the three arms; ratios are taken within a repeat."""
    runs: dict[str, list[float]] = {a: [] for a in ARMS}
    ratio_on, ratio_prof = [], []
    for i in range(repeats):
        order = ARMS if i % 2 == 0 else tuple(reversed(ARMS))
        got = {a: run_arm(bench, p, bs, a, plan_stream, tmp) for a in order}
        for a in ARMS:
            runs[a].append(got[a])
        ratio_on.append(got["on"] / got["off"])
        ratio_prof.append(got["profiler"] / got["off"])
    return dict(model=p.label, batch_size=bs, plan_stream=plan_stream, repeats=repeats,
                wall_ms={a: summarize(v) for a, v in runs.items()}, run_ms=runs,
                ratio_traced=summarize(ratio_on), ratio_profiler=summarize(ratio_prof),
                meets_target=statistics.median(ratio_on) <= TARGET)


def _fmt(s: dict[str, float], prec: int = 3) -> str:
    return f"{s['median']:.{prec}f} [{s['min']:.{prec}f}–{s['max']:.{prec}f}]"


def markdown(doc: dict[str, Any]) -> str:
    """The results as a markdown table with the provenance above it."""
    v = doc["versions"]
    out = ["# Tracer overhead (`benchmarks/tracer_overhead.py`)", "",
           f"- GPU: {doc['gpu']} (SM {doc['capability']}), {doc['date']}",
           f"- versions: torch {v.get('torch')}, CUDA {v.get('cuda')}, flashinfer {v.get('flashinfer')}, "
           f"Python {v.get('python')}, specscope commit {v.get('git_commit')}",
           f"- command: `{doc['command']}`; SPECSCOPE_SNAPSHOT_RING={doc['snapshot_ring_env'] or '(unset: on)'}",
           f"- CUDA graphs on, plan stream {'on' if doc['plan_stream'] else 'off'}, {doc['spec_steps']} draft steps; "
           f"{doc['repeats']} rotations of off / traced / torch.profiler (CPU + CUDA) per cell; ratio = arm / off "
           "within a rotation, median [min–max]; wall = median of steady iterations per run.",
           f"- target (issue 12): traced / untraced ≤ {TARGET}.", "",
           "| model | bs | untraced ms | traced ms | profiler ms | traced / untraced | profiler / untraced | ≤ 1.02 |",
           "|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        w = r["wall_ms"]
        out.append(f"| {r['model']} | {r['batch_size']} | {w['off']['median']:.2f} | {w['on']['median']:.2f} | "
                   f"{w['profiler']['median']:.2f} | {_fmt(r['ratio_traced'])} | {_fmt(r['ratio_profiler'])} | "
                   f"{'yes' if r['meets_target'] else '**no**'} |")
    out.append("")
    return "\n".join(out)


def write(args: argparse.Namespace, argv: list[str], torch: Any, rows: list[dict[str, Any]], t0: float) -> None:
    """The JSON and markdown results of the cells measured so far."""
    doc = dict(benchmark="tracer_overhead", target_ratio=TARGET, gpu=torch.cuda.get_device_name(),
               capability=".".join(map(str, torch.cuda.get_device_capability())), versions=versions(torch),
               date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
               command="python benchmarks/tracer_overhead.py " + shlex.join(argv), repeats=args.repeats,
               plan_stream=not args.no_plan_stream, spec_steps=args.spec_steps, quick=args.quick,
               snapshot_ring_env=os.environ.get("SPECSCOPE_SNAPSHOT_RING"),
               seconds=round(time.perf_counter() - t0, 1), rows=rows)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    out.with_suffix(".md").write_text(markdown(doc))


def main(argv: list[str] | None = None) -> int:
    """Run the cells and write the results; returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tiny,llama3-8b", help="comma list of: tiny, llama3-8b")
    ap.add_argument("--batch-sizes", default="1,16,64")
    ap.add_argument("--repeats", type=int, default=5, help="rotations of the three arms per cell (>= 5)")
    ap.add_argument("--no-plan-stream", action="store_true", help="plan stream off (it is on by default)")
    ap.add_argument("--spec-steps", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="shorter requests (engine_speed's quick presets)")
    ap.add_argument("--out", default=str(HERE / "results" / "tracer_overhead.json"))
    args = ap.parse_args(argv)
    try:
        torch = load_torch()
        bench = Bench(torch, args.spec_steps)
        table = presets(args.quick)
        rows: list[dict[str, Any]] = []
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            for name in args.models.split(","):
                p = table[name]
                for bs in [int(b) for b in args.batch_sizes.split(",")]:
                    row = run_cell(bench, p, bs, args.repeats, not args.no_plan_stream, tmp)
                    rows.append(row)
                    print(f"{p.label[:26]:26s} bs {bs:3d}  off {row['wall_ms']['off']['median']:7.3f} ms  "
                          f"traced {_fmt(row['ratio_traced'])}  profiler {_fmt(row['ratio_profiler'])}", flush=True)
                    write(args, argv, torch, rows, t0)  # after every cell: a time limit keeps what was measured
                bench.drop_models()
    except BenchError as e:
        print(f"tracer_overhead: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out} and its .md in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
