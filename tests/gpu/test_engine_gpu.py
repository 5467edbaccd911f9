"""The engine on a real GPU: lossless speculative decoding, graph replay == eager, clean checks, GPU faults."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # pragma: no cover
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("flashinfer")

import subprocess  # noqa: E402
import sys  # noqa: E402

from specscope.backend.engine_config import EngineConfig  # noqa: E402
from specscope.backend.faults import FAULT_SETTINGS, FAULTS  # noqa: E402
from specscope.backend.session import run_session  # noqa: E402
from specscope.tracer.checks import check_steps  # noqa: E402
from specscope.tracer.schema import ForwardMode, GraphPhase, Severity  # noqa: E402
from specscope.tracer.store import TraceReader  # noqa: E402


def _run(tmp_path, name: str, **kw):
    base = dict(model="tiny", draft="tiny-draft", device="cuda", dtype="bfloat16", batch_size=4, num_requests=8,
                max_new_tokens=32, spec_steps=3, seed=0)
    base.update(kw)
    path = str(tmp_path / f"{name}.db")
    res = run_session(EngineConfig(**base), path, command=f"pytest {name}")
    return {r.request_id: r.output for r in res.requests}, path, res


def _errors(path: str) -> list:
    with TraceReader(path) as r:
        return [v for v in check_steps(r.steps(), r.run) if v.severity == Severity.ERROR]


@pytest.mark.parametrize("page", [16, 64])
def test_speculative_equals_plain_greedy_on_gpu(tmp_path, page: int) -> None:
    spec, p1, res = _run(tmp_path, "spec", page_size=page)
    plain, p2, _ = _run(tmp_path, "plain", spec_steps=0, page_size=page)
    assert res.stats.mean_accept_length > 1.2
    assert spec == plain
    assert _errors(p1) == [] and _errors(p2) == []


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_steady_state_iterations_never_synchronize(tmp_path, temperature: float) -> None:
    """With CUDA graphs (draft extend included), the plan stream and the recorder on, a steady-state speculative
    iteration makes no synchronizing call: torch's sync debug mode raises on any. The one read the scheduler needs is
    an event wait on a pinned non-blocking copy. Greedy output stays lossless on this loop."""
    from specscope.backend.engine import Engine

    guarded: list[int] = []
    original = Engine._spec_iteration

    def under_sync_debug(self: Engine, reqs: list) -> None:
        if self.iteration < 2:  # warm-up: prefill, first graph replays, allocator growth
            return original(self, reqs)
        torch.cuda.set_sync_debug_mode("error")
        try:
            original(self, reqs)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        guarded.append(self.iteration)

    Engine._spec_iteration = under_sync_debug
    try:
        out, p, res = _run(tmp_path, "nosync", cuda_graph=True, plan_stream=True, num_requests=6, batch_size=4,
                           max_new_tokens=48, temperature=temperature)
    finally:
        Engine._spec_iteration = original
    assert len(guarded) >= 8
    assert _errors(p) == []
    with TraceReader(p) as r:
        steps = list(r.steps())
    assert any(s.mode == ForwardMode.DRAFT_EXTEND and s.graph == GraphPhase.REPLAY for s in steps)
    if temperature == 0.0:
        plain, _, _ = _run(tmp_path, "nosync-plain", spec_steps=0, num_requests=6, batch_size=4, max_new_tokens=48)
        assert out == plain


def test_graph_replay_equals_eager_on_gpu(tmp_path) -> None:
    graph, p, _ = _run(tmp_path, "graph", cuda_graph=True, batch_size=6, num_requests=12)
    eager, _, _ = _run(tmp_path, "eager", cuda_graph=False, batch_size=6, num_requests=12)
    assert graph == eager
    with TraceReader(p) as r:
        steps = list(r.steps())
    assert any(s.graph == GraphPhase.REPLAY and s.padded_batch_size > s.batch_size for s in steps)


def test_plan_stream_run_is_clean_and_timed(tmp_path) -> None:
    out, p, _ = _run(tmp_path, "plan", plan_stream=True)
    plain, _, _ = _run(tmp_path, "noplan", plan_stream=False)
    assert out == plain
    assert _errors(p) == []
    with TraceReader(p) as r:
        spans = [sp for s in r.steps() for sp in s.spans]
    assert any(sp.stream == "plan" for sp in spans) and all(sp.end_ns >= sp.start_ns for sp in spans)


def test_plan_stream_order_is_recorded_on_the_gpu_clock(tmp_path) -> None:
    """The verify's plan work starts after its producers end and its launch after the plan work, by CUDA events."""
    _, p, _ = _run(tmp_path, "order", plan_stream=True, num_requests=4)
    with TraceReader(p) as r:
        verifies = [s for s in r.steps() if s.mode == ForwardMode.TARGET_VERIFY and s.iteration >= 0]
    assert verifies
    for s in verifies:
        sp = {x.name: x for x in s.spans}
        assert sp["metadata"].stream == "plan" and len(s.waits) == 2
        assert sp["producers"].end_ns <= sp["metadata"].start_ns <= sp["metadata"].end_ns <= sp["forward"].start_ns


def test_no_plan_wait_race_is_caught_on_gpu(tmp_path) -> None:
    _, p, _ = _run(tmp_path, "race", plan_stream=True, faults=frozenset({"no-plan-wait"}), num_requests=4)
    errors = _errors(p)
    assert "I21" in {v.check_id for v in errors}
    # The race is seen on the GPU's own clock: the plan work started before the (delayed) producers ended.
    # On the GPU's own clock the plan work may or may not overlap the delayed producers (host syncs in the plan
    # path can drain the compute stream first); the missing wait edge is what is always recorded.
    assert any("no wait edge orders it after them" in v.message for v in errors if v.check_id == "I21")


@pytest.mark.parametrize("fault", [f for f in FAULTS if f.name != "wild-page-id"], ids=lambda f: f.name)
def test_fault_is_caught_on_gpu(tmp_path, fault) -> None:
    """Every fault is caught by value-based invariants on the GPU too (a run may fail, as upstream's would)."""
    path = str(tmp_path / "bad.db")
    cfg = dict(model="tiny", draft="tiny-draft", device="cuda", dtype="bfloat16", batch_size=4, num_requests=6,
               max_new_tokens=16, spec_steps=3, prompt_len=(16, 80))
    cfg.update(FAULT_SETTINGS[fault.name])
    try:
        run_session(EngineConfig(**cfg, faults=frozenset({fault.name})), path, command="pytest gpu fault")
    except Exception:  # noqa: BLE001 - e.g. XQA's argument check rejects the override's regrouping (K1)
        pass
    assert fault.expected_check in {v.check_id for v in _errors(path)}
    with TraceReader(path) as r:
        assert r.fault_report()[0].fired >= 1


def test_sticky_cuda_error_keeps_every_pending_step(tmp_path) -> None:
    """wild-page-id hands XQA a page id outside any allocation: a real illegal memory access (sticky). The run
    exits with one line; the trace keeps every pending step, the verify it hit marked with the error verbatim."""
    path = str(tmp_path / "sticky.db")
    res = subprocess.run([sys.executable, "-m", "specscope.ui.cli", "run", "--device", "cuda", "--inject",
                          "wild-page-id", "--requests", "4", "--batch-size", "2", "--max-new-tokens", "16", "--quiet",
                          "-o", path], capture_output=True, text=True, timeout=900)
    lines = [x for x in res.stderr.strip().splitlines() if x.strip()]
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert len(lines) == 1 and lines[0].startswith("specscope: error:") and "illegal memory access" in lines[0]
    with TraceReader(path) as r:
        steps = list(r.steps())
        vs = list(check_steps(steps, r.run))
    assert [s.index for s in steps] == list(range(len(steps)))
    fatal = [s for s in steps if any(e.fatal for e in s.errors)]
    assert len(fatal) == 1 and fatal[0].index == steps[-1].index
    assert fatal[0].mode == ForwardMode.TARGET_VERIFY and "wild-page-id" in fatal[0].faults_fired
    assert "illegal memory access" in fatal[0].errors[-1].message
    before = [s for s in steps if s.iteration == fatal[0].iteration and s.mode == ForwardMode.DRAFT_DECODE]
    assert len(before) == 2  # the iteration's N-1 draft steps, still pending when the error hit, were written
    assert any(v.check_id == "K1" and "fatal" in v.message and v.step == fatal[0].index for v in vs)


@pytest.mark.parametrize("plan_stream", [False, True])
def test_snapshot_ring_records_what_the_kernels_consumed_on_gpu(tmp_path, monkeypatch, plan_stream: bool) -> None:
    """Replays write their metadata snapshot into the device ring inside the captured graph; each replay's live rows
    hold what an eager run of the same workload records for the same step (the ring at its smallest, 16 rows, so
    it wraps)."""
    from ring_compare import assert_replays_hold_what_eager_steps_consumed
    from specscope.tracer import recorder as recorder_mod

    monkeypatch.setattr(recorder_mod, "RING_BYTES", 1)
    graph_out, graphs, _ = _run(tmp_path, "graphs", plan_stream=plan_stream, page_size=16)
    eager_out, eager, _ = _run(tmp_path, "eager", plan_stream=plan_stream, page_size=16, cuda_graph=False)
    assert graph_out == eager_out  # the same schedule, step for step
    with TraceReader(graphs) as a, TraceReader(eager) as b:
        assert assert_replays_hold_what_eager_steps_consumed(a, b) > 48
    assert _errors(graphs) == [] and _errors(eager) == []


def test_a_gpu_run_records_its_clock_brackets(tmp_path) -> None:
    """The recorder brackets the GPU clock's offset at its start and again at close (meta rows), so `info` can say
    how far GPU spans drifted against host times over the run; a short run drifts by well under a bracket."""
    import json
    import subprocess
    import sys

    from specscope.tracer.run_end import CLOCK_END, CLOCK_START
    from specscope.tracer.summary import gpu_clock

    _, path, _ = _run(tmp_path, "clock", num_requests=4, max_new_tokens=16)
    with TraceReader(path) as r:
        meta = r.meta()
    start, end = json.loads(meta[CLOCK_START]), json.loads(meta[CLOCK_END])
    assert 0 < start["bracket_ns"] < 200_000 and 0 < end["bracket_ns"] < 200_000
    assert end["at_ns"] > start["at_ns"]
    clock = gpu_clock(meta)
    assert clock is not None and abs(clock["drift_us"]) < 50  # ~2 ppm over a few seconds: well under 1 µs
    p = subprocess.run([sys.executable, "-m", "specscope.ui.cli", "info", "--no-check", path], capture_output=True,
                       text=True)
    assert p.returncode == 0 and "by close it had moved" in p.stdout, p.stdout + p.stderr
