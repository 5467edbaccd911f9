"""The snapshot ring (graph replays write their metadata into device rows, drained in batches) records exactly what
the per-step host copies record: same steps, same values, same violations; also when the ring wraps many times."""

from __future__ import annotations

import numpy as np
import pytest
from specscope.backend.engine_config import EngineConfig
from specscope.backend.session import run_session
from specscope.tracer import recorder as recorder_mod
from specscope.tracer.checks import check_steps
from specscope.tracer.recorder import _row_ranges
from specscope.tracer.store import TraceReader


def _record(path: str, ring: bool, faults: frozenset[str], monkeypatch: pytest.MonkeyPatch) -> TraceReader:
    monkeypatch.setenv("SPECSCOPE_SNAPSHOT_RING", "1" if ring else "0")
    cfg = EngineConfig(model="tiny", draft="tiny-draft", device="cpu", batch_size=4, num_requests=6,
                       max_new_tokens=16, spec_steps=3, prompt_len=(16, 80), page_size=16, faults=faults)
    run_session(cfg, path, command="test_snapshot_ring")
    return TraceReader(path)


@pytest.mark.parametrize("faults", [frozenset(), frozenset({"stale-page-table"})], ids=["clean", "stale-page-table"])
def test_ring_records_what_host_copies_record(tmp_path, monkeypatch, faults) -> None:
    monkeypatch.setattr(recorder_mod, "RING_BYTES", 1)  # the smallest ring (16 rows): it wraps several times
    a = _record(str(tmp_path / "ring.db"), True, faults, monkeypatch)
    b = _record(str(tmp_path / "host.db"), False, faults, monkeypatch)
    assert a.num_steps() == b.num_steps() > 60
    replays = 0
    for sa, sb in zip(a.steps(), b.steps(), strict=True):
        replays += sa.graph.value == "replay"
        for k in ("index", "iteration", "mode", "model", "step_id", "batch_size", "padded_batch_size", "graph",
                  "tokens_per_request", "scalars", "requests", "waits", "errors", "faults_fired"):
            assert getattr(sa, k) == getattr(sb, k), (sa.index, k)
        assert [(x.stream, x.name) for x in sa.spans] == [(x.stream, x.name) for x in sb.spans]
        assert [x.name for x in sa.arrays] == [x.name for x in sb.arrays], sa.index
        for x, y in zip(sa.arrays, sb.arrays, strict=True):
            assert (x.dtype, x.shape) == (y.dtype, y.shape), (sa.index, x.name)
            assert np.array_equal(x.values, y.values), (sa.index, x.name)
    assert replays > 16 * 3  # the 16-row ring wrapped
    ids = lambda r: sorted({(v.check_id, v.step) for v in check_steps(r.steps(), r.run)})  # noqa: E731
    assert ids(a) == ids(b)
    assert bool(ids(a)) == bool(faults)


def test_row_ranges_wrap() -> None:
    assert _row_ranges(0, 4, 16) == [(0, 4)]
    assert _row_ranges(14, 18, 16) == [(14, 16), (0, 2)]
    assert _row_ranges(12, 16, 16) == [(12, 16)]
    assert _row_ranges(3, 40, 16) == [(0, 16)]
