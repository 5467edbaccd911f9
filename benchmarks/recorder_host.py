"""The recorder's host cost per recorded step: what a GPU iteration pays on its host thread (runs anywhere).

A traced run of the embedded models (CUDA graphs, or their emulation on the CPU; snapshot ring on) goes through the
real recorder; every recorder and snapshot call on the engine's thread is timed (`time.perf_counter_ns` around each
call, nested calls counted once; stamps and the resolve/encode/send calls inside `poll` on their own too), and the
batches it hands the writer are encoded again afterwards as `write_raw_steps` does (the engine's encoding cost),
alternating with a plain pickle of the same batch (arrays as bytes). Per graph replay: median
µs of each call, and bytes per step on the pipe. `--device cuda` measures it on a GPU host (real stamps and
drains). On the CPU every call also runs between CPU kernels (most likely it pays the cold caches they leave): a
call timed in the run costs 5-7x what it does in a tight loop (`snapshot_host`: 30-40 µs vs 6 µs on the 2-core
VM). Compare CPU runs of this script with each other (A/B), not with a GPU host's numbers.

    python benchmarks/recorder_host.py                 # bs 1 and 16, writes benchmarks/results/recorder_host.json
    python benchmarks/recorder_host.py --device cuda --batch-sizes 1 --new-tokens 40   # the committed result: H200 host
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import pickle
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ENCODE_REPEATS = 20
CALLS = {"tracer.recorder.Recorder": ("begin_step", "snapshot_ring", "snapshot_pack", "snapshot_host", "end_step",
                                      "_resolve", "assign_index", "fired", "wait", "graph_span", "poll", "_send"),
         "tracer.stamps.StampRing": ("stamp",),
         "backend.model_runner.ModelRunner": ("record_snapshot",)}


def measure(bs: int, new_tokens: int, device: str = "cpu") -> dict[str, Any]:
    """One traced CPU run at batch size `bs`; per-call host µs on graph replays, encode µs and bytes per step."""
    import importlib

    from specscope.backend.engine_config import EngineConfig
    from specscope.backend.session import run_session
    from specscope.tracer import pipe_format, process_writer
    from specscope.tracer.step_batch import LayoutTable

    times: dict[str, list[int]] = {}
    depth = [0]
    top_ns = [0]  # every timed call that no other timed call encloses: the recorder's whole host time

    def timed(f: Any, name: str) -> Any:
        @functools.wraps(f)
        def g(*a: Any, **k: Any) -> Any:
            depth[0] += 1
            t = time.perf_counter_ns()
            try:
                return f(*a, **k)
            finally:
                depth[0] -= 1
                dt = time.perf_counter_ns() - t
                if depth[0] == 0:
                    top_ns[0] += dt
                if depth[0] == 0 or name in ("_resolve", "record_snapshot", "stamp", "_send"):
                    times.setdefault(name, []).append(dt)
        return g

    saved = []
    for path, names in CALLS.items():
        mod, cls_name = path.rsplit(".", 1)
        cls = getattr(importlib.import_module(f"specscope.{mod}"), cls_name)
        for n in names:
            saved.append((cls, n, getattr(cls, n)))
            setattr(cls, n, timed(getattr(cls, n), n))
    batches: list[list[dict[str, Any]]] = []
    orig_steps = process_writer.ProcessTraceWriter.write_raw_steps

    def keep(self: Any, raws: list[dict[str, Any]]) -> None:
        batches.append(list(raws))
        orig_steps(self, raws)

    process_writer.ProcessTraceWriter.write_raw_steps = keep  # type: ignore[method-assign]
    try:
        cfg = EngineConfig(model="tiny", draft="tiny-draft", device=device, batch_size=bs, num_requests=bs,
                           max_new_tokens=new_tokens, spec_steps=3, prompt_len=(32, 48), arrival_gap=(0, 0),
                           ignore_eos=True, plan_stream=True, cuda_graph=True)
        with tempfile.TemporaryDirectory() as tmp:
            run_session(cfg, os.path.join(tmp, "t.db"), command="benchmarks/recorder_host.py", check=False)
    finally:
        for cls, n, f in saved:
            setattr(cls, n, f)
        process_writer.ProcessTraceWriter.write_raw_steps = orig_steps  # type: ignore[method-assign]
    replays = [b for b in batches if all(s["header"]["graph"] == "replay" for s in b)]
    encode_us, pickle_us, sizes = [], [], []
    table = LayoutTable()  # as the writer keeps it: replays' layouts sent once
    for b in replays:
        for _ in range(ENCODE_REPEATS):  # alternating: what write_raw_steps sends (msgpack), and a plain pickle
            t = time.perf_counter_ns()
            data = b"".join(pipe_format.encode_steps(b, table))
            encode_us.append((time.perf_counter_ns() - t) / 1e3 / len(b))
            t = time.perf_counter_ns()
            pickle.dumps(("steps", b), protocol=pickle.HIGHEST_PROTOCOL)
            pickle_us.append((time.perf_counter_ns() - t) / 1e3 / len(b))
        sizes.append(len(data) / len(b))
    steps = max(1, len(times.get("end_step", [])))
    # Per call: the median, and its total over the run per recorded step (polls that resolve a batch every few
    # iterations and polls that resolve every iteration compare by the total, not by the median).
    calls = {n: {"calls": len(v), "median_us": round(statistics.median(v) / 1e3, 2),
                 "us_per_step": round(sum(v) / 1e3 / steps, 2)} for n, v in sorted(times.items())}
    return dict(batch_size=bs, device=device, calls=calls, replay_batches=len(replays), steps=steps,
                recorder_us_per_step=round(top_ns[0] / 1e3 / steps, 2),
                encode_us_per_step=round(statistics.median(encode_us), 2) if encode_us else None,
                pickle_wire_us_per_step=round(statistics.median(pickle_us), 2) if pickle_us else None,
                pipe_bytes_per_step=round(statistics.median(sizes)) if sizes else None)


def main(argv: list[str] | None = None) -> int:
    """Measure and write the result file."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-sizes", default="1,16")
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda on a GPU host (the host cost a GPU run pays)")
    ap.add_argument("--out", default=str(HERE / "results" / "recorder_host.json"))
    args = ap.parse_args(argv)
    try:
        sizes = [int(b) for b in args.batch_sizes.split(",")]
    except ValueError:
        print(f"recorder_host: error: --batch-sizes wants a comma list of ints, got {args.batch_sizes!r}",
              file=sys.stderr)
        return 2
    rows = []
    for bs in sizes:
        row = measure(bs, args.new_tokens, args.device)
        rows.append(row)
        per = ", ".join(f"{n} {c['median_us']}" for n, c in row["calls"].items())
        print(f"bs {bs:3d}: recorder {row['recorder_us_per_step']} µs per step in all ({row['steps']} steps); encode "
              f"{row['encode_us_per_step']} µs/step (as a pickle, arrays as bytes: {row['pickle_wire_us_per_step']}), "
              f"{row['pipe_bytes_per_step']} B/step; {per}")
        print("        per step: " + ", ".join(f"{n} {c['us_per_step']}" for n, c in row["calls"].items()))
    doc = dict(benchmark="recorder_host", machine=platform.processor() or platform.machine(),
               cpus=os.cpu_count(), load_1min=os.getloadavg()[0], python=platform.python_version(),
               date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
               command="python " + " ".join(["benchmarks/recorder_host.py", *(argv or sys.argv[1:])]), rows=rows)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
