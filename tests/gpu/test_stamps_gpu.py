"""Device stamps on a real GPU: the PTX %globaltimer kernel, eager and captured in a CUDA graph, numbered in launch
order per stream, ordered across streams by a real wait, and mapped onto the host clock."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # pragma: no cover
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from specscope.tracer.stamps import StampClock, StampRing  # noqa: E402

DEV = torch.device("cuda")


def test_eager_and_captured_stamps_interleave_in_launch_order() -> None:
    stream = torch.cuda.current_stream(DEV)
    ring = StampRing(DEV, stream, slots=64)
    x = torch.randn(512, 512, device=DEV)
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream(DEV)
    side.wait_stream(stream)
    with torch.cuda.stream(side):
        x @ x  # warm-up outside the graph
    stream.wait_stream(side)
    with torch.cuda.graph(graph):
        ring.launch(torch.cuda.current_stream(DEV).cuda_stream)
        y = x @ x
        ring.launch(torch.cuda.current_stream(DEV).cuda_stream)
    seqs = []
    for _ in range(40):  # 120 stamps through a 64-slot ring: it wraps, drains keep every value
        seqs.append(ring.stamp())
        graph.replay()
        seqs.extend([ring.claim(2), None])
        ring.drain()
    torch.cuda.synchronize()
    assert ring.completed() == ring.count == 120
    assert y.shape == (512, 512)
    # Values of the last 40 stamps are still in their slots: strictly increasing in claim order, replays take time.
    vals = [ring.value(s) for s in range(80, 120)]
    assert vals == sorted(vals)
    starts = [ring.value(s) for s in range(81, 120, 3)]
    ends = [ring.value(s + 1) for s in range(81, 120, 3)]
    assert all(e - s > 0 for s, e in zip(starts, ends, strict=True))


def test_a_stream_wait_orders_stamps_across_streams() -> None:
    """The plan stream waits on an event after a compute stamp; its next stamp is later on the one device clock."""
    compute = torch.cuda.current_stream(DEV)
    plan = torch.cuda.Stream(DEV)
    rc, rp = StampRing(DEV, compute), StampRing(DEV, plan)
    pairs = []
    for _ in range(20):
        torch.cuda._sleep(20_000)  # keep compute busy so the plan stream really waits
        a = rc.stamp()
        ev = torch.cuda.Event()
        ev.record(compute)
        plan.wait_event(ev)
        b = rp.stamp()
        pairs.append((a, b))
    rc.drain()
    rp.drain()
    torch.cuda.synchronize()
    rc.completed(), rp.completed()
    assert all(rp.value(b) >= rc.value(a) for a, b in pairs)


def test_the_clock_puts_stamps_on_the_host_axis() -> None:
    ring = StampRing(DEV, torch.cuda.current_stream(DEV))
    clock = StampClock(ring)
    assert 0 < clock.bracket_ns < 5_000_000
    torch.cuda.synchronize()
    h0 = time.perf_counter_ns()
    s = ring.stamp()
    torch.cuda.synchronize()
    h1 = time.perf_counter_ns()
    ring.wait(s)
    t = clock.ns(ring.value(s))
    slack = clock.bracket_ns
    assert h0 - slack <= t <= h1 + slack


def test_a_side_streams_drains_land_after_its_stamps_and_reuse_their_events() -> None:
    """Drains are driver copies and events on the ring's own stream: a copy enqueued behind a busy stream is not
    'completed' before it ran, `wait` blocks until it has, the values equal the device slots, and the events come
    back to be reused instead of growing with the run."""
    side = torch.cuda.Stream(DEV)
    ring = StampRing(DEV, side, slots=32)
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # ~tens of ms: the drain below cannot have landed when it is asked
    first = ring.stamp()
    ring.drain()
    assert ring.completed() == 0
    ring.wait(first)
    assert ring.completed() == 1
    for _ in range(200):  # laps the 32-slot ring many times, a drain every 4 stamps
        for _ in range(4):
            ring.stamp()
        ring.drain()
        ring.completed()
    ring.wait(ring.count - 1)
    assert ring.completed() == ring.count == 801
    torch.cuda.synchronize()
    dev = ring.dev.cpu().tolist()
    assert [ring.value(s) for s in range(ring.count - 32, ring.count)] == [dev[s % 32] for s in
                                                                           range(ring.count - 32, ring.count)]
    assert len(ring._free_events) + len(ring._drains) <= 16  # 201 drains, a few events reused
