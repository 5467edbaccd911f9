"""Stream ordering (I21, I22) from recorded spans and wait edges, and I28 / K1 from recorded call errors: each
judged from a real plan-stream run's steps with one fact changed, written through the public writer."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("torch")

from checkgen import base_run, check, find, ids, replace_step  # noqa: E402
from specscope.tracer.schema import CallError, ForwardMode, StreamWait  # noqa: E402


@pytest.fixture(scope="module")
def base() -> tuple:
    return base_run()


def _plan_verify(steps) -> int:
    return find(steps, lambda s: s.mode == ForwardMode.TARGET_VERIFY and s.iteration >= 0)


def test_the_plan_stream_run_records_spans_and_wait_edges(base) -> None:
    _, steps = base
    s = steps[_plan_verify(steps)]
    spans = {(sp.stream, sp.name) for sp in s.spans}
    assert {("compute", "producers"), ("plan", "metadata"), ("compute", "forward")} <= spans
    assert set(s.waits) == {StreamWait("plan", "compute", "producers"), StreamWait("compute", "plan", "metadata")}
    assert all(sp.end_ns >= sp.start_ns for sp in s.spans)


def test_missing_wait_edges_are_i21_and_i22(tmp_path, base) -> None:
    run, steps = base
    i = _plan_verify(steps)
    bad = dataclasses.replace(steps[i], waits=())
    vs = [v for v in check(str(tmp_path / "t.db"), run, replace_step(steps, i, bad)) if v.step == steps[i].index]
    assert sorted(v.check_id for v in vs) == ["I21", "I22"]
    assert all("no wait edge" in v.message for v in vs)


def test_plan_work_before_its_producers_end_is_i21_even_with_an_edge(tmp_path, base) -> None:
    run, steps = base
    i = _plan_verify(steps)
    s = steps[i]
    prod = next(sp for sp in s.spans if sp.name == "producers")
    spans = tuple(dataclasses.replace(sp, start_ns=prod.end_ns - 1000) if sp.name == "metadata" else sp
                  for sp in s.spans)
    vs = check(str(tmp_path / "t.db"), run, replace_step(steps, i, dataclasses.replace(s, spans=spans)))
    hit = [v for v in vs if v.step == s.index]
    assert [v.check_id for v in hit] == ["I21"] and "1.0 us before" in hit[0].message
    assert hit[0].array == "span:plan:metadata" and hit[0].found == str(prod.end_ns - 1000)


def test_launch_before_its_metadata_ends_is_i22(tmp_path, base) -> None:
    run, steps = base
    i = _plan_verify(steps)
    s = steps[i]
    meta = next(sp for sp in s.spans if sp.name == "metadata")
    spans = tuple(dataclasses.replace(sp, start_ns=meta.end_ns - 5) if sp.name == "forward" else sp
                  for sp in s.spans)
    vs = check(str(tmp_path / "t.db"), run, replace_step(steps, i, dataclasses.replace(s, spans=spans)))
    assert [v.check_id for v in vs if v.step == s.index] == ["I22"]


def test_one_stream_needs_no_edge(tmp_path) -> None:
    """Plan stream off: metadata runs on the compute stream after the producers, in stream order."""
    run, steps = base_run(plan_stream=False)
    s = steps[_plan_verify(steps)]
    assert {sp.stream for sp in s.spans} == {"compute"} and s.waits == ()
    assert check(str(tmp_path / "t.db"), run, steps) == []


@pytest.mark.parametrize("err,want,fragment", [
    (CallError("update_verify_buffers_to_fill_after_draft", "NotImplementedError", "no hook"), "I28", "no hook"),
    (CallError("kernel:trtllm_batch_decode_with_kv_cache", "KernelArgumentError", "24 query tokens are not a "
               "multiple of q_len_per_req 5"), "K1", "not a multiple of q_len_per_req 5"),
    (CallError("cuda", "AcceleratorError", "CUDA error: an illegal memory access was encountered", True), "K1",
     "fatal"),
])
def test_call_errors_are_i28_and_k1(tmp_path, base, err: CallError, want: str, fragment: str) -> None:
    run, steps = base
    i = _plan_verify(steps)
    bad = dataclasses.replace(steps[i], errors=(err,))
    vs = check(str(tmp_path / "t.db"), run, replace_step(steps, i, bad))
    assert ids(vs) == {want}
    assert fragment in vs[0].message and err.message in vs[0].message and vs[0].array == f"call:{err.call}"
