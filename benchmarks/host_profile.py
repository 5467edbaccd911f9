"""Where the host's time goes in a steady traced vs untraced iteration (GPU host; run it under a sampling profiler).

Builds tracer_overhead's "off" and "on" engines for one cell, then alternates whole-workload rounds on them inside
two named functions (`_rounds_off`, `_rounds_on`), so a sampler's stacks split by arm:

    py-spy record --idle --threads --nonblocking -r 400 -f raw -o prof.txt -- python benchmarks/host_profile.py tiny:1
    python benchmarks/host_profile.py --summarize prof.txt      # samples per arm, then the heaviest frames of each

(Blocking sampling slows both arms ~3x; `--native` at 1 kHz falls far behind on the engine's ~30 threads.)

Without a profiler it prints each arm's median steady iteration (ms) per round.
"""

from __future__ import annotations

import argparse
import collections
import re
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

_LINE = re.compile(r":\d+\)$")


def _rounds_off(bench: Any, s: Any, bs: int, n: int) -> list[float]:
    import tracer_overhead as to
    return [to.run_round(bench, s, "off", bs, 0)[0] for _ in range(n)]


def _rounds_on(bench: Any, s: Any, bs: int, n: int) -> list[float]:
    import tracer_overhead as to
    return [to.run_round(bench, s, "on", bs, 0)[0] for _ in range(n)]


def profile(cell: str, rounds: int, per_round: int, live_check: bool, cpu: bool = False) -> None:
    """Alternate `rounds` x `per_round` workloads per arm on one cell (`model:bs`)."""
    import contextlib
    import os

    import tracer_overhead as to
    from engine_speed import Bench, load_torch, presets

    name, bs_s = cell.split(":")
    bs = int(bs_s)
    if cpu:
        import torch
    else:
        torch = load_torch()
    bench = Bench(torch, 3)
    if cpu:  # a dry run of the script (numbers meaningless)
        bench.device, bench.dtype, bench.fused_setting, bench.fused_ops = "cpu", "float32", "fused-torch", "fused-torch"
    p = presets(True)[name]
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        bench._arm, bench._loaded = "fused", []
        path = os.path.join(tmp, "on.db")
        arms = {arm: stack.enter_context(bench.session.open_session(
            to.cell_config(bench, p, bs, True), path if arm == "on" else None, command="host_profile",
            overwrite=True, random_weights=p.random_weights, check=live_check)) for arm in ("off", "on")}
        _rounds_off(bench, arms["off"], bs, 1)
        _rounds_on(bench, arms["on"], bs, 1)
        got: dict[str, list[float]] = {"off": [], "on": []}
        for _ in range(rounds):
            got["off"] += _rounds_off(bench, arms["off"], bs, per_round)
            got["on"] += _rounds_on(bench, arms["on"], bs, per_round)
        for arm, v in got.items():
            print(f"{cell} {arm}: median {statistics.median(v):.3f} ms  [{min(v):.3f}-{max(v):.3f}] over {len(v)}")
        print(f"{cell} on/off of medians {statistics.median(got['on']) / statistics.median(got['off']):.3f}")


def summarize(path: str, top: int) -> None:
    """Samples per arm and thread from py-spy's raw (collapsed) output, and the heaviest self / inclusive frames."""
    by_arm: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    incl: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    totals: collections.Counter[str] = collections.Counter()
    for line in Path(path).read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        frames = [_LINE.sub(")", f) for f in stack.split(";")]  # a function, not its line
        arm = next((a for a in ("off", "on") if any(f.startswith(f"_rounds_{a} ") for f in frames)), None)
        thread = frames[0]
        key = f"{arm or '-'} {thread}"
        totals[key] += n
        if arm is None:
            continue
        by_arm[key][frames[-1]] += n
        for f in set(frames):
            incl[key][f] += n
    on = next((k for k in incl if k.startswith("on ")), None)
    off = next((k for k in incl if k.startswith("off ")), None)
    if on and off:
        # Same rounds in both arms, so samples are time: what the traced arm spends more, by inclusive frame.
        print(f"== on - off, inclusive, in % of off's {totals[off]} samples")
        diff = {f: incl[on][f] - incl[off].get(f, 0) for f in incl[on]}
        for f, d in sorted(diff.items(), key=lambda kv: -kv[1])[:top * 2]:
            print(f"     {d:+7d} {100 * d / totals[off]:+6.1f}%  {f[:160]}")
    for key, n in totals.most_common():
        print(f"== {key}: {n} samples")
        if key in by_arm:
            print("   self:")
            for f, c in by_arm[key].most_common(top):
                print(f"     {c:7d} {100 * c / n:5.1f}%  {f[:160]}")
            print("   inclusive:")
            for f, c in incl[key].most_common(top * 2):
                print(f"     {c:7d} {100 * c / n:5.1f}%  {f[:160]}")


def main() -> int:
    """Command line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cell", nargs="?", default="tiny:1")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--per-round", type=int, default=2)
    ap.add_argument("--no-live-check", action="store_true")
    ap.add_argument("--summarize", metavar="RAW")
    ap.add_argument("--cpu", action="store_true", help="a CPU dry run")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    if a.summarize:
        summarize(a.summarize, a.top)
    else:
        profile(a.cell, a.rounds, a.per_round, not a.no_live_check, a.cpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
