"""Stamp rings (tracer.stamps) on the CPU: the claim / drain / completion bookkeeping a GPU run uses, with host times
in place of %globaltimer; and what the recorder does with them (spans resolved from stamps, held steps kept whole
when a ring laps)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from specscope.tracer.probe import _PendingSpan  # noqa: E402
from specscope.tracer.recorder import Recorder  # noqa: E402
from specscope.tracer.schema import ForwardMode, GraphPhase  # noqa: E402
from specscope.tracer.stamps import StampClock, StampRing, row_ranges  # noqa: E402

CPU = torch.device("cpu")


def test_stamps_are_numbered_in_launch_order_and_land_with_a_drain() -> None:
    ring = StampRing(CPU, slots=16)
    seqs = [ring.stamp() for _ in range(5)]
    assert seqs == [0, 1, 2, 3, 4]
    assert ring.completed() == 0  # nothing drained: the values are still "on the device"
    ring.drain()
    assert ring.completed() == 5
    values = [ring.value(s) for s in seqs]
    assert values == sorted(values) and len(set(values)) == 5  # host times, strictly increasing


def test_captured_stamps_are_claimed_after_the_launch() -> None:
    """A replay's two stamps are launched by the graph and numbered afterwards; eager stamps around them keep their
    order."""
    ring = StampRing(CPU, slots=16)
    before = ring.stamp()
    ring.launch()
    ring.launch()
    first = ring.claim(2)
    after = ring.stamp()
    ring.drain()
    assert (before, first, after) == (0, 1, 3)
    assert ring.value(before) < ring.value(first) < ring.value(first + 1) < ring.value(after)


def test_a_ring_drains_itself_before_the_device_could_lap_it() -> None:
    ring = StampRing(CPU, slots=8)
    for _ in range(4):
        ring.stamp()
    assert ring.drained == 4  # half the slots undrained forces a drain
    for _ in range(13):
        ring.stamp()
    ring.drain()
    assert ring.completed() == 17
    assert [ring.value(s) for s in range(9, 17)] == sorted(ring.value(s) for s in range(9, 17))


def test_wait_drains_what_it_waits_for() -> None:
    ring = StampRing(CPU, slots=16)
    s = ring.stamp()
    ring.wait(s)
    assert ring.completed() == 1 and ring.value(s) > 0


def test_the_cpu_clock_is_the_host_clock() -> None:
    clock = StampClock(StampRing(CPU))
    assert clock.offset_ns == 0 and clock.ns(123) == 123


def test_row_ranges_wrap() -> None:
    assert row_ranges(0, 4, 16) == [(0, 4)]
    assert row_ranges(14, 18, 16) == [(14, 16), (0, 2)]
    assert row_ranges(12, 16, 16) == [(12, 16)]
    assert row_ranges(3, 40, 16) == [(0, 16)]


class _Writer:
    def __init__(self) -> None:
        self.steps: list[dict] = []
        self.meta: dict[str, str] = {}

    def write_meta(self, key: str, value: str) -> None:
        self.meta[key] = value

    def write_raw_step(self, raw: dict) -> None:
        self.steps.append(raw)

    def write_raw_steps(self, raws: list[dict]) -> None:
        self.steps.extend(raws)

    def close(self) -> None:
        pass


def _begin(rec: Recorder, i: int):  # noqa: ANN202
    return rec.begin_step(iteration=i, mode=ForwardMode.DRAFT_DECODE, model="draft", step_id=0, batch_size=1,
                          padded_batch_size=1, graph=GraphPhase.REPLAY, tokens_per_request=1, num_draft_tokens=4,
                          page_size=16)


def test_recorded_spans_come_from_the_stamps_in_order() -> None:
    """A span around a region and a graph's own span resolve to ordered host times on one clock."""
    w = _Writer()
    rec = Recorder(w, CPU)  # type: ignore[arg-type]
    step = _begin(rec, 0)
    with rec.span(step, "compute", "metadata"):
        pass
    ring = rec.compute_stamps
    ring.launch()
    ring.launch()
    rec.graph_span(step, "compute", "forward", ring)
    rec.end_step(step)
    rec.close()
    (raw,) = w.steps
    (s1, n1, a1, b1), (s2, n2, a2, b2) = raw["spans"]
    assert (s1, n1, s2, n2) == ("compute", "metadata", "compute", "forward")
    assert 0 < a1 <= b1 <= a2 <= b2


def test_each_stream_stamps_on_its_own_ring_and_a_raising_body_leaves_no_span() -> None:
    """Spans of the plan and the compute stream (on the CPU both streams are None, told apart by name) stamp on one
    ring each, whichever came first; a region that raises records nothing and the exception goes on."""
    w = _Writer()
    rec = Recorder(w, CPU)  # type: ignore[arg-type]
    step = _begin(rec, 0)
    for stream in ("compute", "plan", "compute", "plan"):
        with rec.span(step, stream, "metadata"):
            pass
    with pytest.raises(KeyError), rec.span([step], "plan", "producers"):
        raise KeyError("boom")
    rings = {sp.stream: {sp.start[0], sp.end[0]} for sp in step.spans}
    assert len(step.spans) == 4 and rings["compute"] == {rec.compute_stamps}
    assert len(rings["plan"]) == 1 and rings["plan"] != rings["compute"]
    assert rec.compute_stamps.count == 4 and next(iter(rings["plan"])).count == 5  # the raising body's first stamp
    rec.end_step(step)
    rec.close()
    assert [sp[:2] for sp in w.steps[0]["spans"]] == [("compute", "metadata"), ("plan", "metadata")] * 2


def test_a_held_back_step_keeps_its_times_when_the_ring_laps() -> None:
    """A step held open while thousands of later stamps go by: its stamps are read out before the drain that reuses
    their host slots, so it is written with its own times, not a later step's."""
    w = _Writer()
    rec = Recorder(w, CPU)  # type: ignore[arg-type]
    ring = rec.compute_stamps
    held = _begin(rec, 0)
    with rec.span(held, "compute", "metadata"):
        pass
    sp = held.spans[0]
    assert isinstance(sp, _PendingSpan) and type(sp.start) is tuple
    ring.drain()
    ring.completed()
    t0, t1 = ring.value(sp.start[1]), ring.value(sp.end[1])
    for _ in range(ring.slots * 2):  # the held step is still open: nothing after it can be written
        ring.stamp()
    assert (sp.start, sp.end) == (t0, t1)  # read out, as host ns, before its slots were reused
    rec.end_step(held)
    rec.close()
    assert w.steps[0]["spans"][0][2:] == (t0, t1)


def test_a_gpu_without_device_stamps_is_one_clear_error_and_no_empty_trace(tmp_path, monkeypatch) -> None:
    """Where the stamp kernel cannot load (a driver too old for the PTX, no libcuda), the run says so in one sentence
    and leaves no trace file behind; the stamp failure is simulated, the session's handling is the real one."""
    from specscope.backend.config_error import ConfigError
    from specscope.backend.engine_config import EngineConfig
    from specscope.backend.session import run_session
    from specscope.tracer import recorder as recorder_mod

    class NoStamps:
        def __init__(self, *a: object, **k: object) -> None:
            raise RuntimeError("cuModuleLoadData failed: CUDA_ERROR_UNSUPPORTED_PTX_VERSION (222)")

    monkeypatch.setattr(recorder_mod, "StampRing", NoStamps)
    path = tmp_path / "t.db"
    cfg = EngineConfig(model="tiny", draft="tiny-draft", device="cpu", batch_size=1, num_requests=1,
                       max_new_tokens=4, spec_steps=2)
    with pytest.raises(ConfigError, match="cannot record on cpu: cuModuleLoadData failed"):
        run_session(cfg, str(path), command="pytest")
    assert not list(tmp_path.glob("t.db*"))
