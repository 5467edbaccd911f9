"""The streaming checker beside the writer: it follows a live trace, writes the catalogue's verdicts (source
"check") in batches with `checked_through`, and `LiveCheck.finish()` (after the writer closed) waits for the last."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from specscope.tracer.checks import check_steps
from specscope.tracer.errors import TraceError
from specscope.tracer.live_check import LiveCheck, follow
from specscope.tracer.process_writer import ProcessTraceWriter
from specscope.tracer.schema import Severity
from specscope.tracer.store import TraceReader, TraceWriter
from specscope.ui.cmd_upgrade import upgrade_trace

HERE = os.path.dirname(os.path.abspath(__file__))
FAULTY = os.path.join(HERE, "..", "data", "v1", "cpu-fault-stale-page-table.db")
CLEAN = os.path.join(HERE, "..", "data", "v1", "cpu-default.db")


def _expected(path: str) -> list:
    """The catalogue's verdicts over a trace's steps, less the ones the recorder attached."""
    with TraceReader(path) as r:
        steps = list(r.steps())
    attached = {v for s in steps for v in s.violations}
    return [v for v in check_steps(steps) if v not in attached]


def _key(v: object) -> tuple:
    return (v.step, v.check_id, v.request_id, v.message)  # type: ignore[attr-defined]


def test_live_check_beside_a_process_writer_checks_as_it_records(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "live.db")
    with TraceReader(FAULTY) as src:
        w = ProcessTraceWriter(path, src.run)
        lc = LiveCheck(path)  # what a session does once its writer has created the trace
        for step in src.steps():
            w.write_step(step)
        for rec in src.requests():
            w.write_request(rec)
    w.close()
    assert lc.result is None  # the writer knows nothing of the checker
    lc.finish()  # returns once the checker has checked the last step
    lc.finish()  # a second call does nothing
    want = _expected(FAULTY)
    assert want, "the fixture's fault must be caught"
    with TraceReader(path) as r:
        n = r.num_steps()
        assert r.checked_through() == n - 1
        got = r.violations(source="check")
        assert sorted(map(_key, got)) == sorted(map(_key, want))
        errors = sum(v.severity == Severity.ERROR for v in got)
        first = min(v.step for v in want if v.severity == Severity.ERROR)
        assert r.summary(first).num_errors >= 1 and r.find_steps("error") == [first]
    assert lc.result is not None
    assert (lc.result.checked_through, lc.result.num_errors) == (n - 1, errors)
    assert not os.path.exists(path + "-wal")  # settled into one file once the checker was done


def test_a_checker_that_fails_says_so_in_its_own_words(tmp_path: os.PathLike[str]) -> None:
    lc = LiveCheck(os.path.join(tmp_path, "none.db"))  # no trace to follow
    with pytest.raises(TraceError, match="the trace checker exited with status 2.*no such file"):
        lc.finish()
    assert lc.result is None


def test_clean_trace_gets_checked_through_and_no_verdicts(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "clean.db")
    upgrade_trace(CLEAN, path, check=False)
    with TraceReader(path) as r:
        assert r.checked_through() is None
    lc = follow(path, None)
    with TraceReader(path) as r:
        assert r.checked_through() == r.num_steps() - 1 == lc.done
        assert r.violations(source="check") == [] == _expected(path)


def test_rerun_replaces_earlier_check_verdicts(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "again.db")
    upgrade_trace(FAULTY, path, check=False)
    out = [subprocess.run([sys.executable, "-m", "specscope.tracer.live_check", path], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL) for _ in range(2)]  # fmt: skip
    assert [o.returncode for o in out] == [0, 0]
    done, errors, warnings = (int(x) for x in out[1].stdout.split()[1:])
    with TraceReader(path) as r:
        got = r.violations(source="check")
        assert len(got) == len(_expected(path)) == errors + warnings  # not doubled by the second run
        assert done == r.num_steps() - 1


def test_live_checker_refuses_what_it_cannot_check(tmp_path: os.PathLike[str]) -> None:
    out = subprocess.run([sys.executable, "-m", "specscope.tracer.live_check", CLEAN], capture_output=True,
                         text=True, timeout=60, stdin=subprocess.DEVNULL)  # fmt: skip
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "specscope upgrade" in out.stderr
    missing = os.path.join(tmp_path, "none.db")
    out = subprocess.run([sys.executable, "-m", "specscope.tracer.live_check", missing], capture_output=True,
                         text=True, timeout=60, stdin=subprocess.DEVNULL)  # fmt: skip
    assert out.returncode == 2 and out.stderr.startswith("specscope: error:") and "no such file" in out.stderr


def test_checker_does_not_slow_a_live_writer_down_to_a_stall(tmp_path: os.PathLike[str]) -> None:
    # The checker's transactions are short: a writer committing every step never hits a busy timeout.
    pytest.importorskip("numpy")
    path = os.path.join(tmp_path, "busy.db")
    with TraceReader(FAULTY) as src:
        steps = list(src.steps())
        run = src.run
    w = TraceWriter(path, run)
    proc = subprocess.Popen([sys.executable, "-m", "specscope.tracer.live_check", path], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    for s in steps:
        w.write_step(s)
        w.flush()
    w.close()
    out, err = proc.communicate("", timeout=120)
    assert proc.returncode == 0, err
    with TraceReader(path) as r:
        assert r.checked_through() == len(steps) - 1
