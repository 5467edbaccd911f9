"""ui/recording_notes.py: what a trace says it could not record, read from real SGLang traces' meta and run config."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from specscope.tracer.store import TraceReader
from specscope.ui.recording_notes import RecordingNotes, recording_notes, replay_without_metadata

ROOT = Path(__file__).resolve().parents[2]
DRIVE = ROOT / "tests" / "data" / "sglang-0.5.23-drive.db"  # SGLang 0.5.23's own backend, CPU (sglang_drive)
SGLANG = ROOT / ".sglang" / "0.5.23"


def _notes(path: Path) -> RecordingNotes:
    with TraceReader(path) as r:
        return recording_notes(r.meta(), r.run.config)


def test_a_recorded_sglang_0523_run_says_what_its_backend_does_not_give() -> None:
    n = _notes(DRIVE)
    assert n and n.is_absent("max_seq_len_k") and not n.is_absent("max_seq_len_q")
    assert n.replay_metadata == "computed inside the graph (SGLang 0.5.15+)"
    assert n.replay_reason() == "computed inside the graph"
    assert n.problems == () and n.untested is None and n.unmodelled == ()
    assert n.parts() == ["absent: max_seq_len_k", "replay metadata not recorded"]
    text = "\n".join(n.lines())
    assert "max_seq_len_k absent in this backend: TRTLLMMHAMetadata has no max_seq_len_k" in text
    assert "graph replays' metadata not recorded: computed inside the graph (SGLang 0.5.15+)" in text


def test_a_trace_of_the_engine_has_nothing_to_say() -> None:
    n = _notes(ROOT / "samples" / "traces" / "cpu-default.db")
    assert not n and n.parts() == [] and n.headline() == "" and n.lines() == []


def test_problems_untested_release_and_late_features() -> None:
    with TraceReader(DRIVE) as r:
        config = dict(r.run.config)
        meta = r.meta()
    config["sglang"] = dict(config["sglang"], tested=False, untested="untested SGLang 0.5.24",
                            unmodelled=[{"feature": "ragged verify", "detail": "bs x T tokens", "source": "init"}])
    meta = dict(meta, recording_problems=json.dumps([
        {"what": "prep: page table", "first_step": 7, "count": 3, "detail": "IndexError: out of range"},
        {"what": "provenance: kernel versions", "first_step": None, "count": 1, "detail": "no flashinfer"}]),
        unmodelled_features=json.dumps([{"feature": "ragged verify", "detail": "bs x T tokens", "source": "init"},
                                        {"feature": "swa", "detail": "window 4096", "source": "step 12"}]))
    n = recording_notes(meta, config)
    assert [p.count for p in n.problems] == [3, 1] and n.problems[0].first_step == 7
    assert n.problems[1].first_step is None
    assert n.untested == "untested SGLang 0.5.24"
    assert [f.feature for f in n.unmodelled] == ["ragged verify", "swa"]  # the run info's, then the late one
    assert n.parts()[:3] == ["4 recording problems (2 kinds)", "untested SGLang 0.5.24",
                             "unmodelled: ragged verify, swa"]
    lines = n.lines()
    assert lines[0] == "recording problem  prep: page table: 3x, first at step 7: IndexError: out of range"
    assert "untested SGLang 0.5.24: specscope recorded what it could" in lines[2]
    # The one-line notice fits the width it is given and always says where the full text is.
    for w in (40, 60, 80, 120, 200):
        h = n.headline(w)
        assert len(h) <= w and h.endswith("? details"), (w, h)
    assert "+" in n.headline(80) and "more" in n.headline(80)
    assert "+" not in n.headline(400)


def test_an_unreadable_meta_row_is_said_not_dropped() -> None:
    n = recording_notes({"recording_problems": "not json {"}, {"source": "sglang"})
    assert n.unreadable == (("recording_problems", "not json {"),) and n.no_provenance
    assert n.parts() == ["unreadable: recording_problems", "no provenance"]


def test_which_steps_are_replays_without_metadata() -> None:
    n = _notes(DRIVE)
    with TraceReader(DRIVE) as r:
        steps = list(r.steps())
    flags = {s.index: replay_without_metadata(n, s.graph.value, [a.name for a in s.arrays], list(s.scalars))
             for s in steps}
    assert {s.index for s in steps if s.graph.value == "replay"} == {i for i, f in flags.items() if f}
    assert any(s.graph.value == "replay" and s.scalars for s in steps)  # a verify replay keeps its acceptance
    assert not replay_without_metadata(RecordingNotes(), "replay", [], [])


@pytest.mark.skipif(not (SGLANG / "sglang").is_dir(), reason="SGLang 0.5.23 not unpacked under .sglang/ "
                    "(bash .ci/sglang-installs.sh)")
def test_the_committed_drive_trace_says_what_a_fresh_recording_says(tmp_path) -> None:
    """tests/data's trace is what `sglang_drive` records today (re-record: PYTHONPATH=.sglang/0.5.23
    python -m specscope.integrations.sglang_drive -o tests/data/sglang-0.5.23-drive.db)."""
    out = tmp_path / "x.db"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SGLANG), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, "-m", "specscope.integrations.sglang_drive", "-o", str(out)], env=env,
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    fresh, kept = _notes(out), _notes(DRIVE)
    assert fresh.parts() == kept.parts() and fresh.absent_fields == kept.absent_fields
    assert fresh.replay_metadata == kept.replay_metadata
