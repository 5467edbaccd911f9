"""Bug-report bundles: the zip's contents, a round trip through info / check / replay / export, bad arguments."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from specscope.tracer.checks import check_steps
from specscope.tracer.errors import TraceError
from specscope.tracer.export.bundle import bundle_steps, environment, open_trace_or_bundle
from specscope.tracer.schema import ForwardMode
from specscope.tracer.store import TraceReader
from specscope.ui.cli import main
from test_export_common import FAULT, recorded

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fault(tmp_path_factory: pytest.TempPathFactory) -> str:
    return recorded(tmp_path_factory, "fault", FAULT)


def verify_steps(path: str) -> list[int]:
    with TraceReader(path) as r:
        return [s.index for s in r.iter_summaries()
                if s.mode == ForwardMode.TARGET_VERIFY and s.graph.value == "replay"]


def one_error_line(capsys: pytest.CaptureFixture[str], *expect: str) -> None:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("specscope: error: "), err
    for e in expect:
        assert e in err[0], (e, err[0])


def test_bundle_round_trip(fault: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    v = verify_steps(fault)
    a, b = v[0] - 1, v[1] + 2
    out = tmp_path / "report.zip"
    assert main(["export", fault, "--bundle", str(out), "--steps", f"{a}:{b}"]) == 0
    assert "report.zip" in capsys.readouterr().out
    with zipfile.ZipFile(out) as z:
        names = set(z.namelist())
        readme = z.read("README.md").decode()
        check = json.loads(z.read("check.json"))
        env = json.loads(z.read("environment.json"))
        manifest = json.loads(z.read("bundle.json"))
        command = z.read("command.txt").decode().strip()
    assert {"trace.db", "README.md", "check.json", "environment.json", "command.txt", "perfetto.json.gz",
            "bundle.json"} <= names
    with TraceReader(fault) as r:
        want = bundle_steps(r, a, b)
        captures = {r.capture_of(i) for i in range(a, b)} - {None}
        assert command == r.run.command and env == environment(r)
        original = [x for x in r.violations() if x.step in set(want)]
    assert manifest["original_steps"] == want and captures and captures <= set(want)
    assert set(manifest["captures_added"]) == captures - set(range(a, b))
    assert len(check["original_violations"]) == len(original)
    assert "specscope check report.zip" in readme and "specscope replay report.zip --step" in readme
    assert command in readme
    # The bundled trace: same steps (original indexes), opens in every command.
    with open_trace_or_bundle(out) as db, TraceReader(db) as r:
        assert [s.index for s in r.iter_summaries()] == list(range(len(want)))  # dense, as the schema wants
        assert r.num_steps() == len(want)
        with TraceReader(fault) as orig:
            for i, o in enumerate(want):
                a_, b_ = r.step(i), orig.step(o)
                assert (a_.mode, a_.graph, a_.batch_size, a_.requests) == (b_.mode, b_.graph, b_.batch_size,
                                                                            b_.requests)
                assert a_.arrays == b_.arrays
        found = list(check_steps(r.steps()))
        assert r.run.command == command
    assert [x["check_id"] for x in check["bundle_check"]] == [x.check_id for x in found]
    assert any(x.check_id == "I6" for x in found)
    with open_trace_or_bundle(out) as db:
        assert main(["info", db]) == 0
        assert "TARGET_VERIFY" in capsys.readouterr().out
        assert main(["check", db]) == 1
        assert "I6" in capsys.readouterr().out
    assert main(["replay", str(out), "--step", str(want.index(v[1]))]) == 1  # the faulted verify, from the zip
    text = capsys.readouterr().out
    assert "kernel-vs-truth" in text and f"step {v[1]} of {Path(fault).name}" in text
    assert main(["export", str(out), "--perfetto", str(tmp_path / "p.json")]) == 0
    assert main(["diff", str(out), str(out)]) == 0
    assert "no divergence" in capsys.readouterr().out


def test_open_trace_or_bundle_cleans_up_and_passes_traces_through(fault: str, tmp_path: Path) -> None:
    with open_trace_or_bundle(fault) as p:
        assert p == fault
    out = tmp_path / "b.zip"
    assert main(["export", fault, "--bundle", str(out), "--steps", "4:8"]) == 0
    with open_trace_or_bundle(out) as db:
        assert Path(db).exists()
        folder = Path(db).parent
    assert not folder.exists()


def test_damaged_bundles_are_one_sentence(tmp_path: Path) -> None:
    bad = tmp_path / "bad.zip"
    bad.write_bytes(b"PK\x03\x04" + b"\0" * 64)
    with pytest.raises(TraceError, match="not a readable bundle"):
        with open_trace_or_bundle(bad):
            pass
    empty = tmp_path / "empty.zip"
    with zipfile.ZipFile(empty, "w"):
        pass
    with pytest.raises(TraceError):
        with open_trace_or_bundle(empty):
            pass
    junk = tmp_path / "junk.zip"
    with zipfile.ZipFile(junk, "w") as z:
        z.writestr("trace.db", b"not sqlite")
    with pytest.raises(TraceError, match="not a specscope trace"):
        with open_trace_or_bundle(junk) as db:
            TraceReader(db)


def test_export_bad_arguments_exit_2(fault: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "x.zip")
    cases = [
        (["export", fault], "nothing to write"),
        (["export", fault, "--bundle", out, "--steps", "9:3"], "range is empty"),
        (["export", fault, "--bundle", out, "--steps", "a:b"], "expected A:B"),
        (["export", fault, "--bundle", out, "--steps", "100000:100002"], "no steps in --steps"),
        (["export", fault, "--bundle", str(tmp_path / "x.tar")], "must end in .zip"),
        (["export", fault, "--perfetto", str(tmp_path / "x.txt")], "must end in .json"),
        (["export", fault, "--perfetto", str(tmp_path / "nope" / "x.json")], "no such folder"),
        (["export", str(tmp_path / "missing.db"), "--perfetto", str(tmp_path / "m.json")], "no such file"),
    ]
    for argv, msg in cases:
        assert main(argv) == 2, argv
        one_error_line(capsys, msg)
    Path(out).write_text("keep me")
    assert main(["export", fault, "--bundle", out]) == 2
    one_error_line(capsys, "already exists")
    assert Path(out).read_text() == "keep me"


@pytest.mark.parametrize("attention", ["flagged", "none"])
def test_attention_selection_keeps_the_verdicts_consistent(fault: str, tmp_path: Path, attention: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / f"{attention}.zip"
    assert main(["export", fault, "--bundle", str(out), "--attention", attention]) == 0
    capsys.readouterr()
    with zipfile.ZipFile(out) as z:
        check = json.loads(z.read("check.json"))
        manifest = json.loads(z.read("bundle.json"))
    with open_trace_or_bundle(out) as db, TraceReader(db) as r:
        found = list(check_steps(r.steps()))
        with_calls = [s.index for s in r.iter_summaries() if r.step(s.index, arrays=("attn_q",)).arrays]
        flagged = {x.step for x in found}
    assert [x["check_id"] for x in check["bundle_check"]] == [x.check_id for x in found]
    assert manifest["attention_steps"] == with_calls
    if attention == "none":
        assert not with_calls and not any(x.check_id.startswith("D") for x in found)
    else:
        assert with_calls and set(with_calls) <= flagged and manifest["attention_dropped"]


def test_committed_sample_exports_open(capsys: pytest.CaptureFixture[str]) -> None:
    from test_export_perfetto import assert_well_formed

    folder = REPO / "samples" / "exports"
    for p in sorted(folder.glob("*.perfetto.json.gz")):
        import gzip

        with gzip.open(p) as f:
            assert_well_formed(json.load(f)["traceEvents"])
    bundles = sorted(folder.glob("*.zip"))
    assert bundles
    for p in bundles:
        with open_trace_or_bundle(p) as db:
            assert main(["info", db]) == 0
    verify = folder / "cpu-fault-max-seq-len-q-override-verify.zip"
    assert main(["replay", str(verify), "--step", "1"]) == 1
    assert "kernel-vs-truth" in capsys.readouterr().out
