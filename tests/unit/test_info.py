"""`specscope info` on a trace built here: text and --json carry the real values."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections import Counter
from pathlib import Path

import pytest
from conftest import NUM_STEPS, write_small_trace
from specscope.tracer.checks import check_steps
from specscope.tracer.schema import SCHEMA_VERSION, ForwardMode, RequestRecord
from specscope.tracer.store import TraceReader, TraceWriter
from specscope.tracer.summary import PROMPT_TAIL, escape, summarize
from stepgen import K, accept_length, make_request, make_run, make_step
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
    # The target is "tiny", so ids are bytes: the outputs 100, 101, ... read "d", "def", "defgh".
    assert d["requests"] == [
        {"id": r.request_id, "prompt_len": len(r.prompt_tokens), "output_tokens": list(r.output_tokens),
         "num_output_tokens": len(r.output_tokens), "finish_reason": r.finish_reason,
         "prompt_tail_text": bytes(r.prompt_tokens).decode(), "output_text": text, "output_whitespace_share": 0.0}
        for r, text in zip(reqs, ["d", "def", "defgh"], strict=True)
    ]  # fmt: skip
    assert d["text"] == {"tokenizer": "bytes", "output_chars": 9, "output_whitespace_share": 0.0}
    t = d["tokens"]
    assert t["num_output_tokens"] == sum(len(r.output_tokens) for r in reqs)
    assert t["num_prompt_tokens"] == sum(len(r.prompt_tokens) for r in reqs)
    steps = [make_step(i) for i in range(NUM_STEPS)]
    assert t["num_query_tokens"] == sum(r.num_q_tokens for s in steps for r in s.requests)
    verify_rows = [r for s in steps if s.mode == ForwardMode.TARGET_VERIFY for r in s.requests]
    assert t["num_accepted_tokens"] == sum(r.accept_length for r in verify_rows)
    assert t["num_drafted_tokens"] == sum(len(r.draft_tokens) for r in verify_rows)
    # Draft acceptance excludes the bonus token that every verify row commits; accept length includes it.
    assert t["num_accepted_draft_tokens"] == sum(r.accept_length - 1 for r in verify_rows)
    assert d["draft_acceptance"] == t["num_accepted_draft_tokens"] / t["num_drafted_tokens"]
    assert d["mean_accept_length_includes_bonus"] is True
    assert d["violations_source"] == "trace"  # the checker's verdict (I16) is stored in the trace


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
    assert "(tokens committed per verify, bonus token included)" in out
    d = json.loads(run_cli("info", "--json", small_trace).stdout)
    t = d["tokens"]
    assert (f"draft acceptance {d['draft_acceptance'] * 100:.1f}% = {t['num_accepted_draft_tokens']} accepted / "
            f"{t['num_drafted_tokens']} drafted tokens (bonus excluded)") in out
    assert f"committed by verify {t['num_accepted_tokens']} (bonus included)" in out
    assert "request 0" not in out  # texts only with --text


def test_summary_without_verify_steps(tmp_path: os.PathLike[str]) -> None:
    path = write_small_trace(os.path.join(tmp_path, "t.db"), num_steps=3)  # draft decode only
    with TraceReader(path) as r:
        d = summarize(r)
    assert d["mean_accept_length"] is None
    assert d["accept_rate_by_position"] == []
    assert accept_length(0, 0) >= 1  # stepgen's helper stays in range


V1 = Path(__file__).resolve().parents[1] / "data" / "v1"


def test_info_reports_what_check_finds(tmp_path: Path) -> None:
    """A trace whose violations table is empty (no checker stored verdicts): info runs the catalogue, and its
    counts by check id are exactly the checker's."""
    path = str(tmp_path / "stale.db")
    shutil.copy(V1 / "cpu-fault-stale-page-table.db", path)
    with TraceReader(path) as r:
        assert r.count_violations_by_id() == {}
        expected = Counter(v.check_id for v in check_steps(r.steps()))
    assert sum(expected.values()) > 100
    d = json.loads(run_cli("info", "--json", path).stdout)
    assert d["violations_source"] == "catalogue"
    assert d["violations_by_id"] == dict(expected) and d["num_violations"] == sum(expected.values())
    out = run_cli("info", path).stdout
    by = "  ".join(f"{k}={v}" for k, v in sorted(expected.items(), key=lambda kv: int(kv[0][1:])))
    assert f"violations {sum(expected.values())}  ({by})  [the invariant catalogue, run now" in out
    quick = json.loads(run_cli("info", "--json", "--no-check", path).stdout)
    assert quick["violations_source"] == "unchecked" and quick["num_violations"] == 0
    assert "the catalogue was not run" in run_cli("info", "--no-check", path).stdout


def test_info_text_shows_prompts_and_outputs(tmp_path: Path) -> None:
    path = str(tmp_path / "default.db")
    shutil.copy(V1 / "cpu-default.db", path)
    p = run_cli("info", "--text", path)
    assert p.returncode == 0, p.stderr
    with TraceReader(path) as r:
        reqs = r.requests()
    total_ws = total = 0
    for q in reqs:
        out = bytes(q.output_tokens).decode("utf-8", errors="replace")
        tail = bytes(q.prompt_tokens[-PROMPT_TAIL:]).decode("utf-8", errors="replace")
        ws = sum(c.isspace() for c in out)
        total_ws, total = total_ws + ws, total + len(out)
        assert f"request {q.request_id}  prompt {len(q.prompt_tokens)} tokens  output {len(q.output_tokens)} " \
               f"tokens ({q.finish_reason})  whitespace {ws / len(out) * 100:.1f}%" in p.stdout
        assert f'  output "{escape(out)}"' in p.stdout
        assert f'"{escape(tail)}"' in p.stdout
    assert f"output is {total_ws / total * 100:.1f}% whitespace ({total} characters)" in p.stdout
    d = json.loads(run_cli("info", "--json", path).stdout)
    assert d["text"]["output_whitespace_share"] == total_ws / total
    assert [r["output_text"] for r in d["requests"]] == [
        bytes(q.output_tokens).decode("utf-8", errors="replace") for q in reqs]


def _trace_for_model(path: str, model: str, output: tuple[int, ...]) -> str:
    run = dataclasses.replace(make_run(), target_model=model)
    with TraceWriter(path, run) as w:
        w.write_request(RequestRecord(request_id=0, prompt_tokens=(0, 1), output_tokens=output, arrival_iteration=0,
                                      finish_iteration=3, finish_reason="length"))
    return path


def test_info_decodes_hf_checkpoints_with_their_tokenizer(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    folder = tmp_path / "hf-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "vocab_size": 8, "hidden_size": 8, "intermediate_size": 16,
        "num_hidden_layers": 1, "num_attention_heads": 1}))
    vocab = {"[UNK]": 0, "def": 1, "main": 2, "(": 3, ")": 4, ":": 5}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))
    ids = tuple(tok.encode("def main ( ) :").ids)
    path = _trace_for_model(str(tmp_path / "hf.db"), str(folder), ids)
    d = json.loads(run_cli("info", "--json", path).stdout)
    assert d["text"]["tokenizer"] == "tokenizers"
    assert d["requests"][0]["output_text"] == tok.decode(list(ids), skip_special_tokens=False)
    assert "main" in d["requests"][0]["output_text"]
    # Without tokenizer.json there is nothing to decode with: ids only, and the text says so.
    (folder / "tokenizer.json").unlink()
    d = json.loads(run_cli("info", "--json", path).stdout)
    assert d["text"]["tokenizer"] == "ids" and d["requests"][0]["output_text"] is None
    out = run_cli("info", "--text", path).stdout
    assert "no tokenizer for this model (token ids shown)" in out and f"output ids {list(ids)}" in out


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_info_shows_the_gpu_clock_brackets_and_their_drift(tmp_path: Path, writer: str) -> None:
    """A GPU run's recorder writes its clock-offset brackets (start, close) as meta rows; info turns them into the
    drift of the GPU clock against the host's over the run, and says when the close bracket is missing."""
    from specscope.tracer.process_writer import ProcessTraceWriter
    from specscope.tracer.run_end import CLOCK_END, CLOCK_START, clock_fact

    run = dataclasses.replace(make_run(), device="cuda:0")

    def write(path: str, closed_cleanly: bool) -> str:
        w = TraceWriter(path, run) if writer == "thread" else ProcessTraceWriter(path, run)
        w.write_meta(CLOCK_START, clock_fact(14_000, 1_000_000_000, 5_000_000))
        for i in range(NUM_STEPS):
            w.write_step(make_step(i))
        if closed_cleanly:  # 78 s later the offset had moved -158 µs: -2.03 ppm
            w.write_meta(CLOCK_END, clock_fact(16_000, 79_000_000_000, 5_000_000 - 158_000))
        w.close()
        return path

    path = write(str(tmp_path / "clock.db"), True)
    with TraceReader(path) as r:
        assert json.loads(r.meta()[CLOCK_START])["bracket_ns"] == 14_000
        clock = summarize(r, run_checks=False)["gpu_clock"]
    assert clock["drift_us"] == -158.0 and clock["elapsed_s"] == 78.0
    assert abs(clock["drift_ppm"] - (-158_000 / 78e9 * 1e6)) < 1e-9
    p = run_cli("info", "--no-check", path)
    assert p.returncode == 0, p.stderr
    assert "bracketed to 14.0 us; by close it had moved -158.0 us (-2.03 ppm over 78.0 s, bracket 16.0 us)" in p.stdout
    p = run_cli("info", "--no-check", write(str(tmp_path / "failed.db"), False))  # closed, but no close bracket
    assert "bracketed to 14.0 us; no bracket at close (the run ended on an error)" in p.stdout
    live = TraceWriter(str(tmp_path / "live.db"), run)  # still being written: its close bracket is yet to come
    live.write_meta(CLOCK_START, clock_fact(14_000, 1_000_000_000, 5_000_000))
    for i in range(NUM_STEPS):
        live.write_step(make_step(i))
    live.flush()
    p = run_cli("info", "--no-check", str(tmp_path / "live.db"))
    live.close()
    assert "no bracket at close yet (live, or the run was killed)" in p.stdout, p.stdout + p.stderr
    p = run_cli("info", "--no-check", write_small_trace(str(tmp_path / "old.db")))
    assert "clock " not in p.stdout  # a trace without brackets (older ones, SGLang's) shows no clock line


def test_a_cpu_run_records_its_stamp_clock_brackets_and_info_leaves_them_out(tmp_path: Path) -> None:
    """The recorder writes both brackets on the CPU too (the same code path as a GPU run's); there the stamps are
    host times, so `info` prints no clock line."""
    from specscope.backend.engine_config import EngineConfig
    from specscope.backend.session import run_session
    from specscope.tracer.run_end import CLOCK_END, CLOCK_START

    path = str(tmp_path / "cpu.db")
    run_session(EngineConfig(model="tiny", draft="tiny-draft", device="cpu", batch_size=2, num_requests=2,
                             max_new_tokens=8, spec_steps=2), path, command="test_info")
    with TraceReader(path) as r:
        meta = r.meta()
        assert r.run.device == "cpu"
    start, end = json.loads(meta[CLOCK_START]), json.loads(meta[CLOCK_END])
    assert start["offset_ns"] == 0 and end["at_ns"] > start["at_ns"] and end["bracket_ns"] >= 0
    p = run_cli("info", "--no-check", path)
    assert p.returncode == 0, p.stderr
    assert "clock " not in p.stdout
