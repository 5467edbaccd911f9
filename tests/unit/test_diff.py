"""`specscope diff`: a fault run against its clean run names the first diverging step and what differs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from specscope.tracer.diff import compare_steps, diff_traces
from specscope.tracer.schema import GraphPhase
from specscope.tracer.store import TraceReader
from specscope.ui.cli import main
from test_export_common import FAULT, recorded

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> str:
    return recorded(tmp_path_factory, "clean", [])


@pytest.fixture(scope="module")
def fault(tmp_path_factory: pytest.TempPathFactory) -> str:
    return recorded(tmp_path_factory, "fault", FAULT)


def test_fault_against_clean_names_the_first_diverging_verify(fault: str, clean: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    with TraceReader(fault) as ra, TraceReader(clean) as rb:
        rep = diff_traces(ra, rb)
        # Expected from the traces themselves: the first paired step whose kernel_q_len differs.
        first = next(i for i, (a, b) in enumerate(zip(ra.iter_summaries(), rb.iter_summaries(), strict=False))
                     if a.scalars.get("kernel_q_len") != b.scalars.get("kernel_q_len"))
        first_fwd = next(a.index for a, b in zip(ra.iter_summaries(), rb.iter_summaries(), strict=False)
                         if a.graph != GraphPhase.CAPTURE and compare_steps(ra.step(a.index), rb.step(b.index)))
    assert rep.first is not None and rep.first.a_step == first
    assert rep.first_forward is not None and rep.first_forward.a_step == first_fwd
    assert rep.first_forward.label.startswith("target TARGET_VERIFY")
    assert f"verify step {first_fwd}" in rep.headline and "kernel_q_len=4 instead of 2" in rep.headline
    assert rep.headline.startswith("with the fault max-seq-len-q-override")
    assert main(["diff", fault, clean]) == 1
    out = capsys.readouterr().out
    assert rep.headline in out and "mean accept length" in out and "outputs:" in out
    assert len(out.splitlines()) <= 40  # one screen
    assert main(["diff", fault, clean, "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert d["first_forward"]["a_step"] == first_fwd and d["headline"] == rep.headline
    assert d["acceptance"]["a"]["verify_rows"] > 0
    kinds = {x["kind"] for x in d["first_forward"]["differences"]}
    assert {"scalar", "array"} <= kinds


def test_a_trace_against_itself_does_not_diverge(clean: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", clean, clean]) == 0
    assert "no divergence" in capsys.readouterr().out


def test_sample_fault_trace_against_clean_sample() -> None:
    a = str(REPO / "samples/traces/cpu-fault-max-seq-len-q-override.db")
    b = str(REPO / "samples/traces/cpu-default.db")
    with TraceReader(a) as ra, TraceReader(b) as rb:
        rep = diff_traces(ra, rb)
    assert rep.first is not None and rep.headline.startswith("with the fault max-seq-len-q-override")


def test_bad_inputs_exit_2(clean: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", clean, str(tmp_path / "missing.db")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no such file" in err[0]
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"hello")
    assert main(["diff", str(junk), clean]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("specscope: error:")
