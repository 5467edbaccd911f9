"""`specscope upgrade`: a schema 1 trace rewritten as schema 2 keeps every record, answers every query as the
schema 1 fallback does, and carries the catalogue's verdicts."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys

import pytest
from specscope.tracer.query import StepFilter
from specscope.tracer.schema import SCHEMA_VERSION
from specscope.tracer.store import TraceReader
from specscope.ui.cmd_upgrade import upgrade_trace

HERE = os.path.dirname(os.path.abspath(__file__))
V1 = [os.path.join(HERE, "..", "data", "v1", n) for n in ("cpu-default.db", "cpu-fault-stale-page-table.db")]


@pytest.mark.parametrize("old", V1)
def test_round_trip_keeps_every_record_and_query(old: str, tmp_path: os.PathLike[str]) -> None:
    new = os.path.join(tmp_path, "new.db")
    counts = upgrade_trace(old, new, check=False)
    with TraceReader(old) as a, TraceReader(new) as b:
        assert a.major == 1 and b.major == 2 and b.schema_version == SCHEMA_VERSION
        assert a.run == b.run and a.requests() == b.requests() and counts["steps"] == a.num_steps() == b.num_steps()
        assert list(a.steps()) == list(b.steps())
        assert a.violations() == b.violations()
        assert a.summaries() == b.summaries()
        n = a.num_steps()
        rids = sorted({q.request_id for s in a.steps() for q in s.requests})
        for rid in rids:
            assert a.request_history(rid) == b.request_history(rid)
            assert a.find_steps(StepFilter(request_id=rid), limit=None) == b.find_steps(f"request {rid}", limit=None)
        key = lambda s: (s.start_ns, s.step, s.stream, s.name)  # noqa: E731
        assert sorted(a.spans(), key=key) == sorted(b.spans(), key=key)
        assert sorted(a.spans(steps=(n // 3, n // 2)), key=key) == sorted(b.spans(steps=(n // 3, n // 2)), key=key)
        assert [a.capture_of(i) for i in range(n)] == [b.capture_of(i) for i in range(n)]
        assert a.fault_report() == b.fault_report()
    with sqlite3.connect(new) as c:
        tables = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert {"spans", "step_requests", "request_life", "fault_firings", "zdicts"} <= tables
        assert c.execute("SELECT count(*) FROM spans").fetchone()[0] > 0


def test_upgrade_writes_the_catalogues_verdicts(tmp_path: os.PathLike[str]) -> None:
    new = os.path.join(tmp_path, "checked.db")
    c = upgrade_trace(V1[1], new)
    with TraceReader(new) as r:
        assert r.checked_through() == r.num_steps() - 1 == c["checked_through"]
        got = r.violations(source="check")
        assert c["check_errors"] > 0 and len(got) == c["check_errors"] + c["check_warnings"]
        assert r.find_steps("error") == [min(v.step for v in got if v.severity.value == "error")]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "specscope.ui.cli", "upgrade", *args], capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def test_cli(tmp_path: os.PathLike[str]) -> None:
    new = os.path.join(tmp_path, "cli.db")
    out = _cli(V1[0], new)
    assert out.returncode == 0 and out.stdout.count("\n") == 1 and "schema 2" in out.stdout, out.stderr
    for args, msg in [((V1[0], new), "already exists"), ((new, new + "2"), "already schema 2"),
                      ((os.path.join(tmp_path, "nope.db"), new + "3"), "no such file"),
                      ((V1[0], V1[0]), "same file")]:  # fmt: skip
        out = _cli(*args)
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and msg in out.stderr, (args, out.stderr)
        assert out.stderr.startswith("specscope: error:")
    assert _cli(V1[0], new, "--overwrite", "--no-check").returncode == 0
    with TraceReader(new) as r:
        assert r.checked_through() is None
