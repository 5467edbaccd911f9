"""Comparing a graph run's trace with an eager run's of the same workload: what a replay's snapshot-ring row recorded
for its live rows against what the eager step recorded through its host copy (tests/unit/test_snapshot_ring.py,
tests/gpu/test_engine_gpu.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
from specscope.tracer.schema import GraphPhase
from specscope.tracer.store import TraceReader

ROW_ARRAYS = ("cache_seqlens", "seq_lens", "req_pool_indices", "seq_lens_cpu")  # one value per batch row
TOKEN_ARRAYS = ("out_cache_loc", "positions")  # one per query token
PAGE_ARRAYS = ("page_table", "req_to_token_page_starts")  # batch rows x pages (a replay's are wider)
CUMULATIVE = ("cu_seqlens_q", "cu_seqlens_k")  # batch rows + 1


def _live(step: Any, name: str, other: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`name`'s values in `step` and in `other` (the eager step's), cut to the rows both hold: a replay pads its
    batch and its page-table columns past what the live requests use."""
    mine, bs = step.array(name).values, step.batch_size
    if name in PAGE_ARRAYS:
        w = min(mine.shape[1], other.shape[1])
        return mine[:bs, :w], other[:bs, :w]
    if name in CUMULATIVE:
        return mine[:bs + 1], other[:bs + 1]
    if name in TOKEN_ARRAYS:
        return mine[:len(other)], other
    assert name in ROW_ARRAYS, name
    return mine[:bs], other[:bs]


def assert_replays_hold_what_eager_steps_consumed(graphs: TraceReader, eager: TraceReader) -> int:
    """Step for step (captures aside), the graph run's records equal the eager run's on every live row; returns
    the number of replays compared."""
    ran = [s for s in graphs.steps() if s.graph != GraphPhase.CAPTURE]
    ref = list(eager.steps())
    assert len(ran) == len(ref)
    replays = 0
    for s, e in zip(ran, ref, strict=True):
        assert (s.iteration, s.mode, s.model, s.step_id, s.batch_size) == \
            (e.iteration, e.mode, e.model, e.step_id, e.batch_size), s.index
        assert s.requests == e.requests, s.index
        assert sorted(a.name for a in s.arrays) == sorted(a.name for a in e.arrays), s.index
        for a in e.arrays:
            got, want = _live(s, a.name, a.values)
            assert np.array_equal(got, want), (s.index, s.graph, a.name, got, want)
        replays += s.graph == GraphPhase.REPLAY
    return replays
