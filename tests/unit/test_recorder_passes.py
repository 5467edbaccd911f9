"""The recorder resolves and sends steps in passes: every RESOLVE_BATCH ended steps, when the oldest pending step is
20 ms old, or at a flush; never loses or reorders a step."""

from __future__ import annotations

import pytest
import torch
from specscope.tracer import recorder as recorder_mod
from specscope.tracer.process_writer import ProcessTraceWriter
from specscope.tracer.recorder import RESOLVE_BATCH, Recorder
from specscope.tracer.schema import ForwardMode, GraphPhase
from specscope.tracer.store import TraceReader
from stepgen import make_run


def _step(rec: Recorder, i: int) -> None:
    r = rec.begin_step(iteration=i, mode=ForwardMode.DECODE, model="target", step_id=None, batch_size=1,
                       padded_batch_size=1, graph=GraphPhase.EAGER, tokens_per_request=1, num_draft_tokens=0,
                       page_size=16)
    rec.end_step(r)


def _written(rec: Recorder, path: str) -> int:
    rec.writer.flush()  # the writer's own flush: what the recorder sent so far is committed, nothing more
    with TraceReader(path) as r:
        return r.num_steps()


def test_steps_wait_for_a_pass_of_the_batch_size(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recorder_mod, "QUIET_NS", 10**12)  # no step counts as old until the test says so
    path = str(tmp_path / "passes.db")
    rec = Recorder(ProcessTraceWriter(path, make_run()), torch.device("cpu"))
    for i in range(RESOLVE_BATCH - 1):
        _step(rec, i)
        rec.poll()
    assert _written(rec, path) == 0  # a pass not due yet: nothing resolved or sent
    _step(rec, RESOLVE_BATCH - 1)
    rec.poll()
    assert _written(rec, path) == RESOLVE_BATCH  # the pass: every completed step, as one message
    _step(rec, RESOLVE_BATCH)
    rec.poll()
    assert _written(rec, path) == RESOLVE_BATCH
    monkeypatch.setattr(recorder_mod, "QUIET_NS", 0)  # the pending step is now "old": a quiet run does not hold it
    rec.poll()
    assert _written(rec, path) == RESOLVE_BATCH + 1
    _step(rec, RESOLVE_BATCH + 1)
    rec.flush_pending()  # a live viewer's pause writes at once
    assert _written(rec, path) == RESOLVE_BATCH + 2
    rec.close()
    with TraceReader(path) as r:
        assert [s.index for s in r.steps()] == list(range(RESOLVE_BATCH + 2))


def test_a_full_pinned_ring_writes_a_step_ended_since_the_last_poll(tmp_path) -> None:
    """When the pinned ring needs the slots of the oldest step (`_drain_oldest`), a step ended but not yet queued
    (end_step queues at the next poll) is that step: it is written, not missed."""
    path = str(tmp_path / "full.db")
    rec = Recorder(ProcessTraceWriter(path, make_run()), torch.device("cpu"))
    _step(rec, 0)  # ended, no poll since
    rec._drain_oldest()  # what PinnedRing.take calls when the slot it needs is still held
    rec.close()
    with TraceReader(path) as r:
        assert [s.index for s in r.steps()] == [0]
