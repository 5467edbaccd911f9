"""What a device stamp costs (GPU host): the host time of an eager stamp vs a CUDA event record, and the GPU time two
stamp nodes add to a captured graph.

    python scripts/stamp_cost.py      # prints; the H200 output is benchmarks/results/stamp_cost.log
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from specscope.tracer.stamps import StampRing


def stamp_ring_on_gpu(script: str) -> tuple[Any, StampRing] | None:
    """The current CUDA stream and a stamp ring on it; None, after one line on stderr, without a CUDA GPU."""
    if not torch.cuda.is_available():
        print(f"{script}: error: needs a CUDA GPU", file=sys.stderr)
        return None
    dev = torch.device("cuda")
    s = torch.cuda.current_stream(dev)
    return s, StampRing(dev, s)


def host_ns(fn: Callable[[], object], ring: StampRing, n: int = 5000) -> int:
    """Median over 5 loops of the host ns one call of `fn` takes (the ring drained between loops)."""
    out = []
    for _ in range(5):
        torch.cuda.synchronize()
        t = time.perf_counter_ns()
        for _ in range(n):
            fn()
        out.append((time.perf_counter_ns() - t) / n)
        torch.cuda.synchronize()
        ring.drain()
        torch.cuda.synchronize()
        ring.completed()
    return round(statistics.median(out))


def main() -> int:
    """Print the host and GPU costs."""
    got = stamp_ring_on_gpu("stamp_cost")
    if got is None:
        return 2
    s, ring = got
    timing, plain = torch.cuda.Event(enable_timing=True), torch.cuda.Event()
    print("host ns: StampRing.stamp", host_ns(ring.stamp, ring), "launch only", host_ns(ring.launch, ring),
          "claim only", host_ns(lambda: ring.claim(1), ring))
    print("host ns: timing Event.record(stream)", host_ns(lambda: timing.record(s), ring),
          "plain Event.record(stream)", host_ns(lambda: plain.record(s), ring))
    x = torch.randn(64, 64, device="cuda")
    graphs = {}
    for stamped in (False, True):
        g = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(s)
        with torch.cuda.stream(side):
            x @ x
        s.wait_stream(side)
        with torch.cuda.graph(g):
            h = torch.cuda.current_stream().cuda_stream
            if stamped:
                ring.launch(h)
            y = x @ x
            for _ in range(3):
                y = y @ x
            if stamped:
                ring.launch(h)
        graphs[stamped] = g
    for _ in range(3):
        for stamped, g in graphs.items():
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(2_000_000)  # queue the replays behind a busy GPU: their GPU time, not the host's
            a.record(s)
            for _ in range(200):
                g.replay()
                if stamped:
                    ring.claim(2)
            b.record(s)
            torch.cuda.synchronize()
            ring.drain()
            torch.cuda.synchronize()
            ring.completed()
            t = time.perf_counter_ns()
            for _ in range(200):
                g.replay()
            host = (time.perf_counter_ns() - t) / 200
            if stamped:
                ring.claim(400)
            torch.cuda.synchronize()
            print(f"graph {'with' if stamped else 'without'} 2 stamps: GPU us/replay "
                  f"{a.elapsed_time(b) * 1e3 / 200:.2f}, host us/replay {host / 1e3:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
