"""The measurement-only recorders behind `tracer_overhead.py --ab-ablate` (benchmarks/recorder_ablation.py) leave
out exactly what they say, on a real traced CPU run: `floor` keeps the captures (so the graphs carry the recorder's
nodes) and records no later step; `eager-spans` keeps every step and its graph-stamped spans, and no eager span."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import recorder_ablation  # noqa: E402
import specscope.backend.session as session  # noqa: E402
from specscope.backend.engine_config import EngineConfig  # noqa: E402
from specscope.tracer.schema import GraphPhase  # noqa: E402
from specscope.tracer.store import TraceReader  # noqa: E402

CFG = dict(model="tiny", draft="tiny-draft", device="cpu", dtype="float32", batch_size=2, num_requests=2,
           max_new_tokens=12, spec_steps=3, seed=0, prompt_len=(16, 32), cuda_graph=True, plan_stream=True)


def _record(tmp_path: Path, level: str | None) -> tuple[list, dict[int, list[str]]]:
    path = str(tmp_path / f"{level}.db")
    extra = {"recorder": recorder_ablation.recorder_class(level)} if level else {}
    res = session.run_session(EngineConfig(**CFG), path, command="pytest ablation", check=False, **extra)
    with TraceReader(path) as r:
        steps = list(r.steps())
    return steps, {r.request_id: r.output for r in res.requests}


def test_floor_records_the_captures_and_nothing_after(tmp_path: Path) -> None:
    full, out_full = _record(tmp_path, None)
    floor, out_floor = _record(tmp_path, "floor")
    captures = [s for s in full if s.graph == GraphPhase.CAPTURE]
    assert captures and len(full) > len(captures)
    assert [s.graph for s in floor] == [GraphPhase.CAPTURE] * len(captures)
    assert out_floor == out_full  # the same run: only its recording differs


def test_eager_spans_keeps_every_step_and_only_graph_stamped_spans(tmp_path: Path) -> None:
    full, out_full = _record(tmp_path, None)
    ablated, out_ablated = _record(tmp_path, "eager-spans")
    assert len(ablated) == len(full) and out_ablated == out_full
    names = {sp.name for s in full for sp in s.spans}
    assert {"producers", "metadata", "forward"} <= names
    for s in ablated:
        spans = [(sp.stream, sp.name) for sp in s.spans]
        # a replay's forward is stamped by its graph; nothing else is left
        assert spans == ([("compute", "forward")] if s.graph == GraphPhase.REPLAY else []), (s.index, spans)
