"""Writes deterministic steps (tests/unit/stepgen.py) to a trace; a child process for crash and live tests.

    python writer_proc.py PATH [--steps N] [--flush-every K] [--sleep S]

Prints "ready" once the file exists, then "committed N" after every flush (N steps are durable).
With --steps -1 it writes until killed.
"""

from __future__ import annotations

import argparse
import sys
import time

from specscope.tracer.store import TraceWriter
from stepgen import make_request, make_run, make_step


def main() -> int:
    """Write steps until done (or killed)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--steps", type=int, default=-1)
    ap.add_argument("--flush-every", type=int, default=10)
    ap.add_argument("--sleep", type=float, default=0.0)
    args = ap.parse_args()
    w = TraceWriter(args.path, make_run(), queue_size=64)
    print("ready", flush=True)
    i = 0
    while args.steps < 0 or i < args.steps:
        w.write_step(make_step(i))
        i += 1
        if i % args.flush_every == 0:
            w.flush()
            print(f"committed {i}", flush=True)
        if args.sleep:
            time.sleep(args.sleep)
    w.write_request(make_request(0))
    w.close()
    print(f"closed {i}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
