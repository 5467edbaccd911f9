"""Whether CUDA event times and the stamps' %globaltimer are one clock, and what each costs the host (GPU host).

The question behind it: what would an eager span cost the host if it were timed by event records instead of stamps?

Why: an eager span (metadata, producers) costs two stamp launches, ~5 µs of `cuLaunchKernel` each on the H200; ten per
iteration are ~50 µs, the whole 2 % budget of a tiny-model iteration (benchmarks/results/README.md, tracer overhead). A
driver `cuEventRecord` costs less, but the recorder put every GPU span on the %globaltimer clock because the offset
between the two clocks, measured from the host, brackets only to ~20 µs (stamps.py). This script measures it on the
GPU instead: while a spin kernel holds the stream, it enqueues pairs (stamp, timing event) back to back, so each
event is taken right after its stamp's kernel. If the event clock is %globaltimer under another name, every pair
agrees with the first pair to within the stamp kernel's own tail (sub-µs) at any distance, with no drift over the
run; then an event's time on the stamp axis is `stamp_0 + elapsed(event_0, event)`, and eager spans could be
event records re-anchored at each drain.

    python scripts/event_clock.py                        # prints, and writes ./event_clock.json
    python scripts/event_clock.py --seconds 60 --out benchmarks/results/event_clock.json

Printed: host ns per call (stamp, stamp launch alone, driver event record, torch Event.record); per block, the
residual (event elapsed - stamp difference, ns) of each pair against the block's first pair, for events taken right
after their stamp and right before it (their medians bracket the clocks' offset), and the blocks' chained residual;
its slope over the run (ppm: 0 means one clock).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> int:
    """Measure and print; write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0, help="how long the blocks of pairs are spread over")
    ap.add_argument("--every", type=float, default=2.0, help="seconds between blocks")
    ap.add_argument("--pairs", type=int, default=64, help="stamp / event pairs per block")
    ap.add_argument("--out", default="event_clock.json")
    a = ap.parse_args(argv)
    import torch
    from clock_drift import fit  # the least-squares drift line clock_drift.py fits (ppm)
    from specscope.tracer.stamps import StampRing, _driver
    from stamp_cost import host_ns, stamp_ring_on_gpu  # median host ns per call; the current stream and a ring

    got = stamp_ring_on_gpu("event_clock")
    if got is None:
        return 2
    s, ring = got
    drv = _driver()
    sync = torch.cuda.synchronize
    ev_timing = torch.cuda.Event(enable_timing=True)
    ev_timing.record(s)  # torch makes the CUDA event at its first record
    handle = ctypes.c_void_p(ev_timing.cuda_event)
    h = ctypes.c_void_p(s.cuda_stream)
    # The costs on a ring of their own: `launch` stamps without numbering them, so the device's slot index runs ahead
    # of the ring's count, and the pairs below would read the wrong slots of a ring it had been called on.
    scratch = StampRing(ring.device, s)
    costs = dict(stamp=host_ns(scratch.stamp, scratch), stamp_launch_only=host_ns(scratch.launch, scratch),
                 driver_event_record=host_ns(lambda: drv.event_record(handle, h), scratch),
                 torch_event_record=host_ns(lambda: ev_timing.record(s), scratch))
    print("host ns per call:", ", ".join(f"{k} {v}" for k, v in costs.items()), flush=True)

    # Per block, behind a spin: pairs (stamp, event) and, as the bracket's other side, (event, stamp). Within a block
    # every pair is compared with the block's first pair (short distances: float ms are exact to ns); the blocks'
    # first pairs are chained (elapsed from one to the next, ~`every` s apart) to see drift over the run.
    xs: list[float] = []  # stamp distance of each block's anchor from the first (ns)
    ys: list[float] = []  # chained event distance - stamp distance (ns)
    blocks = []
    prev: Any = None
    chain_ns, first_stamp = 0.0, 0
    t_end = time.perf_counter() + a.seconds
    while True:
        torch.cuda._sleep(20_000_000)  # ~10 ms, longer than enqueuing the pairs: they queue behind it, back to back
        after, before = [], []
        for _ in range(a.pairs):
            seq = ring.stamp()
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(s)
            after.append((seq, ev))
            torch.cuda._sleep(2_000)  # a few µs between pairs
            ev2 = torch.cuda.Event(enable_timing=True)
            ev2.record(s)
            before.append((ring.stamp(), ev2))
        ring.drain()
        sync()
        ring.completed()
        a_seq, a_ev = after[0]
        a_stamp = ring.value(a_seq)
        if prev is None:
            first_stamp = a_stamp
        else:
            chain_ns += prev[1].elapsed_time(a_ev) * 1e6
        xs.append(a_stamp - first_stamp)
        ys.append(chain_ns - (a_stamp - first_stamp))
        prev = (a_stamp, a_ev)
        res = {k: [a_ev.elapsed_time(ev) * 1e6 - (ring.value(q) - a_stamp) for q, ev in pairs]
               for k, pairs in (("after", after[1:]), ("before", before))}
        row = dict(at_s=round(xs[-1] / 1e9, 3), chained_residual_ns=round(ys[-1]),
                   after_median_ns=round(statistics.median(res["after"])), after_min_ns=round(min(res["after"])),
                   after_max_ns=round(max(res["after"])), before_median_ns=round(statistics.median(res["before"])),
                   before_min_ns=round(min(res["before"])), before_max_ns=round(max(res["before"])))
        blocks.append(row)
        print(f"t {row['at_s']:7.2f} s  chained {row['chained_residual_ns']} ns  stamp-then-event "
              f"{row['after_median_ns']} ns [{row['after_min_ns']}..{row['after_max_ns']}]  event-then-stamp "
              f"{row['before_median_ns']} ns [{row['before_min_ns']}..{row['before_max_ns']}]", flush=True)
        if time.perf_counter() > t_end:
            break
        time.sleep(a.every)
    ppm, _ = fit(list(zip(xs, ys, strict=True)))
    print(f"chained residual slope {ppm:.3f} ppm over {xs[-1] / 1e9:.1f} s (0 ppm, and stamp-then-event residuals "
          "in a band of about a µs around one value: one clock)")
    doc = dict(script="scripts/event_clock.py", argv=sys.argv[1:] if argv is None else argv,
               gpu=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda,
               date=time.strftime("%Y-%m-%d %H:%M:%S %Z"), host_ns=costs, blocks=blocks, slope_ppm=ppm)
    Path(a.out).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
