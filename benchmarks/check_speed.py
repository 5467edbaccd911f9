#!/usr/bin/env python
"""`specscope check` speed: the invariant catalogue of a base commit vs the working tree's, on a 100k-step trace.

    python benchmarks/check_speed.py --base 5a325b8 --steps 100000 --rounds 9 --out benchmarks/results/check_speed.json

The trace is a real clean CPU run of the embedded models (batch 8, 3 draft steps, CUDA graphs and the plan stream
on) tiled to `--steps` steps: each copy shifts step indexes, iterations and request ids, so every relation across
steps (committed lengths, committed pages, one iteration's agreement) sees a fresh run of requests, and captures
stay at the front. Both checkers feed the same in-memory steps (reading is common to both and left out, so the
ratio is the checker's own); rounds alternate base and new. The base checker is the catalogue at BASE (`git show`
of tracer/checks.py, or of the package tracer/checks/) loaded as a module of the installed package beside the
current one.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from typing import Any

import numpy as np
from specscope.tracer.schema import RunInfo, Step


def record(bs: int) -> tuple[RunInfo, list[Step]]:
    """A clean CPU run of the embedded models, read back from its trace."""
    from specscope.backend.engine_config import EngineConfig
    from specscope.backend.session import run_session
    from specscope.tracer.store import TraceReader

    cfg = dict(model="tiny", draft="tiny-draft", device="cpu", dtype="float32", batch_size=bs, num_requests=2 * bs,
               max_new_tokens=24, spec_steps=3, seed=0, prompt_len=(20, 70), page_size=16, plan_stream=True)
    path = os.path.join(tempfile.mkdtemp(prefix="check-speed-"), "base.db")
    run_session(EngineConfig(**cfg), path, command="benchmarks/check_speed.py")
    with TraceReader(path) as r:
        return r.run, list(r.steps())


def tile(steps: list[Step], n: int) -> list[Step]:
    """`steps` repeated to n steps; copies after the first drop the captures and shift index, iteration, ids."""
    body = [s for s in steps if s.iteration >= 0]
    iters = max(s.iteration for s in body) + 1
    rids = max(r.request_id for s in body for r in s.requests) + 1
    out = list(steps)
    k = 1
    while len(out) < n:
        for s in body:
            if len(out) >= n:
                break
            reqs = tuple(dataclasses.replace(r, request_id=r.request_id + k * rids) for r in s.requests)
            out.append(dataclasses.replace(s, index=len(out), iteration=s.iteration + k * iters, requests=reqs))
        k += 1
    return out


def base_checker(rev: str) -> Any:
    """The `Checker` class of the catalogue at `rev` (the module tracer/checks.py, or the package tracer/checks/),
    loaded as `specscope.tracer._checks_base` beside the current one: its relative imports resolve against the
    installed package."""
    def show(path: str) -> str:
        return subprocess.run(["git", "show", f"{rev}:{path}"], capture_output=True, text=True, check=True).stdout

    listing = subprocess.run(["git", "ls-tree", "--name-only", f"{rev}:tracer/checks"], capture_output=True,
                             text=True)
    name = "specscope.tracer._checks_base"
    if listing.returncode != 0:  # a single module
        mod = types.ModuleType(name)
        mod.__package__ = "specscope.tracer"
        sys.modules[name] = mod
        exec(compile(show("tracer/checks.py"), f"{rev}:tracer/checks.py", "exec"), mod.__dict__)  # noqa: S102
        return mod.Checker
    folder = tempfile.mkdtemp(prefix="checks_base_")
    for f in listing.stdout.split():
        if f.endswith(".py"):
            with open(os.path.join(folder, f), "w") as out:
                out.write(show(f"tracer/checks/{f}"))
    spec = importlib.util.spec_from_file_location(name, os.path.join(folder, "__init__.py"),
                                                  submodule_search_locations=[folder])
    assert spec is not None and spec.loader is not None
    pkg = importlib.util.module_from_spec(spec)
    sys.modules[name] = pkg
    spec.loader.exec_module(pkg)
    return pkg.Checker


def timed(checker: Callable[..., Any], run: RunInfo, steps: list[Step]) -> tuple[float, int]:
    """Seconds to feed every step to a fresh checker, and the violations it found."""
    t0 = time.perf_counter()
    c = checker(run)
    n = 0
    for s in steps:
        n += len(c.feed(s))
    return time.perf_counter() - t0, n


def _cpu() -> str:
    with open("/proc/cpuinfo") as f:
        return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), platform.machine())


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the commit whose checker is the baseline")
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--out")
    args = ap.parse_args()
    from specscope.tracer.checks import Checker

    run, steps = record(args.batch_size)
    trace = tile(steps, args.steps)
    old = base_checker(args.base)
    load_before = _uptime()
    times: dict[str, list[float]] = {"base": [], "new": []}
    found: dict[str, int] = {}
    for k in range(args.rounds):
        for name, cls in (("base", old), ("new", Checker)) if k % 2 == 0 else (("new", Checker), ("base", old)):
            sec, n = timed(cls, run, trace)
            times[name].append(sec)
            found[name] = n
            print(f"round {k + 1}/{args.rounds} {name:4s} {sec:7.2f} s  {n} violations", flush=True)
    ratios = [n / b for n, b in zip(times["new"], times["base"], strict=True)]
    res = {
        "header": {
            "cpu": _cpu(), "cores": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "load_before": load_before, "load_after": _uptime(),
            "command": "python " + " ".join(sys.argv), "base": args.base,
            "git_head": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                       text=True).stdout.strip(),
            "trace": f"{len(trace)} steps: a clean CPU run (batch {args.batch_size}, {len(steps)} steps, "
                     f"{sum(len(s.requests) for s in steps) / max(len(steps), 1):.1f} rows a step) tiled",
            "note": "Checker.feed over in-memory steps (reading the trace is common to both and left out); rounds "
                    "alternate which checker runs first; the machine is shared (see the load).",
        },
        "seconds": {k: {"median": statistics.median(v), "min": min(v), "max": max(v), "all": v}
                    for k, v in times.items()},
        "ratio_new_over_base": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
                                "all": ratios},
        "violations": found,
    }
    print(json.dumps(res["ratio_new_over_base"]))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
        md = os.path.splitext(args.out)[0] + ".md"
        with open(md, "w") as f:
            h = res["header"]
            f.write(f"# check speed: the catalogue at {args.base} vs the working tree\n\n```\n")
            f.write("\n".join(f"{k}: {v}" for k, v in h.items()) + "\n```\n\n")
            f.write("| checker | median s | min s | max s |\n|---|---|---|---|\n")
            for k, v in res["seconds"].items():
                f.write(f"| {k} | {v['median']:.2f} | {v['min']:.2f} | {v['max']:.2f} |\n")
            r = res["ratio_new_over_base"]
            f.write(f"\nRatio new / base per round: median {r['median']:.3f} (min {r['min']:.3f}, max "
                    f"{r['max']:.3f}); violations found: {found} (both 0 on a clean trace).\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
