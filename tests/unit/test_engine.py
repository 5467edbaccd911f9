"""The engine on the CPU: lossless speculative decoding, graph replay == eager, every recorded step consistent."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from specscope.backend.config_error import ConfigError  # noqa: E402
from specscope.backend.engine_config import EngineConfig  # noqa: E402
from specscope.backend.session import run_session  # noqa: E402
from specscope.tracer.checks import check_steps  # noqa: E402
from specscope.tracer.schema import ForwardMode, GraphPhase  # noqa: E402
from specscope.tracer.store import TraceReader  # noqa: E402


def run(tmp_path, name: str, **kw):
    """Run the embedded models on the CPU; returns ({request id: output tokens}, trace path, result)."""
    cfg = dict(model="tiny", draft="tiny-draft", device="cpu", dtype="float32", batch_size=4, num_requests=6,
               max_new_tokens=24, spec_steps=3, seed=0, prompt_len=(16, 96))
    cfg.update(kw)
    path = str(tmp_path / f"{name}.db")
    res = run_session(EngineConfig(**cfg), path, command=f"pytest {name}")
    return {r.request_id: r.output for r in res.requests}, path, res


def steps_of(path: str) -> list:
    with TraceReader(path) as r:
        return list(r.steps())


@pytest.mark.parametrize("seed,bs,n,page", [(0, 1, 1, 16), (1, 3, 3, 64), (2, 4, 5, 128), (3, 2, 2, 32),
                                            (4, 4, 4, 16)])
def test_speculative_greedy_equals_plain_greedy(tmp_path, seed: int, bs: int, n: int, page: int) -> None:
    spec, p_spec, res = run(tmp_path, "spec", seed=seed, batch_size=bs, spec_steps=n, page_size=page)
    plain, p_plain, _ = run(tmp_path, "plain", seed=seed, batch_size=bs, spec_steps=0, page_size=page)
    assert spec == plain
    assert all(len(v) >= 1 for v in spec.values())
    assert res.stats.mean_accept_length > 1.0
    assert list(check_steps(steps_of(p_spec))) == []
    assert list(check_steps(steps_of(p_plain))) == []


def test_graph_replay_equals_eager_and_pads(tmp_path) -> None:
    graph, p, _ = run(tmp_path, "graph", batch_size=6, num_requests=10, cuda_graph=True, plan_stream=True)
    eager, pe, _ = run(tmp_path, "eager", batch_size=6, num_requests=10, cuda_graph=False)
    assert graph == eager
    steps = steps_of(p)
    assert any(s.graph == GraphPhase.CAPTURE for s in steps)
    padded = [s for s in steps if s.graph == GraphPhase.REPLAY and s.padded_batch_size > s.batch_size]
    assert padded, "changing batch sizes should replay padded graphs"
    assert len({s.batch_size for s in steps if s.iteration >= 0}) > 2
    assert all(s.graph == GraphPhase.EAGER for s in steps_of(pe))


def test_recorded_steps_satisfy_the_formulas(tmp_path) -> None:
    """cache_seqlens = per-mode formula, cu_seqlens_k = prefix sum, page-table rows = req_to_token slices."""
    _, p, _ = run(tmp_path, "formulas", batch_size=3, num_requests=5, page_size=16)
    steps = steps_of(p)
    modes = {s.mode for s in steps}
    assert modes == {ForwardMode.EXTEND, ForwardMode.DRAFT_DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND}
    checked = 0
    for s in steps:
        cs = s.array("cache_seqlens").values
        cuk = s.array("cu_seqlens_k").values
        assert cuk[0] == 0 and (cuk[1:] == cs.cumsum()).all()
        for b, r in enumerate(s.requests):
            if s.mode == ForwardMode.EXTEND:
                want = r.seq_len_after
            elif s.mode == ForwardMode.DRAFT_DECODE:
                want = r.seq_len_before + s.step_id + 1
            else:  # TARGET_VERIFY and DRAFT_EXTEND: S + T
                want = r.seq_len_before + s.tokens_per_request
            assert cs[b] == want
            n = -(-int(cs[b]) // s.page_size)
            pt, starts = s.array("page_table").values, s.array("req_to_token_page_starts").values
            assert (pt[b, :n] == starts[b, :n] // s.page_size).all()
            checked += 1
    assert checked > 50


def test_verify_rows_record_drafts_and_acceptance(tmp_path) -> None:
    out, p, res = run(tmp_path, "accept")
    verify = [s for s in steps_of(p) if s.mode == ForwardMode.TARGET_VERIFY]
    rows = [r for s in verify for r in s.requests]
    assert rows and all(len(r.draft_tokens) == 3 and 1 <= r.accept_length <= 4 for r in rows)
    assert all(r.seq_len_after == r.seq_len_before + r.accept_length for r in rows)
    mean = sum(r.accept_length for r in rows) / len(rows)
    assert mean == pytest.approx(res.stats.mean_accept_length)


def test_rejection_sampling_runs_and_is_reproducible(tmp_path) -> None:
    a, p, res = run(tmp_path, "rs1", temperature=0.8, num_requests=3)
    b, _, _ = run(tmp_path, "rs2", temperature=0.8, num_requests=3)
    assert a == b
    assert list(check_steps(steps_of(p))) == []


def test_bad_configurations_are_one_sentence_errors() -> None:
    with pytest.raises(ConfigError, match="page-size"):
        EngineConfig(page_size=48).validate()
    with pytest.raises(ConfigError, match="only bites"):
        EngineConfig(faults=frozenset({"no-plan-wait"})).validate()
    with pytest.raises(ConfigError, match="verify-tokens"):
        EngineConfig(verify_tokens=40).validate()


@pytest.mark.parametrize("every", [1, 3])
def test_record_attention_samples_every_nth_step(tmp_path, every: int) -> None:
    """--record-attention N keeps layer 0's attention on exactly the forwards whose step index is a multiple of N."""
    _, p, _ = run(tmp_path, f"attn{every}", num_requests=3, max_new_tokens=8, record_attention=every)
    steps = steps_of(p)
    sampled = {s.index for s in steps if s.array("attn_q") is not None}
    forwards = {s.index for s in steps if s.graph != GraphPhase.CAPTURE}
    assert sampled == {i for i in forwards if i % every == 0}
    assert len(sampled) >= 5
    assert list(check_steps(steps)) == []  # D1 / D2 agree on every sampled step


@pytest.mark.parametrize("graphs", [True, False])
def test_the_draft_loop_plans_every_step_first_and_verify_after_it(tmp_path, graphs: bool) -> None:
    """As SGLang's draft runner: every draft step's metadata in one compute span before the first draft forward, the
    forwards in step order after it, and the verify metadata planned once the last draft forward is launched."""
    _, p, _ = run(tmp_path, "loop", batch_size=3, num_requests=4, max_new_tokens=12, spec_steps=3,
                  cuda_graph=graphs, plan_stream=True)
    steps = [s for s in steps_of(p) if s.iteration >= 0]
    iterations = sorted({s.iteration for s in steps if s.mode == ForwardMode.DRAFT_DECODE})
    assert len(iterations) >= 3
    for it in iterations:
        drafts = sorted((s for s in steps if s.iteration == it and s.mode == ForwardMode.DRAFT_DECODE),
                        key=lambda s: s.step_id)
        assert [s.step_id for s in drafts] == list(range(len(drafts))) and len(drafts) >= 2
        span = {s.step_id: {(sp.stream, sp.name): sp for sp in s.spans} for s in drafts}
        metas = {(span[i][("compute", "metadata")].start_ns, span[i][("compute", "metadata")].end_ns) for i in span}
        assert len(metas) == 1, "the draft steps' metadata is one span of them all"
        (_, meta_end), = metas
        fwd = [span[i][("compute", "forward")] for i in range(len(drafts))]
        assert meta_end <= fwd[0].start_ns
        assert all(a.end_ns <= b.start_ns for a, b in zip(fwd, fwd[1:], strict=False))
        assert [s.index for s in drafts] == sorted(s.index for s in drafts)  # numbered in launch order
        verify, = (s for s in steps if s.iteration == it and s.mode == ForwardMode.TARGET_VERIFY)
        plan_meta, = (sp for sp in verify.spans if (sp.stream, sp.name) == ("plan", "metadata"))
        assert plan_meta.start_ns >= fwd[-1].start_ns  # CPU stamps are host times: launched after the last draft
    assert list(check_steps(steps_of(p))) == []
