"""The engine on a real GPU: lossless speculative decoding, graph replay == eager, clean checks, GPU faults."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # pragma: no cover
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("flashinfer")

from specscope.backend.engine_config import EngineConfig  # noqa: E402
from specscope.backend.session import run_session  # noqa: E402
from specscope.tracer.checks import check_steps  # noqa: E402
from specscope.tracer.schema import GraphPhase, Severity  # noqa: E402
from specscope.tracer.store import TraceReader  # noqa: E402


def _run(tmp_path, name: str, **kw):
    base = dict(model="tiny", draft="tiny-draft", device="cuda", dtype="bfloat16", batch_size=4, num_requests=8,
                max_new_tokens=32, spec_steps=3, seed=0)
    base.update(kw)
    path = str(tmp_path / f"{name}.db")
    res = run_session(EngineConfig(**base), path, command=f"pytest {name}")
    return {r.request_id: r.output for r in res.requests}, path, res


def _errors(path: str) -> list:
    with TraceReader(path) as r:
        return [v for v in check_steps(r.steps()) if v.severity == Severity.ERROR]


@pytest.mark.parametrize("page", [16, 64])
def test_speculative_equals_plain_greedy_on_gpu(tmp_path, page: int) -> None:
    spec, p1, res = _run(tmp_path, "spec", page_size=page)
    plain, p2, _ = _run(tmp_path, "plain", spec_steps=0, page_size=page)
    assert res.stats.mean_accept_length > 1.2
    assert spec == plain
    assert _errors(p1) == [] and _errors(p2) == []


def test_graph_replay_equals_eager_on_gpu(tmp_path) -> None:
    graph, p, _ = _run(tmp_path, "graph", cuda_graph=True, batch_size=6, num_requests=12)
    eager, _, _ = _run(tmp_path, "eager", cuda_graph=False, batch_size=6, num_requests=12)
    assert graph == eager
    with TraceReader(p) as r:
        steps = list(r.steps())
    assert any(s.graph == GraphPhase.REPLAY and s.padded_batch_size > s.batch_size for s in steps)


def test_plan_stream_run_is_clean_and_timed(tmp_path) -> None:
    out, p, _ = _run(tmp_path, "plan", plan_stream=True)
    plain, _, _ = _run(tmp_path, "noplan", plan_stream=False)
    assert out == plain
    assert _errors(p) == []
    with TraceReader(p) as r:
        spans = [sp for s in r.steps() for sp in s.spans]
    assert any(sp.stream == "plan" for sp in spans) and all(sp.end_ns >= sp.start_ns for sp in spans)


def test_no_plan_wait_race_is_caught_on_gpu(tmp_path) -> None:
    _, p, _ = _run(tmp_path, "race", plan_stream=True, faults=frozenset({"no-plan-wait"}), num_requests=4)
    ids = {v.check_id for v in _errors(p)}
    assert "I21" in ids
