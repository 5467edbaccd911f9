"""The plan / compute view: does the plan stream's metadata work hide under compute, for the current step and its
neighbours? Lanes on one time axis, the hidden share (plan-stream time under compute, the design's ≥ 90 %
target), the compute stream's gaps, and an axis whose long stretches (a capture's seconds) are cut to a few
times the median span, marked `≈`, so one outlier does not squeeze every other step to a character.

`overlap` and `Axis` are pure (tested without a terminal); `Timeline` draws them.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.style import Style
from specscope.tracer.schema import SpanRow, StepSummary
from specscope.ui.views import fmt_ns

from .lines import LinePane, Lines, WidgetArgs
from .source import TraceSource

if TYPE_CHECKING:
    from typing_extensions import Unpack

CUT_X_MEDIAN = 4  # a stretch of the axis longer than this many median spans is drawn as that long, marked ≈
_S_LANE, _S_PLAIN = Style(color="grey62"), Style()
_S_NOW, _S_ODD, _S_EVEN = Style(color="#ffd75f"), Style(color="#5f87af"), Style(color="#5f5f87")
_S_HIDDEN, _S_EXPOSED = Style(color="green"), Style(color="#ff5f5f", bold=True)
_S_AXIS, _S_CUT = Style(color="grey50"), Style(color="#ffaf00", bold=True)




def union(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merged, sorted intervals (overlapping or touching ones as one)."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def covered(a: int, b: int, merged: Sequence[tuple[int, int]]) -> int:
    """Nanoseconds of [a, b) inside the merged intervals."""
    k = max(0, bisect.bisect_right(merged, (a, a)) - 1)
    total = 0
    for lo, hi in merged[k:]:
        if lo >= b:
            break
        total += max(0, min(b, hi) - max(a, lo))
    return total


@dataclass(frozen=True)
class Gap:
    """The compute stream idle between two spans: after `before`'s span, until `after`'s."""

    start_ns: int
    end_ns: int
    before: int
    after: int


@dataclass(frozen=True)
class Overlap:
    """How much plan-stream time ran under compute, for one step and for the window around it."""

    step_plan_ns: int  # plan-stream time of the current step
    step_hidden_ns: int  # of it, under compute (any step's)
    window_plan_ns: int
    window_hidden_ns: int
    gaps: tuple[Gap, ...]  # compute idle inside the window, in time order
    plan_to_forward_ns: int | None  # the current step's plan end -> its first compute launch after it

    @staticmethod
    def share(hidden: int, plan: int) -> float | None:
        """hidden / plan, None without plan-stream time."""
        return hidden / plan if plan else None


def overlap(spans: dict[int, list[SpanRow]], current: int) -> Overlap:
    """Plan-stream time under compute for step `current` and for every step in `spans`, and the compute gaps."""
    comp = [(sp.start_ns, sp.end_ns, i) for i, v in spans.items() for sp in v if sp.stream == "compute"]
    merged = union((a, b) for a, b, _ in comp)
    plan_here = hid_here = plan_all = hid_all = 0
    for i, v in spans.items():
        for sp in v:
            if sp.stream != "plan":
                continue
            d, h = sp.end_ns - sp.start_ns, covered(sp.start_ns, sp.end_ns, merged)
            plan_all += d
            hid_all += h
            if i == current:
                plan_here += d
                hid_here += h
    gaps = []
    comp.sort()
    end, who = None, -1
    for a, b, i in comp:
        if end is not None and a > end:
            gaps.append(Gap(end, a, who, i))
        if end is None or b > end:
            end, who = b, i
    ptf = None
    plan_end = max((sp.end_ns for sp in spans.get(current, []) if sp.stream == "plan"), default=None)
    if plan_end is not None:
        after = [sp.start_ns for sp in spans.get(current, []) if sp.stream == "compute" and sp.start_ns >= plan_end
                 and sp.name != "producers"]
        if after:
            ptf = min(after) - plan_end
    return Overlap(plan_here, hid_here, plan_all, hid_all, tuple(gaps), ptf)


class Axis:
    """Time -> column over `width` columns, with stretches between span edges longer than `cut_ns` drawn `cut_ns`
    long (a robust scale: a capture's seconds do not squeeze the microsecond steps around it)."""

    def __init__(self, edges: Iterable[int], width: int, cut_ns: int | None) -> None:
        e = sorted(set(edges))
        self.edges = e if e else [0, 1]
        if len(self.edges) == 1:
            self.edges.append(self.edges[0] + 1)
        self.width = max(1, width)
        lens = [b - a for a, b in zip(self.edges, self.edges[1:], strict=False)]
        self.cut_ns = cut_ns
        warped = [min(d, cut_ns) if cut_ns else d for d in lens]
        self.cuts = [(a, b) for (a, b), d, w in zip(zip(self.edges, self.edges[1:], strict=False), lens, warped,
                                                    strict=True) if w < d]
        self.longest_cut = max((b - a for a, b in self.cuts), default=0)
        self._cum = [0]
        for w in warped:
            self._cum.append(self._cum[-1] + w)
        self._lens, self._warped = lens, warped
        self.total = max(1, self._cum[-1])

    def col(self, t: int) -> float:
        """The (fractional) column of time `t`."""
        e = self.edges
        if t <= e[0]:
            return 0.0
        if t >= e[-1]:
            return float(self.width)
        k = bisect.bisect_right(e, t) - 1
        frac = (t - e[k]) / self._lens[k] if self._lens[k] else 0.0
        return (self._cum[k] + frac * self._warped[k]) / self.total * self.width

    def time_at(self, col: float) -> int:
        """The time at column `col` (the inverse of `col`)."""
        w = max(0.0, min(float(self.width), col)) / self.width * self.total
        k = max(0, min(len(self._warped) - 1, bisect.bisect_right(self._cum, w) - 1))
        frac = (w - self._cum[k]) / self._warped[k] if self._warped[k] else 0.0
        return int(self.edges[k] + frac * self._lens[k])

    def cut_cols(self) -> list[int]:
        """Columns where a cut stretch sits (marked ≈ on the axis)."""
        return sorted({min(self.width - 1, int((self.col(a) + self.col(b)) / 2)) for a, b in self.cuts})


def robust_cut(durations: Sequence[int]) -> int | None:
    """CUT_X_MEDIAN median spans (None without spans)."""
    pos = [d for d in durations if d > 0]
    return int(CUT_X_MEDIAN * statistics.median(pos)) if pos else None


class Timeline(LinePane):
    """Plan / compute / host spans of the steps around the current one on one (robust) time axis; the hidden
    share and the compute gaps as figures under it."""

    LANES = ("plan", "comp", "host")

    def __init__(self, source: TraceSource, **kw: Unpack[WidgetArgs]) -> None:
        super().__init__("", **kw)
        self.source = source
        self._cache: dict[int, list[SpanRow]] = {}
        self.current = 0
        self.last: Overlap | None = None  # the figures drawn last (tests read them)

    def spans_for(self, steps: Sequence[int]) -> dict[int, list[SpanRow]]:
        """Spans per step of `steps` (ascending indexes), fetched once per step (only the steps not seen yet)."""
        missing = [i for i in steps if i not in self._cache]
        if missing:
            lo, hi = missing[0], missing[-1] + 1
            got: dict[int, list[SpanRow]] = {i: [] for i in missing}
            for sp in self.source.reader.spans(steps=(lo, hi)):
                got.setdefault(sp.step, []).append(sp)
            self._cache.update(got)
            if len(self._cache) > 512:
                for k in sorted(self._cache, key=lambda k: abs(k - steps[0]))[256:]:
                    del self._cache[k]
        return {i: self._cache.get(i, []) for i in steps}

    def show(self, i: int) -> None:
        """Redraw around step i."""
        self.current = i
        self.refresh_text()

    def on_resize(self) -> None:
        """Redraw for the new width."""
        self.refresh_text()

    def refresh_text(self) -> None:
        """Lanes, the axis, and the figures."""
        width = max(16, self.size.width)
        if self.source.num_steps() == 0:
            self.update("no steps yet")
            return
        half = 2 if width < 50 else 4
        # Neighbours by row, within the run of consecutive indexes: steps across a bundle's gap (the captures it
        # adds before its range) lie far apart in time and would squeeze the window to a line.
        steps = self.source.around(self.current, half, contiguous=True) or [self.current]
        per = self.spans_for(steps)
        sums = {s.index: s for s in self.source.summaries(steps[0], steps[-1] + 1)}
        self.update(self.draw(steps, per, sums, width))

    def draw(self, steps: Sequence[int], per: dict[int, list[SpanRow]], sums: dict[int, StepSummary],
             width: int) -> Lines:
        """The pane's lines for `steps` (the current one is `self.current`)."""
        lane_w = width - 5
        rows: dict[str, list[tuple[int, int, int]]] = {name: [] for name in self.LANES}
        for i in steps:
            for sp in per.get(i, []):
                lane = "plan" if sp.stream == "plan" else "comp" if sp.stream == "compute" else "host"
                rows[lane].append((sp.start_ns, sp.end_ns, i))
            s = sums.get(i)
            if s is not None:
                rows["host"].append((s.start_ns, s.end_ns, i))
        every = [r for v in rows.values() for r in v]
        ov = overlap({i: per.get(i, []) for i in steps}, self.current)
        self.last = ov
        axis = Axis([x for a, b, _ in every for x in (a, b)], lane_w, robust_cut([b - a for a, b, _ in every]))
        cells = {name: [-1] * lane_w for name in self.LANES}
        for lane, spans in rows.items():
            c = cells[lane]
            for a, b, i in spans:
                x0 = int(axis.col(a))
                x1 = max(x0 + 1, int(axis.col(b)))
                lo, hi = max(0, x0), min(lane_w, x1)
                if hi > lo:
                    c[lo:hi] = [i] * (hi - lo)
        t = Lines()
        for name in self.LANES:
            t.append(f"{name:<4} ", _S_LANE)
            self._runs(t, cells[name])
            t.append("\n")
        # Under the plan lane: where plan work ran with compute busy (─, hidden) or idle (▲, exposed).
        comp_busy = union((int(axis.col(a)), max(int(axis.col(a)) + 1, int(axis.col(b)))) for a, b, _ in rows["comp"])
        t.append("hid  ", _S_LANE)
        x = 0
        line: list[tuple[str, Style]] = []
        for x in range(lane_w):
            if cells["plan"][x] < 0:
                line.append((" ", _S_PLAIN))
            elif covered(x, x + 1, comp_busy):
                line.append(("─", _S_HIDDEN))
            else:
                line.append(("▲", _S_EXPOSED))
        for ch, st in line:
            t.append(ch, st)
        t.append("\n")
        self._axis(t, axis, lane_w)
        t.append("\n")
        share = Overlap.share(ov.step_hidden_ns, ov.step_plan_ns)
        wshare = Overlap.share(ov.window_hidden_ns, ov.window_plan_ns)
        if wshare is None:
            t.append("no plan-stream work here", "grey62")
        else:
            t.append("hidden ", "grey62")
            t.append("-" if share is None else f"{share:.0%}", "bold" if share is None or share >= 0.9 else
                     "bold #ff5f5f")
            t.append(" here · ", "grey62")
            t.append(f"{wshare:.0%}", "bold" if wshare >= 0.9 else "bold #ff5f5f")
            t.append(f" {steps[0]}–{steps[-1]}", "grey62")
        t.append("\n")
        if ov.gaps:
            longest = max(ov.gaps, key=lambda g: g.end_ns - g.start_ns)
            total = sum(g.end_ns - g.start_ns for g in ov.gaps)
            span = fmt_ns(longest.end_ns - longest.start_ns, compact=True)
            t.append(f"compute gaps {len(ov.gaps)}: {fmt_ns(total, compact=True)}, max {span} "
                     f"{longest.before}→{longest.after}", "grey62")
        else:
            t.append("compute gaps: none", "grey62")
        t.append("\n")
        notes = []
        if ov.plan_to_forward_ns is not None:
            notes.append(f"plan end→launch {fmt_ns(ov.plan_to_forward_ns, compact=True)}")
        if axis.cuts:
            notes.append(f"≈ cut to {CUT_X_MEDIAN}× median (max {fmt_ns(axis.longest_cut, compact=True)})")
        t.append(" · ".join(notes), _S_CUT if axis.cuts else "grey62")
        return t

    def _runs(self, t: Lines, cells: list[int]) -> None:
        x, n = 0, len(cells)
        while x < n:
            who = cells[x]
            end = x + 1
            while end < n and cells[end] == who:
                end += 1
            if who < 0:
                t.append(" " * (end - x), _S_PLAIN)
            else:
                cur = who == self.current
                t.append(("█" if cur else "▆") * (end - x), _S_NOW if cur else (_S_ODD if who % 2 else _S_EVEN))
            x = end

    def _axis(self, t: Lines, axis: Axis, lane_w: int) -> None:
        """Tick labels (time from the window's start, read through the cut axis) and ≈ where it is cut."""
        t0 = axis.edges[0]
        out = [" "] * lane_w
        styles = [_S_AXIS] * lane_w
        step = 12
        for c in range(0, lane_w, step):
            lab = "┊" + ("0" if c == 0 else fmt_ns(axis.time_at(c) - t0, compact=True))
            if c + len(lab) > lane_w:
                break
            for k, ch in enumerate(lab):
                out[c + k] = ch
        for c in axis.cut_cols():
            out[c], styles[c] = "≈", _S_CUT
        t.append("time ", _S_LANE)
        for ch, st in zip(out, styles, strict=True):
            t.append(ch, st)
