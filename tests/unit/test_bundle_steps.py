"""A bundle keeps the step numbers of the trace it was cut from: through `replay`, `info`, `check`, `export` and
`diff` on the command line, and through the reader API (sparse indexes: the range, plus the captures it adds)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from specscope.tracer.bundle_file import original_step, read_manifest
from specscope.tracer.checks import Checker, check_steps
from specscope.tracer.query import StepFilter, StepIndex, index_runs_text
from specscope.tracer.schema import ForwardMode, GraphPhase
from specscope.tracer.store import TraceReader, TraceWriter
from specscope.ui.cli import main
from stepgen import make_run, make_step
from test_export_common import FAULT, recorded

REPO = Path(__file__).resolve().parents[2]
OLD_BUNDLE = REPO / "samples" / "exports" / "h200-graphs-changing-bs-steps-100-150.zip"  # format 2: renumbered


@pytest.fixture(scope="module")
def fault(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A short CPU run (real `specscope run`) with every attention call recorded and a fault the checks catch."""
    return recorded(tmp_path_factory, "fault", FAULT)


@pytest.fixture(scope="module")
def middle(fault: str) -> tuple[int, int]:
    """A range in the middle of the run, starting at a replayed verify whose capture lies before it."""
    with TraceReader(fault) as r:
        verifies = [s.index for s in r.iter_summaries()
                    if s.mode == ForwardMode.TARGET_VERIFY and s.graph == GraphPhase.REPLAY]
    a = verifies[2]
    return a, a + 6


@pytest.fixture(scope="module")
def bundle(fault: str, middle: tuple[int, int], tmp_path_factory: pytest.TempPathFactory) -> str:
    """`specscope export FAULT --bundle t.zip --steps A:B`."""
    out = tmp_path_factory.mktemp("bundle") / "t.zip"
    a, b = middle
    assert main(["export", fault, "--bundle", str(out), "--steps", f"{a}:{b}"]) == 0
    return str(out)


def _cli_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, object]:
    capsys.readouterr()
    code = main(argv)
    return code, json.loads(capsys.readouterr().out)


def test_the_bundle_holds_the_range_and_its_captures_under_their_original_indexes(
        fault: str, middle: tuple[int, int], bundle: str) -> None:
    a, b = middle
    with TraceReader(bundle) as r, TraceReader(fault) as orig:
        held = r.step_indexes()
        captures = sorted({orig.capture_of(i) for i in range(a, b)} - {None} - set(range(a, b)))
        assert captures and max(captures) < a - 1  # a gap between the captures and the range
        assert held == captures + list(range(a, b))
        assert [s.index for s in r.steps()] == held == [s.index for s in r.iter_summaries()]
        assert [s.index for s in r.summaries(a + 1, a + 3)] == [a + 1, a + 2]
        assert r.has_step(a) and not r.has_step(a - 1) and r.last_index() == b - 1 and not r.is_dense()
        assert r.steps_text() == "steps " + index_runs_text(held)
        for i in held:  # the same step as the original's, header and requests
            x, y = r.step(i, arrays=()), orig.step(i, arrays=())
            assert (x.mode, x.graph, x.batch_size, x.requests) == (y.mode, y.graph, y.batch_size, y.requests)
        assert r.capture_of(a) in captures  # a replay finds its capture across the gap
    m = read_manifest(bundle)
    assert m is not None and m["format"] >= 3 and m["step_numbers"] == "original"
    assert m["original_steps"] == held and m["captures_added"] == captures
    assert original_step(m, a) == a and original_step(m, a - 1) is None


def test_replay_takes_the_original_step_number(fault: str, middle: tuple[int, int], bundle: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    a, b = middle
    with TraceReader(bundle) as r:
        n_steps = r.num_steps()
        calls = [i for i in r.step_indexes() if r.step(i, arrays=("attn_q",)).arrays and i >= n_steps]
    assert calls  # a step number past the bundle's step count: found by index, not by position
    n = calls[0]
    code, got = _cli_json(capsys, ["replay", bundle, "--step", str(n), "--json"])
    assert code in (0, 1) and got["step"] == n and got["original_step"] == n  # type: ignore[index]
    code2, want = _cli_json(capsys, ["replay", fault, "--step", str(n), "--json"])
    assert code2 == code and got["worst"] == want["worst"]  # type: ignore[index]
    # A step the bundle left out: one line that names the zip and the steps it has.
    assert main(["replay", bundle, "--step", str(a - 1)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"has no step {a - 1}" in err[0] and "t.zip" in err[0] and f"{a}–{b - 1}" in err[0]


def test_info_names_the_zip_and_the_range_it_was_cut_from(fault: str, middle: tuple[int, int], bundle: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    a, b = middle
    code, d = _cli_json(capsys, ["info", bundle, "--json"])
    assert code == 0 and isinstance(d, dict)
    assert d["path"] == bundle and "specscope-bundle-" not in json.dumps(d)  # never the temporary copy
    bd = d["bundle"]
    assert bd["path"] == bundle and bd["source_trace"] == Path(fault).name and bd["range"] == [a, b]
    assert (bd["first_step"], bd["last_step"], bd["step_numbers"]) == (a, b - 1, "original")
    assert bd["captures_added"] and max(bd["captures_added"]) < a
    assert main(["info", bundle]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"trace    {bundle} ") and f"bundle of steps {a}–{b - 1} of {Path(fault).name}" in text
    # A plain trace says nothing of bundles.
    code, plain = _cli_json(capsys, ["info", fault, "--json"])
    assert "bundle" not in plain and plain["path"] == fault  # type: ignore[operator,index]


def test_check_reports_original_step_numbers_and_invents_nothing_across_the_gap(
        fault: str, bundle: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _cli_json(capsys, ["check", bundle, "--json"])
    rows = out["violations"]  # type: ignore[index]
    with TraceReader(bundle) as r:
        held = set(r.step_indexes())
        n_steps = r.num_steps()
    _, whole = _cli_json(capsys, ["check", fault, "--json"])
    full = whole["violations"]  # type: ignore[index]
    got = {(v["id"], v["step"]) for v in rows}  # type: ignore[union-attr,index]
    want = {(v["id"], v["step"]) for v in full if v["step"] in held}  # type: ignore[union-attr,index]
    assert code == 1 and got and {s for _, s in got} <= held
    assert any(s >= n_steps for _, s in got)  # numbered as in the trace, not 0..n-1
    assert got <= want  # a bundle's checks never see more than the full trace did at those steps
    with zipfile.ZipFile(bundle) as z:
        check = json.loads(z.read("check.json"))
    assert {(v["check_id"], v["step"]) for v in check["bundle_check"]} == got
    assert {v["step"] for v in check["original_violations"]} <= held


def test_export_of_a_bundle_and_diff_against_its_trace_use_original_numbers(
        fault: str, middle: tuple[int, int], bundle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = middle
    inner = tmp_path / "u.zip"
    assert main(["export", bundle, "--bundle", str(inner), "--steps", f"{a + 2}:{a + 4}"]) == 0
    with TraceReader(inner) as r:
        assert [i for i in r.step_indexes() if i >= a] == [a + 2, a + 3]
    assert main(["export", bundle, "--perfetto", str(tmp_path / "p.json"), "--steps", f"{a}:{a + 1}"]) == 0
    assert "1 steps" in capsys.readouterr().out
    assert main(["export", bundle, "--perfetto", str(tmp_path / "q.json"), "--steps", f"{a - 1}"]) == 2
    assert "no steps in --steps" in capsys.readouterr().err
    # Paired by index, the bundle's steps are the trace's: no divergence (only the step counts differ).
    main(["diff", bundle, fault])
    out = capsys.readouterr().out
    with TraceReader(bundle) as r:
        assert f"no divergence in {r.num_steps()} paired steps" in out


def test_an_old_bundle_still_opens_numbered_as_its_readme_says(capsys: pytest.CaptureFixture[str]) -> None:
    m = read_manifest(OLD_BUNDLE)
    assert m is not None and m["format"] < 3
    code, d = _cli_json(capsys, ["info", str(OLD_BUNDLE), "--json"])
    bd = d["bundle"]  # type: ignore[index]
    assert code == 0 and bd["step_numbers"] == "bundle" and bd["original_steps"] == m["original_steps"]
    assert bd["first_step"] == 100 and original_step(m, 0) == m["original_steps"][0]
    with TraceReader(OLD_BUNDLE) as r:
        assert r.step_indexes() == list(range(len(m["original_steps"])))
    assert main(["info", str(OLD_BUNDLE)]) == 0
    assert "an older bundle: its steps are numbered 0–" in capsys.readouterr().out


def _sparse_trace(path: str, indexes: list[int], bs_of: dict[int, int]) -> str:
    with TraceWriter(path, make_run()) as w:
        for i in indexes:
            w.write_step(make_step(i, bs=bs_of.get(i, 4)))
    return path


def test_reader_queries_and_step_index_on_sparse_indexes(tmp_path: Path) -> None:
    """`prev` and `bs change` never reach across a gap: the steps in it are unknown, not "the step before"."""
    held = [0, 1, 2, 3, 4, 5, 20, 21, 22, 23, 24, 25]
    path = _sparse_trace(str(tmp_path / "s.db"), held, {i: 2 for i in range(20, 26)})  # bs 4, then 2 after the gap
    with TraceReader(path) as r:
        assert r.step_indexes() == held and r.steps_text() == "steps 0–5, 20–25"
        assert r.find_steps("bs change", limit=None) == []  # every bs change is across the gap
        assert r.find_steps("bs != prev.bs", limit=None) == []
        assert r.find_steps("index == 20 and prev.index == 19", limit=None) == []
        assert r.find_steps("step == 21 and prev.step == 20", limit=None) == [21]
        assert r.find_steps(StepFilter(mode=r.summary(22).mode.value), after=5, limit=1) == [
            next(s.index for s in r.iter_summaries(20) if s.mode == r.summary(22).mode)]
        assert r.wait_for_steps(5, 0.0) == len(held)  # a step past index 5 is there (20..25)
        pos = StepIndex(r)
    assert len(pos) == len(held) and not pos.dense
    assert [pos.at(k) for k in range(len(held))] == held
    assert pos.position(20) == 6 and pos.position(10) is None
    assert pos.offset(5, 1) == 20 and pos.offset(20, -1) == 5 and pos.offset(25, 3) == 25
    assert pos.snap(11) == 5 and pos.snap(14) == 20 and pos.run_of(22) == (20, 25) and pos.run_of(3) == (0, 5)
    assert pos.between(4, 22) == [4, 5, 20, 21] and pos.text() == "steps 0–5, 20–25"


def test_the_checker_forgets_what_the_steps_of_a_gap_would_have_changed(fault: str) -> None:
    """Fed a trace with steps left out, the catalogue finds no violation the full trace did not have there."""
    with TraceReader(fault) as r:
        full = {(v.check_id, v.step) for v in check_steps(r.steps(), r.run)}
        verifies = [s.index for s in r.iter_summaries() if s.mode == ForwardMode.TARGET_VERIFY and s.iteration > 0]
        cut = range(verifies[1] - 2, verifies[2] - 1)  # the steps that commit between two verifies
        checker = Checker(r.run)
        sparse = {(v.check_id, v.step) for i in r.step_indexes() if i not in cut for v in checker.feed(r.step(i))}
    assert sparse <= full
