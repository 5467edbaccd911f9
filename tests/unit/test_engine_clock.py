"""The recorder's event clock: CUDA event times become integer host-clock nanoseconds, exact over an hour.

CUDA's `elapsed_time` is a float32 millisecond count; this test feeds the clock the same float32 arithmetic over
integer-nanosecond event times (what the GPU timer keeps), so the conversion is tested without a GPU.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from specscope.tracer.recorder import EventClock  # noqa: E402


def _elapsed_ms(a: int, b: int) -> float:
    return float(np.float32((b - a) / 1e6))  # cudaEventElapsedTime: float milliseconds


EPOCH_GPU, EPOCH_HOST = 7_000_000_000_123, 55_000_000_000


def test_event_times_stay_exact_over_an_hour() -> None:
    """Steps 2-15 ms apart for an hour: every event lands on its exact nanosecond; one epoch would be far off."""
    rng = np.random.default_rng(0)
    gaps = rng.integers(2_000_000, 15_000_000, size=int(3600e9 / 8.5e6))
    ends = EPOCH_GPU + np.cumsum(gaps)  # each step's last event (the next anchor)
    mids = ends - rng.integers(1, 1_000_000, size=ends.size)  # a span event inside the step
    clock = EventClock(EPOCH_GPU, EPOCH_HOST, _elapsed_ms)
    worst = 0
    for mid, end in zip(mids.tolist(), ends.tolist(), strict=True):
        worst = max(worst, abs(clock.ns(mid) - (EPOCH_HOST + mid - EPOCH_GPU)))
        clock.advance(end)
    assert ends[-1] - EPOCH_GPU >= 3600 * 10**9 - 10**9
    assert worst == 0 and clock.anchor_ns == EPOCH_HOST + int(ends[-1]) - EPOCH_GPU
    # What elapsed_time from one epoch gives at the end of the hour: float32 ms, ~100 us apart.
    one_epoch = EPOCH_HOST + round(float(np.float32((int(mids[-1]) - EPOCH_GPU) / 1e6)) * 1e6)
    assert abs(one_epoch - (EPOCH_HOST + int(mids[-1]) - EPOCH_GPU)) > 10_000


def test_a_long_idle_hop_costs_at_most_half_a_float32_step() -> None:
    clock = EventClock(EPOCH_GPU, EPOCH_HOST, _elapsed_ms)
    e = EPOCH_GPU + 2_000_000_001  # the GPU idled 2 s between two steps
    err = abs(clock.ns(e) - (EPOCH_HOST + 2_000_000_001))
    assert err <= 62  # float32 spacing at 2000 ms is 122 ns; busy steps (< 16 ms apart) are exact


def test_advance_returns_the_previous_anchor() -> None:
    clock = EventClock("epoch", 100, lambda a, b: {("epoch", "e1"): 0.5, ("e1", "e2"): 0.25}[(a, b)])
    assert clock.ns("e1") == 100 + 500_000
    assert clock.advance("e1") == "epoch"
    assert (clock.anchor, clock.anchor_ns) == ("e1", 500_100)
    assert clock.ns("e2") == 500_100 + 250_000
