"""The writer's background sender (what the GPU recorder uses): the same file as synchronous sends, errors of the
child and its death still reach the caller as one TraceError, and nothing hangs."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest
from specscope.tracer.errors import TraceError
from specscope.tracer.process_writer import ProcessTraceWriter, raw_from_step
from specscope.tracer.store import TraceReader
from stepgen import make_request, make_run, make_step

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and pipes")


def _writer(path: str, limit: int = 256 << 20) -> ProcessTraceWriter:
    w = ProcessTraceWriter(path, make_run())
    w.send_in_background(limit)
    return w


@pytest.mark.parametrize("limit", [256 << 20, 1], ids=["queue", "limit-1-byte"])
def test_background_round_trip(tmp_path, limit: int) -> None:
    path = os.path.join(tmp_path, "bg.db")
    w = _writer(path, limit)
    for i in range(20):
        w.write_step(make_step(i))
    w.write_raw_steps([raw_from_step(make_step(i)) for i in range(20, 60)])
    w.flush()
    with TraceReader(path) as r:
        assert r.num_steps() == 60  # flush returned: everything queued before it is committed
    w.write_request(make_request(1))
    w.close()
    with TraceReader(path) as r:
        assert r.is_closed() and [r.step(i) for i in range(60)] == [make_step(i) for i in range(60)]
        assert r.requests() == [make_request(1)]


def test_background_child_error_in_its_own_words(tmp_path) -> None:
    w = _writer(os.path.join(tmp_path, "dup.db"))
    w.write_step(make_step(0))
    w.write_step(make_step(0))
    with pytest.raises(TraceError, match="step index 0 was written twice"):
        w.flush()
    with pytest.raises(TraceError, match="written twice"):
        w.close()


def test_background_killed_child_is_named_and_nothing_hangs(tmp_path) -> None:
    path = os.path.join(tmp_path, "killed.db")
    w = _writer(path)
    for i in range(10):
        w.write_step(make_step(i))
    w.flush()
    os.kill(w._proc.pid, signal.SIGKILL)
    w._proc.wait(timeout=10)
    t = time.monotonic()
    with pytest.raises(TraceError, match="killed by SIGKILL"):
        for i in range(10, 10_000):  # queued; the sender finds the broken pipe
            w.write_step(make_step(i))
        w.flush()
    with pytest.raises(TraceError, match="killed by SIGKILL"):
        w.close()
    assert time.monotonic() - t < 30
    with TraceReader(path) as r:
        assert [s.index for s in r.steps()] == list(range(10))
