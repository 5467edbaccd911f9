"""The writer's background sender (what the GPU recorder uses) makes the same file as synchronous sends, also when
its queue limit makes every send wait (test_store_process.py runs the error and death tests in both modes)."""

from __future__ import annotations

import os
import sys

import pytest
from specscope.tracer.pipe_format import raw_from_step
from specscope.tracer.process_writer import ProcessTraceWriter
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


def test_messages_larger_than_the_pipe_keep_their_order(tmp_path) -> None:
    """A batch bigger than the pipe goes in partly at once and the rest through the sender thread; what is sent
    after it queues behind it, and single steps between batches keep their places."""
    path = os.path.join(tmp_path, "big.db")
    w = _writer(path)
    i = 0
    for _ in range(3):
        w.write_raw_steps([raw_from_step(make_step(j)) for j in range(i, i + 600)])  # ~4 MB: over the 1 MiB pipe
        i += 600
        w.write_step(make_step(i))
        i += 1
    assert w.backlogged >= 1  # the thread's path ran
    w.close()
    with TraceReader(path) as r:
        assert r.is_closed() and r.num_steps() == i
        assert [r.step(j) for j in (0, 599, 600, 601, 1201, i - 1)] == [make_step(j) for j in (0, 599, 600, 601, 1201,
                                                                                                 i - 1)]
