"""Eager stamps as CUDA timing events on a real GPU (tracer.event_stamps): on the stamp kernels' clock to within a
µs, ordered across streams by a real wait, read correctly when the stream idled before the anchor, and through a
ring that laps."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # pragma: no cover
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from specscope.tracer.event_stamps import EventStamps  # noqa: E402
from specscope.tracer.stamps import StampRing  # noqa: E402

DEV = torch.device("cuda")
AGREE_NS = 2_000  # an event right after a stamp kernel reads its %globaltimer +0.16 µs (band -0.7..+0.5) on an H200


def _pairs(ring: StampRing, events: EventStamps, n: int, gap_cycles: int) -> list[tuple[int, int]]:
    """`n` (stamp kernel, event) pairs back to back on the stream, GPU work between pairs."""
    out = []
    for _ in range(n):
        out.append((ring.stamp(), events.stamp()))
        torch.cuda._sleep(gap_cycles)
    return out


def test_events_read_on_the_stamp_clock_agree_with_stamp_kernels() -> None:
    stream = torch.cuda.current_stream(DEV)
    ring = StampRing(DEV, stream)
    events = EventStamps(ring)
    torch.cuda._sleep(20_000_000)  # the pairs queue behind it, back to back
    pairs = _pairs(ring, events, 64, 5_000)
    events.drain()
    torch.cuda.synchronize()
    assert events.completed() == events.count == 64
    ring.completed()
    diffs = [events.value(e) - ring.value(s) for s, e in pairs]
    assert all(abs(d) <= AGREE_NS for d in diffs), diffs
    vals = [events.value(e) for _, e in pairs]
    assert all(b - a > 1_000 for a, b in zip(vals, vals[1:], strict=False))  # the sleeps between pairs take µs


def test_an_event_long_before_its_anchor_is_read_from_the_nearer_one() -> None:
    """The stream idles 0.3 s between an event and the drain that anchors it: the previous anchor, laid just
    before the event, is nearer in GPU time and float milliseconds keep the value within a µs."""
    stream = torch.cuda.current_stream(DEV)
    ring = StampRing(DEV, stream)
    events = EventStamps(ring)
    events.stamp()
    events.drain()  # the anchor just before the pair below
    s, e = ring.stamp(), events.stamp()
    torch.cuda.synchronize()
    time.sleep(0.3)
    events.drain()
    events.wait(e)
    ring.completed()
    assert abs(events.value(e) - ring.value(s)) <= AGREE_NS


def test_a_stream_wait_orders_events_across_streams() -> None:
    """The plan stream waits for an event after a compute-stream span's end; its next span starts later on the one
    device clock (what I21 compares)."""
    compute = torch.cuda.current_stream(DEV)
    plan = torch.cuda.Stream(DEV)
    ec, ep = EventStamps(StampRing(DEV, compute)), EventStamps(StampRing(DEV, plan))
    pairs = []
    for _ in range(20):
        torch.cuda._sleep(20_000)  # keep compute busy so the plan stream really waits
        a = ec.stamp()
        ev = torch.cuda.Event()
        ev.record(compute)
        plan.wait_event(ev)
        pairs.append((a, ep.stamp()))
    ec.drain()
    ep.drain()
    torch.cuda.synchronize()
    assert ec.completed() == ep.completed() == 20
    assert all(ep.value(b) >= ec.value(a) for a, b in pairs)


def test_a_lapping_ring_reads_out_what_it_is_about_to_reuse() -> None:
    """16 events per ring: past the first lap each event is re-recorded; `on_lap` is asked first for every number
    below the half ring about to be reused, and the values it reads then are the right ones."""
    stream = torch.cuda.current_stream(DEV)
    ring = StampRing(DEV, stream)
    events = EventStamps(ring, slots=16)
    kept: dict[int, int] = {}

    def read_out(below: int) -> None:
        for n in range(below):
            if n not in kept:
                events.wait(n)
                kept[n] = events.value(n)

    events.on_lap = read_out
    stamps = []
    for _ in range(100):
        stamps.append((ring.stamp(), events.stamp()))
        torch.cuda._sleep(2_000)
    events.drain()
    events.wait(events.count - 1)
    ring.completed()
    for n in range(events.count - 16, events.count):
        kept.setdefault(n, events.value(n))
    assert sorted(kept) == list(range(100))
    for s, e in stamps:
        assert abs(kept[e] - ring.value(s)) <= AGREE_NS
    vals = [kept[n] for n in range(100)]
    assert vals == sorted(vals)
    assert len(events._anchors) + len(events._free) < 40  # anchors are pruned and their events reused
