"""Pool the per-round traced / untraced ratios of several `tracer_overhead.py` results of the same code.

Single runs of a borderline cell disagree by a point or two (their rounds spread ±5 %), so the verdict on such a
cell is better read from every measured round of every run of it: median, quartiles and min–max of the pooled round
ratios, per (model, bs). Only results whose command and recorder settings match are meant to be pooled; the script
prints each file's date and command so the reader can see what went in.

    python benchmarks/pool_overhead.py benchmarks/results/tracer_overhead.json \\
        benchmarks/results/tracer_overhead_8b.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

TARGET = 1.02


def pooled(docs: list[dict[str, Any]]) -> dict[tuple[str, int], list[float]]:
    """Every measured round's traced / untraced ratio, per (model, batch size), over all `docs`."""
    out: dict[tuple[str, int], list[float]] = {}
    for doc in docs:
        for row in doc["rows"]:
            out.setdefault((row["model"], row["batch_size"]), []).extend(row["round_ratios"]["traced"])
    return out


def describe(ratios: list[float]) -> dict[str, float | int]:
    """Median, quartiles, min and max of `ratios` (at least one)."""
    q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
    return {"rounds": len(ratios), "median": statistics.median(ratios), "q1": q1, "q3": q3,
            "min": min(ratios), "max": max(ratios)}


def main(argv: list[str] | None = None) -> int:
    """Print one line per pooled cell; exit 2 with one line on a file that is not a tracer_overhead result."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", help="tracer_overhead.py JSON results")
    args = ap.parse_args(argv)
    docs = []
    for f in args.files:
        try:
            doc = json.loads(Path(f).read_text())
            if not all("round_ratios" in r for r in doc["rows"]):
                raise KeyError("round_ratios")
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"pool_overhead: {f}: not a tracer_overhead.py result ({type(e).__name__}: {e})", file=sys.stderr)
            return 2
        print(f"{f}: {doc.get('date', '?')}  {doc.get('command', '?')}")
        docs.append(doc)
    for (model, bs), ratios in sorted(pooled(docs).items()):
        d = describe(ratios)
        verdict = "meets" if d["median"] <= TARGET else "misses"
        print(f"{model[:26]:26s} bs {bs:3d}  {d['rounds']:3d} rounds  median {d['median']:.3f}  "
              f"quartiles {d['q1']:.3f}–{d['q3']:.3f}  min–max {d['min']:.3f}–{d['max']:.3f}  {verdict} ≤ {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
