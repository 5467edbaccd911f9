"""Crash safety and live reading with a real writer process: SIGKILL mid-run, and following a growing trace."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from specscope.tracer.store import TraceReader
from stepgen import make_step

HERE = os.path.dirname(os.path.abspath(__file__))


def _spawn(path: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, os.path.join(HERE, "writer_proc.py"), path, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=HERE,
    )


def _read_until(proc: subprocess.Popen[str], pred: object, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise AssertionError(f"writer exited early: {proc.stderr.read()}")  # type: ignore[union-attr]
        if pred(line.strip()):  # type: ignore[operator]
            return line.strip()
    raise AssertionError("writer did not report in time")


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_sigkill_leaves_every_committed_step_intact(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "killed.db")
    proc = _spawn(path, "--steps", "-1", "--flush-every", "7")
    try:
        line = _read_until(proc, lambda s: s.startswith("committed") and int(s.split()[1]) >= 120)
        committed = int(line.split()[1])
        proc.send_signal(signal.SIGKILL)  # mid-run: the writer is still appending
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    with TraceReader(path) as r:
        n = r.num_steps()
        assert n >= committed
        assert not r.is_closed()
        assert [h["index"] for h in r.step_headers()] == list(range(n))  # a dense prefix, no gaps
        for i, step in enumerate(r.steps()):
            assert step == make_step(i)
        assert r.step(n - 1) == make_step(n - 1)


def test_reader_follows_a_live_writer(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "live.db")
    total = 120
    proc = _spawn(path, "--steps", str(total), "--flush-every", "1", "--sleep", "0.01")
    try:
        _read_until(proc, lambda s: s == "ready")
        seen = 0
        growth = 0
        deadline = time.monotonic() + 60
        with TraceReader(path) as r:
            while seen < total and time.monotonic() < deadline:
                n = r.num_steps()
                if n > seen:
                    growth += 1
                    for step in r.steps(seen, n):
                        assert step == make_step(step.index)
                    assert r.step(n - 1) == make_step(n - 1)
                    seen = n
                time.sleep(0.02)
            assert seen == total
            assert growth >= 3  # it really grew while we watched
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    with TraceReader(path) as r:
        assert r.is_closed()
        assert r.num_steps() == total
        assert len(r.requests()) == 1
