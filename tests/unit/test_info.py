"""`specscope info` on a trace built here: text and --json carry the real values."""

from __future__ import annotations

import json
import os

from conftest import NUM_STEPS, write_small_trace
from specscope.tracer.schema import SCHEMA_VERSION, ForwardMode
from specscope.tracer.store import TraceReader
from specscope.tracer.summary import summarize
from stepgen import K, accept_length, make_request, make_step
from test_cli_errors import run_cli


def _expected_acceptance(num_steps: int) -> tuple[float, list[float]]:
    lengths = [
        r.accept_length
        for i in range(num_steps)
        if (s := make_step(i)).mode == ForwardMode.TARGET_VERIFY
        for r in s.requests
    ]
    mean = sum(lengths) / len(lengths)
    rate = [sum(1 for n in lengths if n - 1 > j) / len(lengths) for j in range(K - 1)]
    return mean, rate


def test_info_json(tmp_path: os.PathLike[str]) -> None:
    path = write_small_trace(os.path.join(tmp_path, "t.db"))
    p = run_cli("info", "--json", path)
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""
    d = json.loads(p.stdout)
    assert d["path"] == path and d["schema_version"] == SCHEMA_VERSION
    assert d["steps"] == NUM_STEPS
    assert d["iterations"] == len({make_step(i).iteration for i in range(NUM_STEPS)})
    assert d["steps_by_mode"] == {"DRAFT_DECODE": 8, "TARGET_VERIFY": 2, "DRAFT_EXTEND": 2}
    assert d["steps_by_graph"] == {"eager": 1, "capture": 1, "replay": NUM_STEPS - 2}
    mean, rate = _expected_acceptance(NUM_STEPS)
    assert abs(d["mean_accept_length"] - mean) < 1e-12
    assert d["accept_rate_by_position"] == rate
    assert len(d["accept_rate_by_position"]) == K - 1
    assert d["run"]["target_model"] == "tiny" and d["run"]["draft_model"] == "tiny-draft"
    assert d["run"]["config"]["spec_steps"] == 3 and d["device"] == "cpu"
    assert d["run"]["attention_kernel"] == "reference" and d["run"]["versions"]["specscope"] == "0.1.0"
    recorded = sum(len(make_step(i).violations) for i in range(NUM_STEPS))
    assert d["num_violations"] == recorded + 1  # plus the checker's I16
    assert d["violations_by_id"]["I16"] == 1
    reqs = [make_request(r) for r in range(3)]
    assert d["requests"] == [
        {"id": r.request_id, "prompt_len": len(r.prompt_tokens), "output_tokens": list(r.output_tokens),
         "num_output_tokens": len(r.output_tokens), "finish_reason": r.finish_reason}
        for r in reqs
    ]  # fmt: skip
    t = d["tokens"]
    assert t["num_output_tokens"] == sum(len(r.output_tokens) for r in reqs)
    assert t["num_prompt_tokens"] == sum(len(r.prompt_tokens) for r in reqs)
    steps = [make_step(i) for i in range(NUM_STEPS)]
    assert t["num_query_tokens"] == sum(r.num_q_tokens for s in steps for r in s.requests)
    verify_rows = [r for s in steps if s.mode == ForwardMode.TARGET_VERIFY for r in s.requests]
    assert t["num_accepted_tokens"] == sum(r.accept_length for r in verify_rows)
    assert t["num_drafted_tokens"] == sum(len(r.draft_tokens) for r in verify_rows)


def test_info_text(small_trace: str) -> None:
    p = run_cli("info", small_trace)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    mean, rate = _expected_acceptance(NUM_STEPS)
    assert "specscope run --test" in out
    assert "device   cpu" in out and "kernel reference" in out
    assert f"steps    {NUM_STEPS} in " in out
    assert "DRAFT_DECODE" in out and "TARGET_VERIFY" in out
    assert f"mean accept length {mean:.3f}" in out
    for j, r in enumerate(rate):
        assert f"draft {j:<3} {r * 100:6.1f}%" in out
    assert "violations " in out and "I16=1" in out


def test_summary_without_verify_steps(tmp_path: os.PathLike[str]) -> None:
    path = write_small_trace(os.path.join(tmp_path, "t.db"), num_steps=3)  # draft decode only
    with TraceReader(path) as r:
        d = summarize(r)
    assert d["mean_accept_length"] is None
    assert d["accept_rate_by_position"] == []
    assert accept_length(0, 0) >= 1  # stepgen's helper stays in range
