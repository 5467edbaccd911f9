"""Conventions every subcommand keeps, through the real command line: numbers refused at parse time, flags that
would be ignored refused, one spelling for one step and one for a range, --json results, unwritable outputs
and taken ports refused before any slow work, a report ordered by what explains a bug, stored verdicts read
as they are, and reading a trace never importing the engine's package."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import write_small_trace
from test_cli_errors import assert_one_line_error, run_cli

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "samples" / "traces"
CLEAN = str(SAMPLES / "cpu-default.db")
FAULTY = str(SAMPLES / "cpu-fault-max-seq-len-q-override.db")
ATTENTION = str(SAMPLES / "cpu-plan-stream-attention.db")  # recorded with --record-attention: replayable steps
SMALL_RUN = ["--device", "cpu", "--requests", "2", "--batch-size", "2", "--max-new-tokens", "6"]


# ---- numbers: nan, inf and out-of-range values are usage errors that name the flag ------------------------------

BAD_NUMBERS = [
    (["replay", ATTENTION, "--step", "40", "--tol", "nan"], "--tol must be a finite number >= 0, got nan"),
    (["replay", ATTENTION, "--step", "40", "--tol", "-1"], "--tol must be a finite number >= 0, got -1"),
    (["replay", ATTENTION, "--step", "40", "--tol", "inf"], "--tol must be a finite number >= 0, got inf"),
    (["replay", ATTENTION, "--step", "-1"], "--step must be 0 or more, got -1"),
    (["tui", CLEAN, "--step", "-2"], "--step must be 0 or more, got -2"),
    (["tui", "--live", "--break-step", "-1"], "--break-step must be 0 or more, got -1"),
    (["tui", "--live", "--temperature", "nan"], "--temperature must be a finite number >= 0"),
    (["check", CLEAN, "--max-per-check", "-1"], "--max-per-check must be 0 or more, got -1"),
    (["web", CLEAN, "--port", "70000"], "--port must be a TCP port (0-65535), got 70000"),
    (["web", CLEAN, "--port", "-1"], "--port must be a TCP port (0-65535), got -1"),
    (["demo", "--temperature", "inf"], "--temperature must be a finite number >= 0"),
    (["demo", "--requests", "0"], "--requests must be at least 1, got 0"),
    (["run", "--seed", "-5"], "--seed must be between 0 and 2**63 - 1, got -5"),
    (["run", "--spec-steps", "99"], "--spec-steps must be between 0 and 15, got 99"),
    (["run", "--max-new-tokens", "-3"], "--max-new-tokens must be at least 1, got -3"),
]  # fmt: skip


@pytest.mark.parametrize("argv,expect", BAD_NUMBERS, ids=[" ".join(a[:1] + a[2:]) for a, _ in BAD_NUMBERS])
def test_bad_numbers_are_usage_errors(argv: list[str], expect: str, tmp_path: Path) -> None:
    p = run_cli(*argv, cwd=str(tmp_path))
    assert_one_line_error(p, expect, f"see `specscope {argv[0]} --help`")
    assert p.stdout == ""
    assert not list(tmp_path.iterdir()), "a refused command must not write anything"


def test_replay_tolerance_nan_is_refused_not_a_disagreement() -> None:
    """`--tol nan` used to compare every difference against nan and print DISAGREE (exit 1) on equal results."""
    good = run_cli("replay", ATTENTION, "--step", "40", "--json")
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["agrees"] is True
    for tol in ("nan", "-1"):
        p = run_cli("replay", ATTENTION, "--step", "40", "--tol", tol)
        assert p.returncode == 2 and "DISAGREE" not in p.stdout, (p.returncode, p.stdout)


# ---- flags that the chosen output would ignore -----------------------------------------------------------------

def test_info_json_with_text_is_refused_and_json_holds_the_texts() -> None:
    p = run_cli("info", CLEAN, "--json", "--text")
    assert_one_line_error(p, "--text and --json do not combine", "prompt_tail_text")
    d = json.loads(run_cli("info", CLEAN, "--json").stdout)
    text = run_cli("info", CLEAN, "--text").stdout
    assert d["requests"] and all(r["output_text"] for r in d["requests"])
    assert all(json.dumps(r["output_text"], ensure_ascii=False)[1:-1] in text for r in d["requests"])


def test_replay_json_with_all_heads_is_refused() -> None:
    assert_one_line_error(run_cli("replay", ATTENTION, "--step", "40", "--json", "--all-heads"),
                          "--all-heads and --json do not combine")


# ---- one step is --step N, a range --steps A:B; each command takes the other spelling as an alias ---------------

def test_replay_takes_steps_as_an_alias_for_one_step() -> None:
    a = run_cli("replay", ATTENTION, "--step", "40", "--json")
    b = run_cli("replay", ATTENTION, "--steps", "40", "--json")
    assert a.returncode == b.returncode == 0, (a.stderr, b.stderr)
    assert json.loads(a.stdout)["step"] == json.loads(b.stdout)["step"] == 40


@pytest.mark.parametrize("command", ["replay", "tui"])
def test_a_range_where_one_step_is_taken_says_where_ranges_go(command: str) -> None:
    assert_one_line_error(run_cli(command, ATTENTION, "--steps", "30:60"),
                          "--steps 30:60: this command takes one step, --step N", "specscope export --steps A:B")


def test_export_takes_step_as_an_alias_for_one_step(tmp_path: Path) -> None:
    out = tmp_path / "one.json"
    p = run_cli("export", CLEAN, "--perfetto", str(out), "--step", "7", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["steps"] == "7" and d["files"][0]["steps"] == 1
    assert "--step N is accepted for one step" in " ".join(run_cli("export", "--help").stdout.split())
    assert "--steps N is accepted too" in " ".join(run_cli("replay", "--help").stdout.split())


def test_tui_step_is_checked_by_index(tmp_path: Path) -> None:
    assert_one_line_error(run_cli("tui", CLEAN, "--step", "500"), "has no step 500 (steps 0–172)")


# ---- outputs that cannot be written, ports that are taken: refused before any slow work -------------------------

def test_run_to_an_uncreatable_path_fails_at_once(tmp_path: Path) -> None:
    t0 = time.perf_counter()
    p = run_cli("run", "--device", "cpu", "-o", "/proc/specscope-x.db", cwd=str(tmp_path))
    assert_one_line_error(p, "cannot write /proc/specscope-x.db", "no file can be created in /proc")
    assert time.perf_counter() - t0 < 5  # before torch loads (the run used to fail after loading and warming up)


@pytest.mark.parametrize("flag,name", [("--perfetto", "x.json"), ("--bundle", "x.zip")])
def test_export_to_an_uncreatable_path_is_one_line(flag: str, name: str) -> None:
    p = run_cli("export", CLEAN, flag, f"/proc/{name}")
    assert_one_line_error(p, f"cannot write /proc/{name}")
    assert ".tmp" not in p.stderr and "FileNotFoundError" not in p.stderr


def test_a_failed_export_leaves_no_partial_or_temporary_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from specscope.tracer.export import perfetto
    from specscope.ui.cli import main

    def full_disk(reader: object, out: str, *a: object, **k: object) -> int:
        with open(out + ".tmp", "wb") as f:  # what the writer has on disk when the disk fills up
            f.write(b"{partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(perfetto, "write_perfetto", full_disk)
    out = tmp_path / "t.json"
    assert main(["export", CLEAN, "--perfetto", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"specscope: error: cannot write {out}: No space left on device"]
    assert list(tmp_path.iterdir()) == []


def test_export_json_names_each_file_and_its_size(tmp_path: Path) -> None:
    pf, zp = tmp_path / "t.json.gz", tmp_path / "t.zip"
    p = run_cli("export", FAULTY, "--perfetto", str(pf), "--bundle", str(zp), "--steps", "35:45", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["trace"] == FAULTY and d["steps"] == "35:45"
    by_kind = {f["kind"]: f for f in d["files"]}
    assert by_kind["perfetto"]["path"] == str(pf) and by_kind["perfetto"]["bytes"] == pf.stat().st_size
    assert by_kind["perfetto"]["steps"] == 10 and by_kind["perfetto"]["events"] > 0
    assert by_kind["bundle"]["bytes"] == zp.stat().st_size and by_kind["bundle"]["steps"] >= 10
    assert sorted(x.name for x in tmp_path.iterdir()) == ["t.json.gz", "t.zip"]


def test_web_on_a_taken_port_is_one_line_before_the_traces_load() -> None:
    pytest.importorskip("dash")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = run_cli("web", CLEAN, "--port", str(port), timeout=60)
    assert_one_line_error(p, f"cannot listen on 127.0.0.1:{port}: the port is in use by another program",
                          "--port 0")


def test_upgrade_speaks_of_its_own_flag(tmp_path: Path) -> None:
    new = tmp_path / "new.db"
    new.write_bytes(b"keep me")
    p = run_cli("upgrade", str(REPO / "tests/data/v1/cpu-default.db"), str(new))
    assert_one_line_error(p, "already exists (pass --overwrite to replace it)")
    assert "overwrite=True" not in p.stderr and new.read_bytes() == b"keep me"
    assert_one_line_error(run_cli("upgrade", str(REPO / "tests/data/v1/cpu-default.db"), "/proc/new.db"),
                          "cannot write /proc/new.db")


# ---- --json results of run and demo ----------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["run", "demo"])
def test_run_and_demo_json(command: str, tmp_path: Path) -> None:
    out = tmp_path / "t.db"
    p = run_cli(command, *SMALL_RUN, "--inject", "stale-page-table", "--page-size", "16", "-o", str(out), "--json",
                "--quiet", cwd=str(tmp_path), timeout=300)
    assert p.returncode == (1 if command == "demo" else 0), p.stderr  # demo fails on the checks' errors
    d = json.loads(p.stdout)
    from specscope.tracer.store import TraceReader

    with TraceReader(str(out)) as r:
        steps, errors = r.num_steps(), len(r.violations(severity="error"))
        by_id = r.count_violations_by_id()
    assert d["trace"] == str(out) and d["steps"] == steps > 0
    v = d["verdicts"]
    assert v["errors"] == errors > 0 and v["by_id"] == by_id and v["checked_through"] == steps - 1
    assert d["output_tokens"] == 2 * 6 and d["requests"] == 2 and d["tokens_per_s"] > 0


def test_run_json_without_a_trace(tmp_path: Path) -> None:
    p = run_cli("run", *SMALL_RUN, "--no-trace", "--json", "--quiet", cwd=str(tmp_path), timeout=300)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["trace"] is None and d["steps"] is None and d["verdicts"] is None


# ---- progress where there is no terminal -----------------------------------------------------------------------

def test_progress_is_logged_in_lines_without_a_terminal() -> None:
    import io

    from specscope.ui.cmd_run import PROGRESS_LOG_S, Progress

    now = [0.0]
    out = io.StringIO()
    log = Progress(True, stream=out, clock=lambda: now[0], tty=False)
    log(0, 100)
    now[0] += PROGRESS_LOG_S / 2
    log(20, 100)
    assert out.getvalue() == ""  # a short run (a test, the demo) logs nothing
    now[0] += PROGRESS_LOG_S / 2
    log(40, 100)
    now[0] += 1
    log(45, 100)
    log.close(final_rate=4.0)
    assert out.getvalue() == "specscope: progress 40/100 tokens (40%), 4 tok/s\n"
    help_text = " ".join(run_cli("run", "--help").stdout.split())
    assert f"when stderr is not a terminal (a log, CI), one line every {PROGRESS_LOG_S:g} s" in help_text


# ---- diff warns about traces of different workloads ------------------------------------------------------------

def _with_config(tmp_path: Path, name: str, **changes: object) -> str:
    """A copy of the clean sample whose run record says `changes` (the steps are the same)."""
    out = tmp_path / name
    shutil.copy(CLEAN, out)
    with sqlite3.connect(out) as c:
        run = json.loads(c.execute("SELECT info FROM run WHERE id = 1").fetchone()[0])
        run["config"].update(changes)
        c.execute("UPDATE run SET info = ? WHERE id = 1", (json.dumps(run),))
    return str(out)


def test_diff_of_unrelated_workloads_warns(tmp_path: Path) -> None:
    other = _with_config(tmp_path, "other.db", seed=7)
    p = run_cli("diff", CLEAN, other, "--json")
    warn = [x for x in p.stderr.splitlines() if x.startswith("specscope: warning:")]
    assert len(warn) == 1 and "are not the same workload (seed 0 vs 7)" in warn[0], p.stderr
    assert json.loads(p.stdout)["workload_differences"] == ["seed 0 vs 7"]
    prompts = run_cli("diff", CLEAN, str(SAMPLES / "h200-default.db"), "--json")
    assert "prompts of 8 of 8 requests" in prompts.stderr
    same = run_cli("diff", CLEAN, CLEAN, "--json")
    assert same.returncode == 0 and same.stderr == ""
    assert json.loads(same.stdout)["workload_differences"] == []


def test_diff_of_other_engine_settings_does_not_warn(tmp_path: Path) -> None:
    # A fault run against its clean run, another K or batch size: the same requests, what diff is for.
    other = _with_config(tmp_path, "fault.db", faults=["max-seq-len-q-override"], verify_tokens=2, batch_size=2,
                         temperature=0.5)
    p = run_cli("diff", other, CLEAN, "--json")
    assert "warning" not in p.stderr and json.loads(p.stdout)["workload_differences"] == []


# ---- check's order: first step, then severity, then id ---------------------------------------------------------

def _rank(row: dict) -> tuple[int, int, int]:
    return row["step"], 0 if row["severity"] == "error" else 1, int(row["id"].lstrip("IDK") or -1)


def test_check_orders_by_first_step_then_severity_then_id() -> None:
    p = run_cli("check", FAULTY, "--json")
    rows = json.loads(p.stdout)["violations"]
    assert [_rank(r) for r in rows] == sorted(_rank(r) for r in rows)
    text = run_cli("check", FAULTY, "--max-per-check", "0").stdout
    groups = [line.split()[0] for line in text.splitlines() if line[:1] in "IDK" and " [" in line]
    first: dict[str, tuple[int, int, int]] = {}
    for r in rows:
        first.setdefault(r["id"], _rank(r))
    assert groups == sorted(first, key=lambda k: first[k])
    assert groups[:3] == ["I3", "I6", "I7"] and groups.index("I12") < groups.index("I13")  # I12 before I13 at step 9


# ---- info reads stored verdicts ---------------------------------------------------------------------------------

def test_info_reads_stored_verdicts_instead_of_checking_again(tmp_path: Path) -> None:
    # A trace whose stored verdicts (checked through its last step) say clean, over steps the catalogue flags:
    # what info reports shows which it used.
    t = tmp_path / "stored.db"
    shutil.copy(FAULTY, t)
    with sqlite3.connect(t) as c:
        c.execute("DELETE FROM violations")
    d = json.loads(run_cli("info", str(t), "--json").stdout)
    assert d["violations_source"] == "trace" and d["num_violations"] == 0 and d["checked_through"] == 95
    assert "violations 0  [from the trace's violations table]" in run_cli("info", str(t)).stdout
    # Without stored verdicts for every step, info runs the catalogue and says so.
    with sqlite3.connect(t) as c:
        c.execute("DELETE FROM meta WHERE key = 'checked_through'")
    d = json.loads(run_cli("info", str(t), "--json").stdout)
    assert d["violations_source"] == "catalogue" and d["num_violations"] > 0 and d["checked_through"] is None
    assert "the invariant catalogue, run now" in run_cli("info", str(t)).stdout


# ---- reading a trace never imports the engine's package --------------------------------------------------------

PROBE = r"""
import contextlib, io, json, sys
from specscope.ui.cli import main
codes = []
with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()) as err:
    for argv in json.loads(sys.argv[1]):
        codes.append(main(argv))
print(json.dumps({"codes": codes, "backend": sorted(m for m in sys.modules if m.startswith("specscope.backend")),
                  "torch": "torch" in sys.modules, "out": out.getvalue(), "err": err.getvalue()}))
"""


def test_check_and_info_never_import_the_engine(tmp_path: Path) -> None:
    # A fault that never fired (check prints its hint), a model folder's config.json (info's tokenizer), the
    # embedded byte-level models (info decodes the texts).
    from specscope.tracer.store import TraceWriter
    from stepgen import make_request, make_run, make_step

    quiet = str(tmp_path / "quiet.db")
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"specscope": {"tokenizer": "bytes"}}))
    base = make_run()
    run = dataclasses.replace(base, config={**base.config, "faults": ["no-plan-wait"]}, target_model=str(folder))
    with TraceWriter(quiet, run) as w:
        for i in range(6):
            w.write_step(make_step(i))
        w.write_request(make_request(0))
    small = write_small_trace(str(tmp_path / "small.db"))
    argv = [["check", quiet], ["info", quiet], ["check", FAULTY], ["info", CLEAN, "--text"], ["info", small]]
    p = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout.strip().splitlines()[-1])
    assert d["backend"] == [] and d["torch"] is False, d["backend"]
    assert "fault no-plan-wait never fired in this run (it acts on speculative iterations with the plan stream)" \
        in d["out"]
    assert "tokenizer bytes" in d["out"]  # the model folder's config.json and the embedded models both decode
    assert d["codes"][2] == 1


def test_the_engine_reexports_what_moved_to_the_tracer() -> None:
    from specscope.backend import faults, loader
    from specscope.tracer import fault_hints, tokens

    assert faults.FAULT_HINTS is fault_hints.FAULT_HINTS
    assert set(fault_hints.FAULT_HINTS) == set(faults.FAULT_NAMES)
    assert loader.decode_tokens is tokens.decode_tokens and loader.EMBEDDED is tokens.EMBEDDED_MODELS
    assert os.fspath(loader.resolve_model_path("tiny")).endswith(os.path.join("samples", "models", "target"))
