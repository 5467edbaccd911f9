"""`specscope check` as a user runs it: --write into the trace, --list without a trace (text and JSON), bad
--max-per-check, an exit status that survives a reader closing the pipe, and what a backend did not record."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")

import dataclasses  # noqa: E402

from checkgen import base_run, find, replace_step, roundtrip, set_cells, verify_replay  # noqa: E402
from specscope.tracer.checks import CATALOGUE, Checker  # noqa: E402
from specscope.tracer.schema import GraphPhase  # noqa: E402
from specscope.tracer.store import TraceReader  # noqa: E402


def _cli(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specscope.ui.cli", *args], capture_output=True, text=True,
                          timeout=300, **kw)


@pytest.fixture(scope="module")
def bad_trace(tmp_path_factory) -> str:
    """A real run with one wrong seq_lens_cpu cell (I34)."""
    run, steps = base_run()
    i = find(steps, verify_replay)
    path = str(tmp_path_factory.mktemp("cli") / "bad.db")
    roundtrip(path, run, replace_step(steps, i, set_cells(steps[i], "seq_lens_cpu", lambda v: v.__setitem__(0, 1))))
    return path


def test_write_stores_the_verdicts_and_how_far_they_go(bad_trace: str) -> None:
    for _ in range(2):  # a second --write replaces the first
        res = _cli("check", bad_trace, "--write")
        assert res.returncode == 1 and "wrote 1 violations" in res.stdout, res.stderr
    with TraceReader(bad_trace) as r:
        vs = r.violations(source="check")
        assert [(v.check_id, v.array, v.row) for v in vs] == [("I34", "seq_lens_cpu", 0)]
        assert r.checked_through() == r.num_steps() - 1


def test_list_needs_no_trace_and_speaks_json() -> None:
    text = _cli("check", "--list")
    assert text.returncode == 0 and len(text.stdout.splitlines()) == len(CATALOGUE)
    rows = json.loads(_cli("check", "--list", "--json").stdout)
    assert [r["id"] for r in rows] == [i.check_id for i in CATALOGUE]
    assert all(r["reads"] and r["severity"] in ("error", "warning") for r in rows)


@pytest.mark.parametrize("args,fragment", [(["--max-per-check", "-1"], "--max-per-check must be 0 or more"),
                                           ([], "check needs a TRACE")])
def test_bad_arguments_are_one_line(args: list[str], fragment: str) -> None:
    res = _cli("check", *args)
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [f"specscope: error: {fragment}"
                                                                       + res.stderr.split(fragment, 1)[1].rstrip()]


def test_exit_status_survives_a_closed_pipe(tmp_path) -> None:
    """`check --json T | head -1` still exits 1 (the output is far larger than a pipe holds)."""
    run, steps = base_run()
    path = str(tmp_path / "many.db")
    many = [set_cells(s, "cache_seqlens", lambda v: v.__setitem__(slice(None), v + 1)) if s.iteration >= 0 else s
            for s in steps]
    roundtrip(path, run, many)
    assert len(_cli("check", "--json", path).stdout) > 1 << 17  # twice a 64 KiB pipe
    proc = subprocess.Popen([sys.executable, "-m", "specscope.ui.cli", "check", "--json", path],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"{"
    proc.stdout.close()  # the reader goes away before the rest is written
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1 and b"Traceback" not in err and b"BrokenPipe" not in err


def _absent_trace(path: str) -> tuple[str, int, int]:
    """A real run as SGLang 0.5.15+ records it: no max_seq_len_k, graph replays without metadata, and one wrong
    seq_lens_cpu cell in an eager step. Returns (path, steps, replays)."""
    run, steps = base_run()
    nr = {"fields": {"max_seq_len_k": "no such field in this release"},
          "replay_metadata": "computed inside the graph (SGLang 0.5.15+)"}
    run = dataclasses.replace(run, config={**run.config, "not_recorded": nr})
    out = [dataclasses.replace(s, arrays=(), scalars={}) if s.graph == GraphPhase.REPLAY else
           dataclasses.replace(s, scalars={k: v for k, v in s.scalars.items() if k != "max_seq_len_k"}) for s in steps]
    i = find(tuple(out), lambda s: s.graph == GraphPhase.EAGER and s.array("seq_lens_cpu") is not None)
    out[i] = set_cells(out[i], "seq_lens_cpu", lambda v: v.__setitem__(0, v[0] + 1))
    roundtrip(path, run, out)
    return path, len(steps), sum(s.graph == GraphPhase.REPLAY for s in steps)


def test_check_says_what_it_could_not_check(tmp_path) -> None:
    path, n, replays = _absent_trace(str(tmp_path / "absent.db"))
    with TraceReader(path) as r:
        checker = Checker.for_trace(r)
        for s in r.steps():
            checker.feed(s)
    want = checker.not_recorded()
    assert ("I9", "max_seq_len_k: no such field in this release", n) in want
    assert ("I10", "replay metadata: computed inside the graph (SGLang 0.5.15+)", replays) in want

    text = _cli("check", path)
    lines = text.stdout.splitlines()
    assert text.returncode == 1 and lines[0].startswith(f"{path}: {n} steps, 1 violations of 1 invariants")
    assert lines[1: 1 + len(want)] == [f"{cid} not recorded by this backend ({why}) on {k} steps"
                                       for cid, why, k in want]
    assert "I9 not recorded by this backend (max_seq_len_k: no such field in this release) on " \
           f"{n} steps" in lines
    assert any(line.startswith("I34 [error]") for line in lines)  # the verdicts follow

    res = _cli("check", path, "--json")
    doc = json.loads(res.stdout)
    assert res.returncode == 1 and [v["id"] for v in doc["violations"]] == ["I34"]
    assert doc["not_recorded"] == [{"check": cid, "reason": why, "steps": k} for cid, why, k in want]


def test_a_trace_that_records_everything_has_nothing_unchecked(tmp_path) -> None:
    run, steps = base_run()
    path = str(tmp_path / "clean.db")
    roundtrip(path, run, steps)
    text = _cli("check", path)
    assert text.returncode == 0 and "not recorded" not in text.stdout
    assert json.loads(_cli("check", path, "--json").stdout) == {"violations": [], "not_recorded": []}
