"""Smoke test in a real terminal: `specscope tui` under tmux at 80x24, step with ], quit with q."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid

import pytest
from tui_fixtures import _at_root  # noqa: F401 - fixtures
from tui_samples import ROOT, sample

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


def _tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, timeout=20).stdout


def _wait_for(session: str, pred, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    screen = ""
    while time.monotonic() < deadline:
        screen = _tmux("capture-pane", "-p", "-t", session)
        if pred(screen):
            return screen
        time.sleep(0.2)
    raise AssertionError(f"timed out; the pane shows:\n{screen}")


def test_tui_in_tmux_steps_and_quits(tmp_path) -> None:
    session = f"specscope-{uuid.uuid4().hex[:8]}"
    done = os.path.join(tmp_path, "rc")
    exe = os.path.join(os.path.dirname(sys.executable), "specscope")
    cmd = f"cd {ROOT} && {exe} tui {sample('cpu-default')}; echo $? > {done}"
    env = {**os.environ, "TERM": "xterm-256color"}
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "80", "-y", "24", cmd], check=True, env=env,
                   timeout=20)
    try:
        screen = _wait_for(session, lambda s: "step 0/" in s and "cache_sl" in s)
        assert "requests" in screen and "seq before" in screen  # detail, request table and grid on 80x24
        for k in range(1, 4):  # each key once the last one is on screen: lone presses, one step each
            _tmux("send-keys", "-t", session, "]")
            _wait_for(session, lambda s, k=k: f"step {k}/" in s)
        _tmux("send-keys", "-t", session, "q")
        deadline = time.monotonic() + 30
        while not os.path.exists(done) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert os.path.exists(done), "q did not quit the TUI"
        with open(done) as f:
            assert f.read().strip() == "0"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True, timeout=20)


def test_demo_opens_the_live_tui_in_a_terminal(tmp_path) -> None:
    from specscope.tracer.store import TraceReader

    session = f"specscope-{uuid.uuid4().hex[:8]}"
    done = os.path.join(tmp_path, "rc")
    trace = os.path.join(tmp_path, "demo.db")
    exe = os.path.join(os.path.dirname(sys.executable), "specscope")
    cmd = (f"cd {tmp_path} && {exe} demo --device cpu --requests 2 --max-new-tokens 8 -o {trace}; "
           f"echo $? > {done}")
    env = {**os.environ, "TERM": "xterm-256color"}
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "100", "-y", "30", cmd], check=True, env=env,
                   timeout=20)
    try:
        # It opens paused at the first step, saying which keys drive it; space lets the run go on to its end.
        screen = _wait_for(session, lambda s: "PAUSED at 0" in s and "cache_sl" in s, timeout=120)
        assert "step 0/0" in screen and "requests" in screen
        assert "space run" in screen and "q quit" in screen
        _tmux("send-keys", "-t", session, "Space")
        _wait_for(session, lambda s: "run finished" in s, timeout=120)
        _tmux("send-keys", "-t", session, "q")
        deadline = time.monotonic() + 60
        while not os.path.exists(done) and time.monotonic() < deadline:
            time.sleep(0.2)
        with open(done) as f:
            assert f.read().strip() == "0"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True, timeout=20)
    with TraceReader(trace) as r:
        assert r.is_closed() and r.num_steps() > 0
