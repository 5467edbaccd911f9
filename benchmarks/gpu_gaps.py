"""Where the GPU idles inside a steady engine iteration, and which host code was running when it did (GPU host).

For each `model:bs` cell: a warm-up run, then 3 alternating untraced / traced runs without a profiler (their
median iteration times, plan stream on), then one untraced and one traced run (plan stream off) under
torch.profiler (CPU + CUDA). The engine's NVTX phases and its main methods are wrapped in `record_function`
ranges; every GPU gap of >= 3 µs between kernels launched in a steady iteration is charged to the innermost three
CPU ranges around the launch of the kernel after it. Printed per iteration: GPU busy time, the host's time blocked
in a CUDA synchronize, the largest gaps by where they were charged, and the CPU time inside each range. The
profiler slows the host (about 1.5x here), so read the gaps as "where", not "how much".

    python benchmarks/gpu_gaps.py llama3-8b:1 tiny:1 llama3-8b:64
    python benchmarks/gpu_gaps.py --plan-stream tiny:1      # profile with the plan stream on as well
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import engine_speed  # noqa: E402
import torch  # noqa: E402
from specscope.backend import engine as engine_mod  # noqa: E402
from specscope.backend import memory, model_runner, request  # noqa: E402
from specscope.backend.engine_config import EngineConfig  # noqa: E402
from specscope.tracer import recorder as recorder_mod  # noqa: E402
from specscope.tracer import stamps as stamps_mod  # noqa: E402

GAP_US = 3.0
record = torch.profiler.record_function


def _instrument() -> None:
    """Wrap the engine's NVTX phases, spans and main methods in profiler ranges."""

    @contextlib.contextmanager
    def phase(name: str, enabled: bool = True) -> Any:
        with record(name):
            yield

    engine_mod.nvtx = phase
    span = engine_mod.Engine._span

    def timed_span(self: Any, rec: Any, stream: str, name: str, cuda_stream: Any) -> Any:
        stack = contextlib.ExitStack()
        stack.enter_context(record(f"span {stream}:{name}"))
        stack.enter_context(span(self, rec, stream, name, cuda_stream))
        return stack

    engine_mod.Engine._span = timed_span
    targets = [(engine_mod.Engine, "E.", ("_upload", "_batch", "_read", "_sample", "_keep_first_drafts",
                                          "_finish")),
               (model_runner.ModelRunner, "MR.", ("prepare", "execute", "begin_for", "record_snapshot")),
               (recorder_mod.Recorder, "R.", ("end_step", "poll", "snapshot_ring", "snapshot_pack",
                                              "snapshot_host", "begin_step", "graph_span", "_resolve", "_send")),
               (stamps_mod.StampRing, "S.", ("stamp", "drain")),
               (request.Request, "Req.", ("commit",)), (memory.RequestKV, "KV.", ("ensure", "shrink"))]
    for cls, prefix, names in targets:
        for name in names:
            setattr(cls, name, _ranged(getattr(cls, name), prefix + name))


def _ranged(f: Any, label: str) -> Any:
    @functools.wraps(f)
    def g(*a: Any, **k: Any) -> Any:
        with record(label):
            return f(*a, **k)
    return g


def analyse(trace_path: str, stats: Any, bs: int, label: str) -> None:
    """Print the gaps and CPU ranges of the steady iterations of one profiled run."""
    events = [e for e in json.load(open(trace_path))["traceEvents"] if e.get("ph") == "X"]
    gpu, launch, ranges = [], {}, []
    for e in events:
        cat, corr = e.get("cat", ""), e.get("args", {}).get("correlation")
        if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            gpu.append((e["ts"], e["ts"] + e["dur"], corr, e["name"][:30]))
        elif cat in ("cuda_runtime", "cuda_driver"):
            launch[corr] = e["ts"]
        elif cat == "user_annotation":
            ranges.append((e["ts"], e["ts"] + e["dur"], e["name"]))
    gpu.sort()
    by_number = {int(r[2].split()[1]): r for r in ranges if r[2].startswith("iteration ")}
    iterations = [by_number[i] for i in engine_speed.steady(stats, bs) if i in by_number]
    syncs = [e for e in events if e.get("name") in ("cudaEventSynchronize", "cudaStreamSynchronize",
                                                    "cudaDeviceSynchronize")]
    gaps: dict[str, float] = collections.defaultdict(float)
    counts: collections.Counter[str] = collections.Counter()
    cpu: dict[str, float] = collections.defaultdict(float)
    busy_total = span_total = wait_total = 0.0
    for lo, hi, _ in iterations:
        inside = [r for r in ranges if r[0] >= lo and r[1] <= hi and not r[2].startswith("iteration ")]
        for r in inside:
            cpu[r[2]] += r[1] - r[0]
        wait_total += sum(e["dur"] for e in syncs if lo <= e["ts"] <= hi)
        kernels = [k for k in gpu if k[2] in launch and lo <= launch[k[2]] <= hi]
        if not kernels:
            continue
        end, start, busy = kernels[0][1], kernels[0][0], kernels[0][1] - kernels[0][0]
        for k in kernels[1:]:
            if k[0] > end + GAP_US:
                at = launch[k[2]]
                chain = sorted((r for r in inside if r[0] <= at <= r[1]), key=lambda r: r[0] - r[1])
                key = " > ".join(r[2] for r in chain[-3:]) + " | " + k[3]
                gaps[key] += k[0] - end
                counts[key] += 1
            busy += max(0.0, k[1] - max(k[0], end))
            end = max(end, k[1])
        busy_total += busy
        span_total += end - start
    n = max(len(iterations), 1)
    walls = [hi - lo for lo, hi, _ in iterations] or [0.0]
    print(f"=== {label}: {len(iterations)} steady iterations; CPU iteration {statistics.median(walls):.0f} us; "
          f"GPU busy {busy_total / n:.0f} us; first->last kernel {span_total / n:.0f} us; "
          f"host blocked in synchronize {wait_total / n:.0f} us")
    print("  GPU gaps (us per iteration, gaps per iteration, where the next kernel was launched | kernel):")
    for key, us in sorted(gaps.items(), key=lambda x: -x[1])[:14]:
        print(f"   {us / n:7.1f}  {counts[key] / n:5.1f}  {key}")
    print("  CPU time inside each range (us per iteration):")
    for key, us in sorted(cpu.items(), key=lambda x: -x[1])[:26]:
        print(f"   {us / n:7.1f}  {key}")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    """Profile each `model:bs` cell (default: llama3-8b:1 tiny:1 llama3-8b:64); `--plan-stream` profiles with the
    plan stream on too."""
    profile_plan = [False, True] if "--plan-stream" in argv else [False]
    argv = [a for a in argv if a != "--plan-stream"]
    if not torch.cuda.is_available():
        print("gpu_gaps: error: needs a CUDA GPU", file=sys.stderr)
        return 2
    _instrument()
    bench = engine_speed.Bench(torch, 3)
    bench._arm, bench.fused_setting = "fused", "auto"
    table = engine_speed.presets(True)

    def run(p: engine_speed.Preset, bs: int, traced: bool, plan: bool, label: str | None) -> float:
        cfg = EngineConfig(model=p.model, draft=p.draft, device="cuda", dtype="bfloat16", batch_size=bs,
                           num_requests=bs, max_new_tokens=p.new_tokens, spec_steps=3, page_size=64, cuda_graph=True,
                           plan_stream=plan, seed=0, prompt_len=p.prompt, arrival_gap=(0, 0), ignore_eos=True,
                           graph_batch_sizes=(bs,))
        tmp = tempfile.mkdtemp()
        path = os.path.join(tmp, "t.db") if traced else None
        if label is None:
            res = bench.session.run_session(cfg, path, command="benchmarks/gpu_gaps.py",
                                           random_weights=p.random_weights)
            return statistics.median(res.stats.iteration_s[i] * 1e3 for i in engine_speed.steady(res.stats, bs))
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts) as prof:
            res = bench.session.run_session(cfg, path, command="benchmarks/gpu_gaps.py",
                                           random_weights=p.random_weights)
            torch.cuda.synchronize()
        out = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(out)
        analyse(out, res.stats, bs, label)
        return 0.0

    t0 = time.time()
    for cell in argv or ["llama3-8b:1", "tiny:1", "llama3-8b:64"]:
        name, bs_text = cell.split(":")
        p, bs = table[name], int(bs_text)
        run(p, bs, False, False, None)
        off, on = [], []
        for _ in range(3):
            off.append(run(p, bs, False, True, None))
            on.append(run(p, bs, True, True, None))
        print(f"##### {cell}: unprofiled iteration ms (plan stream on) untraced {[round(x, 3) for x in off]} traced "
              f"{[round(x, 3) for x in on]}; median ratio {statistics.median(on) / statistics.median(off):.3f}")
        for plan in profile_plan:
            state = "on" if plan else "off"
            run(p, bs, False, plan, f"{cell} untraced, plan stream {state}")
            run(p, bs, True, plan, f"{cell} traced, plan stream {state}")
    print(f"elapsed {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
