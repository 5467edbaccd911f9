"""The reader's query API (tracer/query.py) on real trace files: schema 2 traces written through the public
writer (SQL over the queryable tables) and the schema 1 fixtures (body-decoding fallback), each checked
against a brute-force answer computed from the decoded steps."""

from __future__ import annotations

import dataclasses
import os
import threading
import time

import pytest
from specscope.tracer.errors import TraceIndexError
from specscope.tracer.query import StepFilter, summary_fields
from specscope.tracer.schema import (
    CallError,
    GraphPhase,
    RequestRow,
    RequestState,
    Severity,
    SpanRow,
    Step,
    StreamWait,
    Violation,
)
from specscope.tracer.store import TraceReader, TraceWriter, append_violations, mark_checked
from stepgen import make_request, make_run, make_step

HERE = os.path.dirname(os.path.abspath(__file__))
V1 = [os.path.join(HERE, "..", "data", "v1", n) for n in ("cpu-default.db", "cpu-fault-stale-page-table.db")]
N = 90
BIG_ID = 2**40 + 7  # needs 8-byte ids in step_requests


def rich_step(i: int) -> Step:
    """stepgen's step i with requests that come and go, a 64-bit request id, and the v2 facts."""
    s = make_step(i)
    reqs = list(s.requests)
    if i < 20:
        reqs = reqs[:3]  # request 1003 arrives at step 20
    if 30 <= i < 41:
        reqs.append(RequestState(BIG_ID, 7, 50 + i, 51 + i, 1))
    if i % 9 == 4:
        reqs = reqs[1:]  # request 1000 sits out some steps
    mode_bs = len(reqs)
    faults = ("stale-page-table",) if i % 10 == 3 else ()
    return dataclasses.replace(
        s, requests=tuple(reqs), batch_size=mode_bs, padded_batch_size=max(mode_bs, s.padded_batch_size),
        waits=(StreamWait("plan", "compute", "producers"),), faults_fired=faults,
        errors=(CallError("kernel:xqa", "RuntimeError", "rejected"),) if i == 17 else (),
        violations=tuple(dataclasses.replace(v, array="cache_seqlens", row=1, col=None, found="7", expected="8")
                         for v in s.violations),
    )  # fmt: skip


@pytest.fixture(scope="module")
def v2_trace(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("q") / "v2.db")
    run = dataclasses.replace(make_run(), config={**make_run().config, "faults": ["stale-page-table", "never"]})
    with TraceWriter(path, run) as w:
        for i in range(N):
            w.write_step(rich_step(i))
        for r in range(3):
            w.write_request(make_request(r))
    append_violations(path, [Violation("I21", Severity.ERROR, 77, "plan before producers", None, "spans", None,
                                       None, "start 5", "after 9"),
                             Violation("I40", Severity.WARNING, 12, "acceptance collapse", 1002)])  # fmt: skip
    return path


def _traces(v2_trace: str) -> list[str]:
    return [v2_trace, *V1]


# -- brute force ---------------------------------------------------------------------------------------------


def _all(r: TraceReader) -> tuple[list[Step], list[Violation]]:
    return list(r.steps()), r.violations()


def _matches(s: Step, f: StepFilter, vs_by_step: dict[int, list[Violation]]) -> bool:
    vs = vs_by_step.get(s.index, [])
    return ((f.mode is None or s.mode.value == f.mode) and (f.model is None or s.model == f.model)
            and (f.graph is None or s.graph.value == f.graph) and (f.iteration is None or s.iteration == f.iteration)
            and (f.request_id is None or any(q.request_id == f.request_id for q in s.requests))
            and (f.check_id is None or any(v.check_id == f.check_id for v in vs))
            and (f.severity is None or any(v.severity.value == f.severity for v in vs))
            and (not f.has_violation or bool(vs)))  # fmt: skip


@pytest.mark.parametrize("which", [0, 1, 2])
def test_summaries_match_the_steps(v2_trace: str, which: int) -> None:
    path = _traces(v2_trace)[which]
    with TraceReader(path) as r:
        steps, vs = _all(r)
        rows = r.summaries()
        assert [s.index for s in rows] == [s.index for s in steps]
        for st, su in zip(steps, rows, strict=True):
            mine = [v for v in vs if v.step == st.index]
            assert (su.mode, su.model, su.step_id, su.batch_size, su.padded_batch_size, su.graph) == (
                st.mode, st.model, st.step_id, st.batch_size, st.padded_batch_size, st.graph)
            assert (su.tokens_per_request, su.num_draft_tokens, su.page_size, su.start_ns, su.end_ns, su.scalars) == (
                st.tokens_per_request, st.num_draft_tokens, st.page_size, st.start_ns, st.end_ns, st.scalars)
            assert su.num_errors == sum(v.severity == Severity.ERROR for v in mine)
            assert su.num_warnings == sum(v.severity == Severity.WARNING for v in mine)
            if st.mode.value == "TARGET_VERIFY" and st.requests:
                hist = [0] * (max(q.accept_length for q in st.requests) + 1)
                for q in st.requests:
                    hist[q.accept_length] += 1
                assert su.accept_hist == tuple(hist)
        n = len(steps)
        assert r.summaries(n // 3, n // 3 + 7) == rows[n // 3 : n // 3 + 7]
        assert list(r.iter_summaries(2, 9, backward=True)) == rows[2:9][::-1]
        assert r.summary(n - 1) == rows[-1]
        with pytest.raises(TraceIndexError):
            r.summary(n + 5)
        assert summary_fields(rows[0])["bs"] == rows[0].batch_size


@pytest.mark.parametrize("which", [0, 1, 2])
def test_find_steps_by_every_filter(v2_trace: str, which: int) -> None:
    path = _traces(v2_trace)[which]
    with TraceReader(path) as r:
        steps, vs = _all(r)
        by_step: dict[int, list[Violation]] = {}
        for v in vs:
            by_step.setdefault(v.step, []).append(v)
        rids = sorted({q.request_id for s in steps for q in s.requests})
        checks = sorted({v.check_id for v in vs})
        filters = [StepFilter(mode="TARGET_VERIFY"), StepFilter(model="draft", graph="replay"),
                   StepFilter(iteration=3), StepFilter(has_violation=True), StepFilter(severity="error"),
                   StepFilter(severity="warning"), StepFilter(mode="DRAFT_DECODE", has_violation=True)]
        filters += [StepFilter(request_id=q) for q in rids[:3] + rids[-2:]] + [StepFilter(check_id=c) for c in checks]
        filters += [StepFilter(request_id=rids[-1], check_id=checks[0])] if checks else []
        filters.append(StepFilter(request_id=123456789))  # never present
        n = len(steps)
        for f in filters:
            want = [s.index for s in steps if _matches(s, f, by_step)]
            assert r.find_steps(f, limit=None) == want, f
            assert [s.index for s in r.summaries(0, None, f)] == want, f
            mid = n // 2
            assert r.find_steps(f, after=mid, limit=2) == [i for i in want if i > mid][:2], f
            assert r.find_steps(f, after=mid, limit=3, backward=True) == [i for i in want if i < mid][::-1][:3], f
            assert [s.index for s in r.summaries(5, mid, f)] == [i for i in want if 5 <= i < mid], f


def test_find_steps_by_text_bs_change_and_condition(v2_trace: str) -> None:
    with TraceReader(v2_trace) as r:
        steps = list(r.steps())
        assert r.find_steps("request 1003", limit=1) == [20]
        assert r.find_steps(f"r{BIG_ID}", limit=None) == list(range(30, 41))
        assert r.find_steps("I21") == [77]
        assert r.find_steps("verify", limit=None) == [s.index for s in steps if s.mode.value == "TARGET_VERIFY"]
        want = [s.index for s in steps if s.batch_size >= 4 and s.graph == GraphPhase.REPLAY]
        assert r.find_steps("bs >= 4 and graph == replay", limit=None) == want
        prev: dict[tuple[str, str], Step] = {}
        change = []
        for s in steps:
            p = prev.get((s.model, s.mode.value))
            if p is not None and p.batch_size != s.batch_size:
                change.append(s.index)
            prev[(s.model, s.mode.value)] = s
        assert r.find_steps("bs change", limit=None) == change
        for after in (change[2], change[2] - 1, N // 2):  # walks that start mid-trace know the steps before
            assert r.find_steps("bs change", after=after, limit=None) == [i for i in change if i > after]
            assert r.find_steps("bs change", after=after, limit=None, backward=True) == [
                i for i in change if i < after][::-1]
        verify_change = [i for i in change if steps[i].mode.value == "TARGET_VERIFY"]
        assert r.find_steps(StepFilter(mode="TARGET_VERIFY", bs_change=True), limit=None) == verify_change
        want = [s.index for a, s in zip(steps, steps[1:], strict=False) if s.batch_size != a.batch_size]
        verify_prev = [i for i in want if steps[i].mode.value == "TARGET_VERIFY"]
        assert r.find_steps(StepFilter(mode="TARGET_VERIFY", condition="bs != prev.bs"), limit=None) == verify_prev
        assert r.find_steps("bs != prev.bs", after=want[1], limit=None) == [i for i in want if i > want[1]]
        # `prev` in a condition is the step just before in the trace, in either walk direction.
        want = [s.index for a, s in zip(steps, steps[1:], strict=False) if s.batch_size != a.batch_size]
        assert r.find_steps("bs != prev.bs", limit=None) == want
        assert r.find_steps("bs != prev.bs", after=N, limit=2, backward=True) == want[::-1][:2]


@pytest.mark.parametrize("which", [0, 1, 2])
def test_spans_and_request_history(v2_trace: str, which: int) -> None:
    path = _traces(v2_trace)[which]
    with TraceReader(path) as r:
        steps = list(r.steps())
        all_spans = sorted((SpanRow(s.index, s.model, s.mode, p.stream, p.name, p.start_ns, p.end_ns)
                            for s in steps for p in s.spans), key=lambda x: (x.start_ns, x.step))  # fmt: skip
        assert sorted(r.spans(), key=lambda x: (x.start_ns, x.step, x.stream)) == sorted(
            all_spans, key=lambda x: (x.start_ns, x.step, x.stream))
        if all_spans:
            t0 = all_spans[len(all_spans) // 3].start_ns + 1
            t1 = t0 + (all_spans[-1].end_ns - all_spans[0].start_ns) // 10
            want = [s for s in all_spans if s.end_ns > t0 and s.start_ns < t1]
            key = lambda x: (x.start_ns, x.step, x.stream, x.name)  # noqa: E731
            assert sorted(r.spans(t0, t1), key=key) == sorted(want, key=key)
            assert sorted(r.spans(None, t1), key=key) == sorted([s for s in all_spans if s.start_ns < t1], key=key)
            assert sorted(r.spans(t0, None), key=key) == sorted([s for s in all_spans if s.end_ns > t0], key=key)
            a, b = len(steps) // 4, len(steps) // 2
            assert sorted(r.spans(steps=(a, b)), key=key) == sorted([s for s in all_spans if a <= s.step < b],
                                                                      key=key)
        rids = sorted({q.request_id for s in steps for q in s.requests})
        for rid in rids[:2] + rids[-2:] + [987654321]:
            want_rows = [RequestRow(s.index, s.iteration, s.mode, s.model, q.request_id, q.slot, q.seq_len_before,
                                    q.seq_len_after, q.num_q_tokens, q.accept_length)
                         for s in steps for q in s.requests if q.request_id == rid]  # fmt: skip
            assert r.request_history(rid) == want_rows


@pytest.mark.parametrize("which", [0, 1, 2])
def test_capture_of(v2_trace: str, which: int) -> None:
    path = _traces(v2_trace)[which]
    with TraceReader(path) as r:
        steps = list(r.steps())
        for s in steps:
            if s.graph == GraphPhase.CAPTURE:
                want: int | None = s.index
            elif s.graph == GraphPhase.REPLAY:
                caps = [c.index for c in steps[: s.index] if c.graph == GraphPhase.CAPTURE and
                        (c.model, c.mode, c.step_id, c.padded_batch_size) ==
                        (s.model, s.mode, s.step_id, s.padded_batch_size)]  # fmt: skip
                want = caps[-1] if caps else None
            else:
                want = None
            assert r.capture_of(s.index) == want, s.index


def test_fault_report_checked_through_and_v2_facts(v2_trace: str) -> None:
    with TraceReader(v2_trace) as r:
        rep = {f.fault: f for f in r.fault_report()}
        assert rep["stale-page-table"].fired == len(range(3, N, 10)) and rep["stale-page-table"].first_step == 3
        assert rep["never"].fired == 0 and rep["never"].first_step is None
        assert r.step(17).errors == (CallError("kernel:xqa", "RuntimeError", "rejected"),)
        assert r.step(5).waits == (StreamWait("plan", "compute", "producers"),)
        assert r.checked_through() is None
        cell = r.violations(check_id="I21")[0]
        assert (cell.array, cell.row, cell.col, cell.found, cell.expected) == (
            "spans", None, None, "start 5", "after 9")
        rec = r.violations(source="recorder")
        assert rec and all(v.array == "cache_seqlens" and v.row == 1 and v.found == "7" for v in rec)
        assert r.violation_sources() == {"recorder": len(rec), "check": 2}
    mark_checked(v2_trace, N - 1)
    with TraceReader(v2_trace) as r:
        assert r.checked_through() == N - 1
    for path in V1:
        with TraceReader(path) as r:
            assert r.checked_through() is None
            assert all(f.fired == 0 for f in r.fault_report())  # schema 1 recorded no firings


def test_step_decodes_only_the_named_arrays(v2_trace: str) -> None:
    with TraceReader(v2_trace) as r:
        one = r.step(33, arrays=("cache_seqlens",))
        assert not r.step_table.num_cached_arrays()  # req_to_token_page_starts's blob was never fetched nor decoded
        full = r.step(33)
        assert [a.name for a in one.arrays] == ["cache_seqlens"] and one.arrays[0] == full.array("cache_seqlens")
        assert dataclasses.replace(one, arrays=full.arrays) == full
        assert r.step(33, arrays=()).arrays == ()
    with TraceReader(v2_trace) as r:
        big = r.step(33, arrays=["req_to_token_page_starts", "nope"])
        assert [a.name for a in big.arrays] == ["req_to_token_page_starts"] and r.step_table.num_cached_arrays() >= 1


def test_wait_for_steps_follows_a_live_writer(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "live.db")
    w = TraceWriter(path, make_run())
    total = 40

    def produce() -> None:
        for i in range(total):
            w.write_step(make_step(i))
            w.flush()
            time.sleep(0.01)
        w.close()

    th = threading.Thread(target=produce)
    with TraceReader(path) as r:
        assert r.wait_for_steps(-1, 0.05) == 0  # nothing yet: returns at the timeout
        th.start()
        seen, rounds = 0, 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            n = r.wait_for_steps(seen - 1, 5.0)
            rounds += 1
            assert n >= seen
            if n > seen:
                assert r.summaries(seen, n)[-1].index == n - 1
                seen = n
            if r.is_closed() and seen == r.num_steps():
                break
        th.join()
        assert seen == total and rounds > 1
        t = time.monotonic()
        assert r.wait_for_steps(total - 1, 30.0) == total  # closed: returns at once
        assert time.monotonic() - t < 5


def test_violations_page_filters_and_pages_in_sql(v2_trace: str) -> None:
    from specscope.tracer.query import ViolationFilter as F

    with TraceReader(v2_trace) as r:
        every = r.violations()
        assert every and r.count_violations() == len(every)
        assert r.violations_page(None, 0, None) == every
        pages = [r.violations_page(None, k, 3) for k in range(0, len(every), 3)]
        assert [v for p in pages for v in p] == every
        modes = {s.index: s.mode.value for s in r.summaries()}
        for f, keep in [
            (F(check_ids=(every[0].check_id,)), lambda v: v.check_id == every[0].check_id),
            (F(severity="warning"), lambda v: v.severity == Severity.WARNING),
            (F(mode=modes[every[-1].step]), lambda v: modes[v.step] == modes[every[-1].step]),
            (F(start=20, stop=50), lambda v: 20 <= v.step < 50),
            (F(text=every[0].message[3:9].upper()), lambda v: every[0].message[3:9].lower() in v.message.lower()),
            (F(text="%_"), lambda v: "%_" in v.message),
            (F(request_id=1000), lambda v: v.request_id == 1000),
        ]:
            want = [v for v in every if keep(v)]
            assert r.violations_page(f, 0, None) == want and r.count_violations(f) == len(want), f
        v = every[len(every) // 2]
        k = r.violation_position(None, v.step, v.check_id)
        assert k is not None and every[k].step == v.step and every[k].check_id == v.check_id
        assert all(w.step < v.step or w.check_id != v.check_id for w in every[:k] if w.step <= v.step)
        assert r.violation_position(None, 10**6, "I1") is None


def test_step_and_span_bins_aggregate_the_summaries(v2_trace: str) -> None:
    with TraceReader(v2_trace) as r:
        rows = r.summaries()
        spans = r.spans()
        viols = r.violations()
        b = r.step_bins(0, N, 7)
        assert len(b.edges) == 8 and b.edges[0] == 0 and b.edges[-1] == N
        for k in range(7):
            inside = [s for s in rows if b.edges[k] <= s.index < b.edges[k + 1]]
            j = list(b.bin).index(k)
            assert b.steps[j] == len(inside) and b.bs_max[j] == max(s.batch_size for s in inside)
            assert b.captures[j] == sum(s.graph == GraphPhase.CAPTURE for s in inside)
            errs = sum(1 for v in viols if b.edges[k] <= v.step < b.edges[k + 1] and v.severity == Severity.ERROR)
            assert b.errors[j] == errs
            for mode in {s.mode.value for s in inside}:
                m = [s.duration_ns for s in inside if s.mode.value == mode]
                at = [i for i in range(len(b.mode_bin)) if b.mode_bin[i] == k and b.mode[i] == mode][0]
                assert (b.count[at], b.dur_min_ns[at], b.dur_max_ns[at]) == (len(m), min(m), max(m))
        sb = r.span_bins(0, N, 5)
        for k, stream, n, busy in zip(sb.bin, sb.stream, sb.count, sb.busy_ns, strict=True):
            mine = [s for s in spans if s.stream == stream and sb.edges[k] <= s.step < sb.edges[k + 1]]
            assert n == len(mine) and busy == sum(s.end_ns - s.start_ns for s in mine)


def test_accept_lengths_by_request_match_the_steps(v2_trace: str) -> None:
    with TraceReader(v2_trace) as r:
        want: dict[int, list[int]] = {}
        for st in r.steps():
            if st.mode.value == "TARGET_VERIFY":
                for q in st.requests:
                    if q.accept_length > 0:
                        want.setdefault(q.request_id, []).append(q.accept_length)
        got = r.accept_lengths_by_request()
        assert got == {k: (len(v), sum(v)) for k, v in want.items()}
