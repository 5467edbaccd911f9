"""`specscope replay`: a clean recorded call agrees with the reference, a faulted one shows the disagreement,
unusable input exits 2 with one line. Real CPU traces recorded by `specscope run`."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from specscope.tracer.attention_call import recorded_call
from specscope.tracer.schema import ForwardMode
from specscope.tracer.store import TraceReader
from specscope.ui.cli import main
from test_export_common import BF16, FAULT, recorded

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> str:
    return recorded(tmp_path_factory, "clean", [])


@pytest.fixture(scope="module")
def fault(tmp_path_factory: pytest.TempPathFactory) -> str:
    return recorded(tmp_path_factory, "fault", FAULT)


@pytest.fixture(scope="module")
def bf16(tmp_path_factory: pytest.TempPathFactory) -> str:
    # A bf16 pool, as on a GPU; T = 3 so the run has draft decodes (the first draft comes from draft extend).
    return recorded(tmp_path_factory, "bf16", BF16)




def first_step(path: str, mode: ForwardMode, min_bs: int = 1) -> int:
    with TraceReader(path) as r:
        for s in r.iter_summaries():
            if s.mode == mode and s.graph.value != "capture" and s.batch_size >= min_bs:
                return s.index
    raise AssertionError(f"no {mode} step in {path}")


def one_error_line(capsys: pytest.CaptureFixture[str], *expect: str) -> None:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("specscope: error: "), err
    for e in expect:
        assert e in err[0], (e, err[0])


@pytest.mark.parametrize(("which", "mode"), [
    ("clean", ForwardMode.EXTEND), ("clean", ForwardMode.TARGET_VERIFY), ("clean", ForwardMode.DRAFT_EXTEND),
    ("bf16", ForwardMode.EXTEND), ("bf16", ForwardMode.DRAFT_DECODE), ("bf16", ForwardMode.TARGET_VERIFY),
    ("bf16", ForwardMode.DRAFT_EXTEND)])  # T = 2 (the clean trace) has no draft decode: drafts come from extend
def test_clean_step_agrees(which: str, mode: ForwardMode, request: pytest.FixtureRequest,
                           capsys: pytest.CaptureFixture[str]) -> None:
    clean = request.getfixturevalue(which)
    i = first_step(clean, mode)
    assert main(["replay", clean, "--step", str(i), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["agrees"] and res["args_recorded"] and res["mode"] == mode.value
    with TraceReader(clean) as r:
        bs = r.summary(i).batch_size
        hq = recorded_call(r.step(i)).num_q_heads
    # One row per live request and head for each of the three comparisons.
    assert len(res["diffs"]) == 3 * bs * hq
    assert all(d["rel"] <= res["tol"] for d in res["diffs"])


def test_fault_step_disagrees_and_says_where(fault: str, capsys: pytest.CaptureFixture[str]) -> None:
    i = first_step(fault, ForwardMode.TARGET_VERIFY, min_bs=2)
    assert main(["replay", fault, "--step", str(i)]) == 1
    out = capsys.readouterr().out
    assert "q_len_per_req=4" in out  # the argument the faulted graph handed the kernel (T is 2)
    assert "DISAGREE" in out and " !" in out
    assert main(["replay", fault, "--step", str(i), "--json"]) == 1
    res = json.loads(capsys.readouterr().out)
    assert res["worst"]["kernel-vs-truth"] > res["tol"]
    assert res["worst"]["kernel-vs-reference"] <= res["tol"]  # the kernel did what its (wrong) arguments said


def test_replay_and_differential_read_one_recorded_call(fault: str) -> None:
    i = first_step(fault, ForwardMode.TARGET_VERIFY, min_bs=2)
    with TraceReader(fault) as r:
        step = r.step(i)
    call = recorded_call(step)
    assert call.args_recorded and call.entry == "decode" and call.q_len_per_req == 4
    assert call.has_mask and call.mask is not None and call.mask.dtype.name == "uint16"
    assert call.batch_size == step.padded_batch_size * step.tokens_per_request // 4
    assert call.q_len_per_req == step.scalars["kernel_q_len"]  # the scalar the differential check reads


def test_bad_arguments_exit_2_with_one_line(clean: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", clean, "--step", "100000"]) == 2
    one_error_line(capsys, "has no step 100000")
    with TraceReader(clean) as r:
        cap = next(s.index for s in r.iter_summaries() if s.graph.value == "capture")
    assert main(["replay", clean, "--step", str(cap)]) == 2
    one_error_line(capsys, f"step {cap} has no recorded attention call", "--record-attention")
    assert main(["replay", clean, "--step", "5", "--device", "tpu"]) == 2
    one_error_line(capsys, "--device 'tpu'")
    bad = tmp_path / "bad.zip"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    assert main(["replay", str(bad), "--step", "1"]) == 2
    one_error_line(capsys, "not a readable bundle")
    other = tmp_path / "other.zip"
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("hello.txt", "hi")
    assert main(["replay", str(other), "--step", "1"]) == 2
    one_error_line(capsys, "not a specscope bundle")
    assert main(["replay", str(tmp_path / "missing.db"), "--step", "1"]) == 2
    one_error_line(capsys, "no such file")


def test_old_trace_without_attn_call_is_replayable_from_derived_arguments(clean: str) -> None:
    import dataclasses

    from specscope.backend.replay import replay

    i = first_step(clean, ForwardMode.TARGET_VERIFY)
    with TraceReader(clean) as r:
        step = r.step(i)
    old = dataclasses.replace(step, arrays=tuple(a for a in step.arrays if a.name not in ("attn_call", "attn_mask")))
    call = recorded_call(old)
    assert not call.args_recorded and call.q_len_per_req == recorded_call(step).q_len_per_req
    assert replay(call, "cpu", "reference", "float32").agrees


def test_differential_check_flags_the_steps_replay_disagrees_on(fault: str, clean: str) -> None:
    from specscope.backend.replay import replay
    from specscope.tracer.differential import differential_check

    for path in (fault, clean):
        with TraceReader(path) as r:
            steps = [r.step(s.index) for s in r.iter_summaries() if s.mode == ForwardMode.TARGET_VERIFY
                     and s.graph.value == "replay"][:4]
        flagged = {v.step for v in differential_check(steps)}
        disagree = {s.index for s in steps if not replay(recorded_call(s), "cpu", "reference", "float32").agrees}
        assert flagged == disagree
        assert bool(disagree) == (path == fault)


@pytest.mark.gpu
def test_gpu_replay_of_each_mode_agrees(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """On a GPU host: record with the flashinfer kernels, replay one call per mode on cuda; kernel == reference."""
    import subprocess
    import sys

    out = tmp_path / "gpu.db"
    p = subprocess.run([sys.executable, "-m", "specscope.ui.cli", "run", "--requests", "8", "--batch-size", "4",
                        "--max-new-tokens", "16", "--record-attention", "1", "--quiet", "-o", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    for mode in (ForwardMode.EXTEND, ForwardMode.DRAFT_DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND):
        i = first_step(str(out), mode, min_bs=2 if mode != ForwardMode.EXTEND else 1)
        assert main(["replay", str(out), "--step", str(i), "--device", "cuda", "--json"]) == 0, mode
        res = json.loads(capsys.readouterr().out)
        assert res["kernel"] != "reference" and res["worst"]["kernel-vs-reference"] < res["tol"]


def test_bf16_calls_are_recorded_at_their_width_and_widen_exactly(bf16: str, clean: str) -> None:
    """A bf16 pool's q / out / KV are stored as their 16-bit patterns (half of float32) and decode bit-exactly."""
    from specscope.tracer.checks import check_steps

    with TraceReader(bf16) as r:
        steps = [r.step(s.index) for s in r.iter_summaries()]
    calls = [s for s in steps if s.array("attn_q") is not None]
    assert calls
    for s in calls:
        call = recorded_call(s)
        assert call.recorded_dtype == "bfloat16"
        for name, got in (("attn_q", call.q), ("attn_out", call.out), ("attn_kv", call.kv)):
            bits = s.array(name).values
            assert bits.dtype == np.int16, name
            assert got.dtype == np.float32 and got.size == bits.size
            back = got.reshape(-1).view(np.uint32)
            assert not (back & 0xFFFF).any()  # a widened bf16: the low half of every float32 is zero
            assert np.array_equal((back >> 16).astype(np.uint16), bits.reshape(-1).view(np.uint16)), name
    assert not [v for v in check_steps(steps) if v.check_id in ("D1", "D2")]  # the differential check reads them
    with TraceReader(clean) as r:  # the float32 pool keeps float32 (and says so)
        s = next(r.step(x.index) for x in r.iter_summaries() if r.step(x.index, arrays=("attn_q",)).arrays)
    assert recorded_call(s).recorded_dtype == "float32" and s.array("attn_kv").values.dtype == np.float32


def test_trace_recorded_before_the_dtype_tag_still_replays(capsys: pytest.CaptureFixture[str]) -> None:
    """Older traces hold float32 attn_* and no attn_dtype: they decode as float32 and replay."""
    old = str(REPO / "samples" / "traces" / "cpu-plan-stream-attention.db")
    with TraceReader(old) as r:
        i = next(s.index for s in r.iter_summaries() if s.mode == ForwardMode.TARGET_VERIFY
                 and r.step(s.index, arrays=("attn_q",)).arrays)
        step = r.step(i)
    assert step.array("attn_dtype") is None and step.array("attn_kv").values.dtype == np.float32
    assert recorded_call(step).recorded_dtype == "float32"
    assert main(["replay", old, "--step", str(i)]) == 0
    assert "agree within" in capsys.readouterr().out


def test_widen_refuses_what_it_cannot_read() -> None:
    from specscope.tracer.attention_call import NoRecordedCall, widen

    with pytest.raises(NoRecordedCall, match="float8"):
        widen(np.zeros(3, np.int8), "float8_e4m3fn")
    with pytest.raises(NoRecordedCall, match="tagged bfloat16"):
        widen(np.zeros(3, np.float32), "bfloat16")
    assert widen(np.array([0x3F80, -0x4080], np.int16), "bfloat16").tolist() == [1.0, -1.0]
    assert widen(np.array([0x3C00], np.int16), "float16").tolist() == [1.0]
