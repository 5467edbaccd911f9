"""The snapshot ring (graph replays write their metadata into device rows, drained in batches) records what the
kernels consumed: a replay's live rows hold the values an eager run of the same workload records for the same
step, also when the ring wraps many times, and the checks see a fault through it."""

from __future__ import annotations

import torch
from ring_compare import assert_replays_hold_what_eager_steps_consumed
from specscope.backend.engine_config import EngineConfig
from specscope.backend.faults import FAULTS
from specscope.backend.session import run_session
from specscope.tracer import recorder as recorder_mod
from specscope.tracer.checks import check_steps
from specscope.tracer.ring_pack import MAX_VALUES, RingPacker
from specscope.tracer.schema import GraphPhase
from specscope.tracer.stamps import row_ranges as _row_ranges
from specscope.tracer.store import TraceReader


def _record(path: str, faults: frozenset[str] = frozenset(), cuda_graph: bool = True) -> TraceReader:
    cfg = EngineConfig(model="tiny", draft="tiny-draft", device="cpu", batch_size=4, num_requests=6,
                       max_new_tokens=16, spec_steps=3, prompt_len=(16, 80), page_size=16, faults=faults,
                       cuda_graph=cuda_graph, graph_batch_sizes=(4,))  # one graph size: smaller batches pad
    run_session(cfg, path, command="test_snapshot_ring")
    return TraceReader(path)


def test_ring_recorded_replays_hold_what_an_eager_run_consumed(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(recorder_mod, "RING_BYTES", 1)  # the smallest ring (16 rows): it wraps several times
    graphs = _record(str(tmp_path / "graphs.db"))
    eager = _record(str(tmp_path / "eager.db"), cuda_graph=False)
    replays = assert_replays_hold_what_eager_steps_consumed(graphs, eager)
    # The 16-row ring went round at least three times (the count depends on the prompts, which come from the running
    # Python's own standard library).
    assert replays >= 16 * 3
    assert any(s.padded_batch_size > s.batch_size for s in graphs.steps() if s.graph == GraphPhase.REPLAY)
    assert not list(check_steps(graphs.steps(), graphs.run))


def test_a_fault_in_replayed_metadata_reaches_the_checks_through_the_ring(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(recorder_mod, "RING_BYTES", 1)
    fault = next(f for f in FAULTS if f.name == "stale-page-table")
    trace = _record(str(tmp_path / "stale.db"), frozenset({fault.name}))
    flagged = {v.check_id for v in check_steps(trace.steps(), trace.run)}
    assert fault.expected_check in flagged


def test_row_ranges_wrap() -> None:
    assert _row_ranges(0, 4, 16) == [(0, 4)]
    assert _row_ranges(14, 18, 16) == [(14, 16), (0, 2)]
    assert _row_ranges(12, 16, 16) == [(12, 16)]
    assert _row_ranges(3, 40, 16) == [(0, 16)]


def test_step_held_open_keeps_its_row_through_wraps(tmp_path) -> None:
    """A step that stays open while more replays than the ring has rows go by (its values were written into row 0,
    which later replays and drains reuse) still records its own values."""
    import torch
    from specscope.tracer.process_writer import ProcessTraceWriter
    from specscope.tracer.recorder import Recorder
    from specscope.tracer.schema import ForwardMode, GraphPhase
    from stepgen import make_run

    path = str(tmp_path / "held.db")
    rec = Recorder(ProcessTraceWriter(path, make_run()), torch.device("cpu"))
    ring = rec.open_ring(width=8, budget_bytes=1)  # 16 rows, drained every 4 replays
    layout = [("out_cache_loc", torch.int64, (4,), 0)]

    def replay(value: int, end: bool = True):  # noqa: ANN202 - a StepRecord
        r = rec.begin_step(iteration=value, mode=ForwardMode.DRAFT_DECODE, model="draft", step_id=0, batch_size=4,
                           padded_batch_size=4, graph=GraphPhase.REPLAY, tokens_per_request=1, num_draft_tokens=4,
                           page_size=16)
        rec.assign_index(r)
        ring.write(torch.full((4,), value, dtype=torch.int64))
        rec.snapshot_ring(r, 4, layout, {})
        if end:
            rec.end_step(r)
        return r

    held = replay(1000, end=False)
    for i in range(50):
        replay(i)
    rec.end_step(held)
    rec.close()
    with TraceReader(path) as r:
        assert r.num_steps() == 51
        vals = [int(s.array("out_cache_loc").values[0]) for s in r.steps()]
    assert vals == [1000, *range(50)]


def test_the_one_kernel_pack_takes_only_rows_its_single_block_is_faster_for() -> None:
    """Long contexts at large batches (bs x pages values twice) go back to the torch pack's many-block kernels."""
    small = [torch.zeros(64, dtype=torch.int32)] * 5 + [torch.zeros(256, dtype=torch.int64)] * 3
    assert RingPacker.takes(small, torch.zeros(64, dtype=torch.int64), cols=8)
    big_pages = 2 * MAX_VALUES // 64  # e.g. 32k tokens in 16-token pages at bs 64
    big = [torch.zeros(64, dtype=torch.int32)] * 3 + [torch.zeros(64 * big_pages, dtype=torch.int32)] + small[4:]
    assert not RingPacker.takes(big, torch.zeros(64, dtype=torch.int64), cols=big_pages)


def test_deferred_ring_records_keep_their_rows_however_many_wait(tmp_path) -> None:
    """Replays whose records are made later (`claim_row` at launch, `later` for the rest) still record their own
    values when more of them wait than the ring has rows: claiming drains before the device could lap one."""
    from specscope.tracer.process_writer import ProcessTraceWriter
    from specscope.tracer.recorder import LATER_MAX, Recorder
    from specscope.tracer.schema import ForwardMode, GraphPhase
    from stepgen import make_run

    path = str(tmp_path / "later.db")
    rec = Recorder(ProcessTraceWriter(path, make_run()), torch.device("cpu"))
    ring = rec.open_ring(width=8, budget_bytes=1)  # 16 rows
    assert LATER_MAX > ring.rows  # the cap on deferred calls alone would not save these rows
    layout = [("out_cache_loc", torch.int64, (4,), 0)]
    made = []
    for i in range(40):
        r = rec.begin_step(iteration=i, mode=ForwardMode.DRAFT_DECODE, model="draft", step_id=0, batch_size=4,
                           padded_batch_size=4, graph=GraphPhase.REPLAY, tokens_per_request=1, num_draft_tokens=4,
                           page_size=16)
        rec.assign_index(r)
        ring.write(torch.full((4,), i, dtype=torch.int64))
        seq = rec.claim_row()
        rec.later(lambda r=r, seq=seq: (made.append(seq), rec.snapshot_ring(r, 4, layout, {}, seq)))
        rec.end_step(r)
    assert made and made == sorted(made) and len(made) < 40  # some ran early (the half-ring guard), in order
    rec.poll(limit=None)
    assert made == list(range(40))  # a poll makes every deferred record before it resolves a step
    rec.close()
    with TraceReader(path) as r:
        assert [int(s.array("out_cache_loc").values[0]) for s in r.steps()] == list(range(40))


def test_a_graph_prepared_again_first_makes_the_record_its_last_replay_deferred(tmp_path, monkeypatch) -> None:
    """With no poll between iterations (the engine's own polls do nothing here), each deferred replay record is made
    when its graph is prepared again, before the values it reads are rewritten: the trace still holds what an eager
    run of the same workload records (seq_lens_cpu and the metadata of every replay)."""
    real_poll = recorder_mod.Recorder.poll

    def poll_only_to_close(self, force_send: bool = False, limit: int | None = 32) -> None:
        if force_send:  # flush_pending and close
            real_poll(self, force_send, limit)

    eager = _record(str(tmp_path / "eager.db"), cuda_graph=False)
    monkeypatch.setattr(recorder_mod.Recorder, "poll", poll_only_to_close)
    graphs = _record(str(tmp_path / "graphs.db"))
    assert assert_replays_hold_what_eager_steps_consumed(graphs, eager) > 40
