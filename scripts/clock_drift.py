"""How far the GPU's `%globaltimer` drifts from the host clock over a run (GPU host; a CPU dry run shows only noise).

The recorder puts device stamps on the host clock with one offset measured when it starts (`tracer.stamps.
StampClock`) and corrects no drift: spans on the device are exact relative to each other, but a long trace's device
spans move against its host times (step start/end, the Perfetto iteration slices) by drift x run length. This
measures that drift: every `--every` seconds for `--seconds`, the offset is bracketed as StampClock does
(`tracer.stamps.bracket_offset`: host reads around a stamp between two synchronizes, the tightest of 5), then a
least-squares line through the offsets gives the drift in ppm (µs per second) and the residual spread.

    python scripts/clock_drift.py --seconds 120 --every 2 --out benchmarks/results/clock_drift.json
    python scripts/clock_drift.py --cpu --seconds 2 --every 0.5      # a dry run of the script
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time


def fit(points: list[tuple[int, int]]) -> tuple[float, float]:
    """Least-squares slope of (host ns, offset ns) points in ppm (µs of offset change per second of host time), and
    the residuals' standard deviation (ns)."""
    if len(points) < 2:
        return 0.0, 0.0
    t0 = points[0][0]
    xs = [(t - t0) / 1e9 for t, _ in points]  # s
    ys = [o for _, o in points]  # ns
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0  # ns per s
    res = [y - (my + slope * (x - mx)) for x, y in zip(xs, ys, strict=True)]
    return slope / 1e3, statistics.pstdev(res)  # ns/s / 1e3 = ppm


def main(argv: list[str] | None = None) -> int:
    """Measure and print (and write `--out`)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--every", type=float, default=2.0)
    ap.add_argument("--cpu", action="store_true", help="a dry run on the CPU (stamps are host times: no drift)")
    ap.add_argument("--out", default=None, help="JSON results file")
    a = ap.parse_args(argv)
    if a.seconds <= 0 or a.every <= 0:
        print("clock_drift: error: --seconds and --every must be positive", file=sys.stderr)
        return 2
    import torch
    from specscope.tracer.stamps import StampRing, bracket_offset

    cuda = not a.cpu
    if cuda and not torch.cuda.is_available():
        print("clock_drift: error: needs a CUDA GPU (or --cpu for a dry run)", file=sys.stderr)
        return 2
    dev = torch.device("cuda" if cuda else "cpu")
    ring = StampRing(dev, torch.cuda.current_stream(dev) if cuda else None)
    points, widths = [], []
    end = time.monotonic() + a.seconds
    while True:
        width, mid, off = bracket_offset(ring)
        points.append((mid, off))
        widths.append(width)
        if time.monotonic() + a.every > end:
            break
        time.sleep(a.every)
    ppm, spread = fit(points)
    first = points[0][1]
    doc = dict(script="scripts/clock_drift.py", argv=sys.argv[1:] if argv is None else argv,
               device=torch.cuda.get_device_name() if cuda else "cpu", torch=torch.__version__,
               python=platform.python_version(), date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
               samples=len(points), seconds=(points[-1][0] - points[0][0]) / 1e9, drift_ppm=ppm,
               residual_ns=spread, bracket_ns=dict(median=statistics.median(widths), max=max(widths)),
               offset_change_ns=[o - first for _, o in points])
    print(f"{len(points)} brackets over {doc['seconds']:.1f} s: drift {ppm:+.3f} ppm "
          f"({ppm * 3600:+.0f} µs per hour), residual {spread / 1e3:.2f} µs, "
          f"bracket median {doc['bracket_ns']['median'] / 1e3:.1f} µs")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
