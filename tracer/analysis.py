"""Trace analysis shared by the benchmarks and the UIs: stream overlap, GPU idle, acceptance. Torch-free."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from .schema import Step, StreamSpan


@dataclass(frozen=True)
class IterationStreams:
    """How one iteration's plan-stream work sat against its compute-stream work (ns, on one clock)."""

    iteration: int
    plan_ns: int  # total plan-stream span time
    plan_hidden_ns: int  # part of it during which the compute stream was busy
    compute_busy_ns: int  # union of compute-stream spans
    compute_idle_ns: int  # gaps between compute spans inside the iteration

    @property
    def hidden_share(self) -> float | None:
        """Fraction of plan-stream time hidden under compute (None without plan work)."""
        return self.plan_hidden_ns / self.plan_ns if self.plan_ns else None


def _union(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _overlap(a: tuple[int, int], union: list[tuple[int, int]]) -> int:
    return sum(max(0, min(a[1], b) - max(a[0], s)) for s, b in union)


def iteration_streams(steps: Iterable[Step]) -> list[IterationStreams]:
    """Per-iteration plan/compute overlap and compute idle time, from the steps' stream spans."""
    spans: dict[int, list[StreamSpan]] = defaultdict(list)
    for s in steps:
        if s.iteration >= 0:
            spans[s.iteration].extend(s.spans)
    out = []
    for it in sorted(spans):
        compute = _union([(x.start_ns, x.end_ns) for x in spans[it] if x.stream == "compute"])
        plan = [(x.start_ns, x.end_ns) for x in spans[it] if x.stream == "plan"]
        busy = sum(b - a for a, b in compute)
        idle = sum(compute[i + 1][0] - compute[i][1] for i in range(len(compute) - 1))
        out.append(IterationStreams(it, sum(b - a for a, b in plan), sum(_overlap(p, compute) for p in plan),
                                    busy, idle))
    return out


def summarize_streams(rows: list[IterationStreams]) -> dict[str, float | int | None]:
    """Totals over iterations: hidden share of plan time, compute idle share."""
    plan = sum(r.plan_ns for r in rows)
    hidden = sum(r.plan_hidden_ns for r in rows)
    busy = sum(r.compute_busy_ns for r in rows)
    idle = sum(r.compute_idle_ns for r in rows)
    return dict(iterations=len(rows), plan_ns=plan, plan_hidden_ns=hidden,
                plan_hidden_share=hidden / plan if plan else None, compute_busy_ns=busy, compute_idle_ns=idle,
                compute_idle_share=idle / (busy + idle) if busy + idle else None)
