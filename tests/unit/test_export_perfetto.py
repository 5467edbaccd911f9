"""Perfetto export: well-formed Chrome Trace Event JSON on every sample trace, and one small export event by event."""

from __future__ import annotations

import glob
import gzip
import json
import os
import re
from collections import Counter
from pathlib import Path

import pytest
from specscope.tracer.export.perfetto import build_events, write_perfetto
from specscope.tracer.schema import (
    ForwardMode,
    GraphPhase,
    RequestState,
    RunInfo,
    Severity,
    Step,
    StreamSpan,
    StreamWait,
    Violation,
)
from specscope.tracer.store import TraceReader, TraceWriter
from specscope.ui.cli import main

REPO = Path(__file__).resolve().parents[2]
SAMPLES = sorted(glob.glob(str(REPO / "samples" / "traces" / "*.db")) + glob.glob(str(REPO / "tests/data/v1/*.db")))
REQUIRED = {"X": {"name", "ph", "ts", "dur", "pid", "tid"}, "M": {"name", "ph", "pid", "args"},
            "C": {"name", "ph", "ts", "pid", "args"}, "i": {"name", "ph", "ts", "pid", "tid", "s"},
            "s": {"name", "ph", "ts", "pid", "tid", "id", "cat"},
            "f": {"name", "ph", "ts", "pid", "tid", "id", "cat", "bp"}}


def ns(ts: float) -> int:
    """The exporter writes ns / 1000; rounding recovers the integer ns."""
    return round(ts * 1000)


def assert_well_formed(events: list[dict]) -> None:
    """Required fields per phase, monotonic timestamps, no overlapping complete slices per track, paired flows."""
    assert events, "no events"
    last = None
    for e in events:
        assert e["ph"] in REQUIRED, e
        missing = REQUIRED[e["ph"]] - set(e)
        assert not missing, (missing, e)
        if e["ph"] == "M":
            continue
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
        if last is not None:
            assert e["ts"] >= last, ("timestamps go backwards", e)
        last = e["ts"]
        if e["ph"] == "X":
            assert e["dur"] >= 0
        if e["ph"] == "C":
            assert all(isinstance(v, (int, float)) for v in e["args"].values()), e
    tracks: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for e in events:
        if e["ph"] == "X":
            tracks.setdefault((e["pid"], e["tid"]), []).append((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])))
    for key, spans in tracks.items():
        spans.sort()
        for (a0, a1), (b0, b1) in zip(spans, spans[1:], strict=False):
            assert a1 <= b0, (f"overlapping slices on track {key}", (a0, a1), (b0, b1))
    flows = Counter((e["id"], e["ph"]) for e in events if e["ph"] in "sf")
    ids = {i for i, _ in flows}
    for i in ids:
        assert flows[(i, "s")] == 1 and flows[(i, "f")] == 1, f"flow {i} lacks an end"
    # Each flow end lies inside a complete slice on its own track (what Perfetto binds it to).
    for e in events:
        if e["ph"] in "sf":
            t = ns(e["ts"])
            assert any(a <= t <= b for a, b in tracks.get((e["pid"], e["tid"]), [])), ("unbound flow end", e)
    named = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert set(tracks) <= named, "a track without a name"


@pytest.mark.parametrize("path", SAMPLES, ids=os.path.basename)
def test_sample_exports_are_well_formed(path: str) -> None:
    with TraceReader(path) as r:
        events = build_events(r)
        n_steps = r.num_steps()
    assert_well_formed(events)
    steps = {e["args"]["step"] for e in events if e["ph"] == "X" and "step" in e["args"]}
    assert len(steps) <= n_steps


def _engine_nvtx_patterns() -> list[re.Pattern[str]]:
    src = (REPO / "backend" / "engine.py").read_text()
    lits = re.findall(r'nvtx\(f?"([^"]+)"', src)
    assert lits, "no nvtx( ranges found in backend/engine.py"
    pats = []
    for lit in lits:
        parts = re.split(r"\{[^}]+\}", lit)
        pats.append(re.compile("^" + ".+".join(re.escape(p) for p in parts) + "$"))
    return pats


def test_step_track_names_are_the_engines_nvtx_ranges() -> None:
    pats = _engine_nvtx_patterns()
    path = str(REPO / "samples" / "traces" / "h200-plan-stream.db")
    with TraceReader(path) as r:
        events = build_events(r)
    names = {e["name"] for e in events if e["ph"] == "X" and e["cat"] in ("steps", "iterations")}
    assert names
    for n in names:
        assert any(p.match(n) for p in pats), f"{n!r} is not an NVTX range name of backend/engine.py"
    assert "verify" in names and "plan: verify metadata" in names


def _golden_trace(path: str) -> None:
    run = RunInfo("specscope run --golden", {"faults": []}, "tiny", "tiny-draft", "cpu", None, "reference",
                  {"python": "3.11"}, None, 0)
    base = 1_000_000
    reqs = (RequestState(7, 0, 10, 12, 2, (5,), (5, 6), 2),)
    verify = Step(index=0, iteration=3, mode=ForwardMode.TARGET_VERIFY, model="target", step_id=None,
                  batch_size=1, padded_batch_size=2, graph=GraphPhase.REPLAY, tokens_per_request=2,
                  num_draft_tokens=2, page_size=16, start_ns=base, end_ns=base + 5000,
                  scalars={"max_seq_len_q": 2}, requests=reqs,
                  spans=(StreamSpan("plan", "metadata", base + 100, base + 1100),
                         StreamSpan("compute", "forward", base + 1500, base + 4500),
                         StreamSpan("host", "accept", base + 4500, base + 4900),
                         StreamSpan("host", "overlapping", base + 4600, base + 4800)),
                  waits=(StreamWait("compute", "plan", "metadata"),),
                  violations=(Violation("I6", Severity.ERROR, 0, "step 0: kernel q_len 4 but T 2", 7),))
    with TraceWriter(path, run) as w:
        w.write_step(verify)


GOLDEN = [
    {"ph": "M", "pid": 1, "tid": 0, "name": "process_name", "args": {"name": "target model"}},
    {"ph": "M", "pid": 1, "tid": 0, "name": "process_sort_index", "args": {"sort_index": 1}},
    {"ph": "M", "pid": 1, "tid": 90, "name": "thread_name", "args": {"name": "violations"}},
    {"ph": "M", "pid": 1, "tid": 90, "name": "thread_sort_index", "args": {"sort_index": 90}},
    {"ph": "M", "pid": 1, "tid": 10, "name": "thread_name", "args": {"name": "plan"}},
    {"ph": "M", "pid": 1, "tid": 10, "name": "thread_sort_index", "args": {"sort_index": 10}},
    {"ph": "M", "pid": 1, "tid": 2, "name": "thread_name", "args": {"name": "steps"}},
    {"ph": "M", "pid": 1, "tid": 2, "name": "thread_sort_index", "args": {"sort_index": 2}},
    {"ph": "M", "pid": 1, "tid": 20, "name": "thread_name", "args": {"name": "compute"}},
    {"ph": "M", "pid": 1, "tid": 20, "name": "thread_sort_index", "args": {"sort_index": 20}},
    {"ph": "M", "pid": 1, "tid": 30, "name": "thread_name", "args": {"name": "host"}},
    {"ph": "M", "pid": 1, "tid": 30, "name": "thread_sort_index", "args": {"sort_index": 30}},
    # The two host spans overlap: the second goes to a sub-track.
    {"ph": "M", "pid": 1, "tid": 130, "name": "thread_name", "args": {"name": "host #2"}},
    {"ph": "M", "pid": 1, "tid": 130, "name": "thread_sort_index", "args": {"sort_index": 130}},
    {"ph": "M", "pid": 1, "tid": 1, "name": "thread_name", "args": {"name": "iterations"}},
    {"ph": "M", "pid": 1, "tid": 1, "name": "thread_sort_index", "args": {"sort_index": 1}},
    ("X", 1, 1, 1000.0, 5.0, "iteration 3"),
    ("C", 1000.0, "batch size", {"bs": 1, "padded_bs": 2}),
    ("i", 1000.0, "I6 error", "step 0: kernel q_len 4 but T 2"),
    ("X", 1, 10, 1000.1, 1.0, "metadata"),
    ("X", 1, 2, 1000.1, 1.0, "plan: verify metadata"),
    ("s", 1, 10, 1000.1),
    ("X", 1, 20, 1001.5, 3.0, "forward"),
    ("X", 1, 2, 1001.5, 3.0, "verify"),
    ("f", 1, 20, 1001.5),
    ("X", 1, 30, 1004.5, 0.4, "accept"),
    ("X", 1, 130, 1004.6, 0.2, "overlapping"),
    ("C", 1005.0, "accept length", {"mean": 2.0}),
]


def test_golden_export_event_by_event(tmp_path: Path) -> None:
    db = str(tmp_path / "g.db")
    _golden_trace(db)
    with TraceReader(db) as r:
        events = build_events(r)
    assert_well_formed(events)
    assert len(events) == len(GOLDEN), [(e["ph"], e.get("name")) for e in events]
    for got, want in zip(events, GOLDEN, strict=True):
        if isinstance(want, dict):
            assert got == want
        elif want[0] == "X":
            _, pid, tid, ts, dur, name = want
            assert (got["ph"], got["pid"], got["tid"], got["ts"], got["dur"], got["name"]) == want
            assert name == "iteration 3" or (got["args"]["mode"] == "TARGET_VERIFY" and got["args"]["padded_bs"] == 2)
        elif want[0] == "C":
            assert (got["ph"], got["ts"], got["name"], got["args"]) == want
        elif want[0] == "i":
            assert (got["ph"], got["ts"], got["name"], got["args"]["message"]) == want
            assert got["s"] == "t"
        else:
            assert (got["ph"], got["pid"], got["tid"], got["ts"]) == want
    verify = next(e for e in events if e["name"] == "verify")
    assert verify["args"]["accept_lengths"] == [2] and verify["args"]["kernel"] == "reference"
    assert verify["args"]["T"] == 2 and verify["args"]["K"] == 2 and verify["args"]["bs"] == 1


def test_cli_writes_gzip_and_steps_range(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = str(REPO / "samples" / "traces" / "cpu-default.db")
    out = str(tmp_path / "t.json.gz")
    assert main(["export", src, "--perfetto", out, "--steps", "10:20"]) == 0
    assert "ui.perfetto.dev" in capsys.readouterr().out
    with gzip.open(out) as f:
        doc = json.load(f)
    assert_well_formed(doc["traceEvents"])
    steps = {e["args"]["step"] for e in doc["traceEvents"] if e["ph"] == "X" and "step" in e["args"]}
    assert steps and min(steps) >= 10 and max(steps) < 20
    assert doc["metadata"]["command"].startswith("specscope run")
    with TraceReader(src) as r:
        n = write_perfetto(r, str(tmp_path / "all.json"))
    assert n == len(json.load(open(tmp_path / "all.json"))["traceEvents"])


def test_trace_processor_reads_the_slices_back(tmp_path: Path) -> None:
    tp_mod = pytest.importorskip("perfetto.trace_processor", reason="the perfetto package is not installed")
    src = str(REPO / "samples" / "traces" / "h200-plan-stream.db")
    out = str(tmp_path / "t.json")
    with TraceReader(src) as r:
        write_perfetto(r, out)
    try:
        tp = tp_mod.TraceProcessor(trace=out)
    except Exception as e:  # noqa: BLE001 - it downloads trace_processor_shell at first use: no network here
        pytest.skip(f"perfetto TraceProcessor cannot start here ({type(e).__name__}: {str(e)[:120]})")
    try:
        rows = list(tp.query("select name, count(*) as n from slice group by name"))
    finally:
        tp.close()
    names = {row.name for row in rows}
    assert "verify" in names and "plan: verify metadata" in names


def test_recorded_waits_become_flows(tmp_path_factory: pytest.TempPathFactory) -> None:
    from test_export_common import recorded

    path = recorded(tmp_path_factory, "clean", [])  # recorded with --plan-stream
    with TraceReader(path) as r:
        events = build_events(r)
        waits = []
        for s in r.iter_summaries():
            st = r.step(s.index, arrays=())
            spans = {(x.stream, x.name) for x in st.spans}
            waits += [w for w in st.waits if (w.on_stream, w.on_span) in spans]
    assert_well_formed(events)
    assert waits, "the plan-stream run recorded no wait edges"
    starts = [e for e in events if e["ph"] == "s"]
    assert len(starts) == len(waits)
    # plan waited on the compute producers; compute waited on the plan metadata: flows go both ways.
    tids = {(e["tid"] % 100) for e in starts}
    assert tids == {10, 20}


def test_a_span_of_several_steps_is_one_slice_naming_them(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The draft loop's metadata span belongs to every draft step of the iteration: one slice, not one per step on
    sub-tracks."""
    from test_export_common import recorded

    path = recorded(tmp_path_factory, "draft-loop", ["--verify-tokens", "4"])  # T = 4: two draft decode steps
    with TraceReader(path) as r:
        events = build_events(r)
        drafts = [r.step(s.index, arrays=()) for s in r.iter_summaries() if s.mode == ForwardMode.DRAFT_DECODE.value
                  and s.iteration >= 0]
    assert_well_formed(events)
    shared = [e for e in events if e["ph"] == "X" and e["name"] == "metadata" and "steps" in e["args"]]
    by_iteration: dict[int, list[int]] = {}
    for s in drafts:
        by_iteration.setdefault(s.iteration, []).append(s.index)
    assert len(by_iteration) >= 2 and all(len(v) == 2 for v in by_iteration.values())
    assert sorted(sorted(e["args"]["steps"]) for e in shared) == sorted(sorted(v) for v in by_iteration.values())
    tracks = {e["tid"] for e in events if e["ph"] == "X" and e["name"] == "metadata"
              and e["args"].get("mode") == ForwardMode.DRAFT_DECODE.value}
    assert len(tracks) == 1, "one span of several steps needs no sub-track"
