"""One engine, several workloads (backend/session.py open_session): built once with CUDA graphs and the plan stream,
it serves two workloads back to back on the CPU, as losslessly as a fresh engine, into one consistent trace."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from specscope.backend.engine_config import EngineConfig  # noqa: E402
from specscope.backend.session import open_session, run_session  # noqa: E402
from specscope.tracer.checks import Checker  # noqa: E402
from specscope.tracer.schema import Severity  # noqa: E402
from specscope.tracer.store import TraceReader  # noqa: E402

NEW_TOKENS = 12


def cfg(seed: int) -> EngineConfig:
    """The tiny pair on the CPU: bs 2, staggered arrivals, fixed length (EOS ignored), graphs and plan stream on."""
    return EngineConfig(model="tiny", draft="tiny-draft", device="cpu", dtype="float32", batch_size=2,
                        num_requests=3, max_new_tokens=NEW_TOKENS, spec_steps=3, seed=seed, prompt_len=(16, 48),
                        arrival_gap=(0, 2), ignore_eos=True, cuda_graph=True, plan_stream=True)


def test_two_workloads_on_one_engine_match_fresh_runs_and_check_clean(tmp_path) -> None:
    path = str(tmp_path / "reuse.db")
    with open_session(cfg(0), path, command="pytest reuse") as s:
        first = s.requests
        st1 = s.run(first)
        end1 = s.engine.iteration
        second = s.fresh_requests(1)
        arrivals = [r.arrival_iteration for r in second]
        st2 = s.run(second)
        assert s.writer is not None and s.check_result is None  # the checker's summary comes once the trace closed
        with pytest.raises(ValueError, match="already served"):
            s.run(first)  # the same requests (ids) twice would merge two requests' records in the trace
    for stats, reqs in ((st1, first), (st2, second)):
        assert all(r.finish_reason == "length" and len(r.output) == NEW_TOKENS for r in reqs)
        assert stats.output_tokens == len(reqs) * NEW_TOKENS and stats.mean_accept_length > 1.0
        assert stats.iterations == len(stats.iteration_s) > 0  # this run's iterations only (no idle gaps here)
    # The second workload's arrivals count from where the first left off; its ids follow the first's.
    assert [r.arrival_iteration for r in second] == [a + end1 for a in arrivals]
    assert min(r.request_id for r in second) > max(r.request_id for r in first)

    # Lossless: what the reused engine generated is what fresh engines generate for the same workloads.
    fresh = {seed: run_session(cfg(seed), None, command="pytest fresh").requests for seed in (0, 1)}
    for reqs, seed in ((first, 0), (second, 1)):
        assert [r.prompt for r in reqs] == [r.prompt for r in fresh[seed]]
        assert [r.output for r in reqs] == [r.output for r in fresh[seed]]

    # One trace holds both workloads: their steps, their requests, and no violation (live or offline).
    assert s.check_result is not None and s.check_result.num_errors == 0
    with TraceReader(path) as reader:
        steps = list(reader.steps())
        checker = Checker.for_trace(reader)
        found = [v for step in steps for v in checker.feed(step)]
        records = {r.request_id: r for r in reader.requests()}
    assert [v for v in found if v.severity == Severity.ERROR] == []
    iterations = {s.iteration for s in steps if s.iteration >= 0}
    assert min(iterations) < end1 <= max(iterations) and max(iterations) == end1 + st2.iterations - 1
    assert sorted(records) == [r.request_id for r in first + second]
    assert all(tuple(r.output) == records[r.request_id].output_tokens for r in first + second)
    served = {rid for s in steps if s.iteration >= end1 for rid in (q.request_id for q in s.requests)}
    assert served == {r.request_id for r in second}


def test_a_second_workload_without_trace_reuses_slots_and_pages(tmp_path) -> None:
    with open_session(cfg(2), None, command="pytest reuse") as s:
        free = (s.engine.r2t.num_free, s.engine.pages.num_free)
        for seed in (2, 3, 4):
            reqs = s.requests if seed == 2 else s.fresh_requests(seed)
            s.run(reqs)
            assert all(len(r.output) == NEW_TOKENS for r in reqs)
            assert (s.engine.r2t.num_free, s.engine.pages.num_free) == free  # everything freed at finish
        assert s.trace_path is None and s.writer is None
    assert s.check_result is None  # no trace: no checker


def test_checking_off_starts_no_live_checker(tmp_path) -> None:
    path = str(tmp_path / "unchecked.db")
    res = run_session(cfg(5), path, command="pytest unchecked", check=False)
    assert res.check is None
    with TraceReader(path) as reader:
        assert reader.num_steps() > 0
        assert reader.checked_through() is None  # a checker marks -1 the moment it starts
