"""The writer child process: errors in its own words, deaths reported (never "process died" alone), no status
call that waits forever, a child that loses its parent commits what arrived, and a killed writer child
during a real `specscope run` ends the run with one line and a readable trace."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from specscope.tracer.errors import TraceError
from specscope.tracer.pipe_format import parts_from_raw, raw_from_step, step_from_raw
from specscope.tracer.process_writer import ProcessTraceWriter
from specscope.tracer.schema import CallError, StreamWait
from specscope.tracer.store import TraceReader
from stepgen import child_env, make_request, make_run, make_step

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and pipes")


def _v2_step(i: int):  # noqa: ANN202 - a Step
    import dataclasses

    return dataclasses.replace(
        make_step(i), waits=(StreamWait("plan", "compute", "producers"),),
        errors=(CallError("kernel:xqa", "RuntimeError", f"bad q_len at step {i}"),) if i % 3 == 0 else (),
        faults_fired=("stale-page-table",) if i % 4 == 1 else (),
    )  # fmt: skip


def test_raw_round_trip_keeps_v2_facts() -> None:
    for i in range(6):
        s = _v2_step(i)
        raw = raw_from_step(s)
        assert step_from_raw(raw) == s
        p = parts_from_raw(raw)
        assert p.num_requests == len(s.requests) and p.faults_fired == list(s.faults_fired)


def test_process_writer_round_trip(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "p.db")
    w = ProcessTraceWriter(path, make_run())
    for i in range(40):
        w.write_step(_v2_step(i))
        if i == 20:
            w.flush()
    w.write_request(make_request(1))
    w.close()
    w.close()  # twice is fine
    with TraceReader(path) as r:
        assert r.is_closed() and r.num_steps() == 40
        assert [r.step(i) for i in range(40)] == [_v2_step(i) for i in range(40)]
        assert r.requests() == [make_request(1)]
        assert r.checked_through() is None  # recorded without the checker


def test_batched_raw_steps_keep_every_array(tmp_path: os.PathLike[str]) -> None:
    """`write_raw_steps` sends a msgpack batch, arrays as bytes: the child stores the same steps, with every dtype and
    shape, as one step at a time does; a single step in the batch goes the same way."""
    path_a, path_b = os.path.join(tmp_path, "batched.db"), os.path.join(tmp_path, "single.db")
    steps = [_v2_step(i) for i in range(12)]
    a = ProcessTraceWriter(path_a, make_run())
    a.write_raw_steps([raw_from_step(s) for s in steps[:11]])
    a.write_raw_steps([raw_from_step(steps[11])])
    a.close()
    b = ProcessTraceWriter(path_b, make_run())
    for s in steps:
        b.write_step(s)
    b.close()
    assert any(arr.values.ndim == 2 for s in steps for arr in s.arrays)
    assert len({str(arr.values.dtype) for s in steps for arr in s.arrays}) > 1
    with TraceReader(path_a) as ra, TraceReader(path_b) as rb:
        assert ra.num_steps() == rb.num_steps() == 12
        assert [ra.step(i) for i in range(12)] == [rb.step(i) for i in range(12)] == steps


def test_a_step_the_wire_cannot_carry_fails_the_writer_after_the_steps_before_it(tmp_path: os.PathLike[str]) -> None:
    """An int beyond int64 or a non-numeric array is refused in the writer's own words; the steps before it, in the
    same batch too, are stored."""
    import numpy as np

    good = [raw_from_step(_v2_step(i)) for i in range(3)]
    huge = raw_from_step(make_step(4))
    huge["requests"]["request_id"] = [2**70] + huge["requests"]["request_id"][1:]
    obj = raw_from_step(make_step(4))
    obj["arrays"] = [("o", "object", (1,), 0, np.array([None]))]
    for bad, match in ((huge, "OverflowError"), (obj, "dtype object")):
        for single in (False, True):
            path = os.path.join(tmp_path, f"batch-{match.split()[0]}-{single}.db")
            w = ProcessTraceWriter(path, make_run())
            w.write_raw_steps(good)
            if single:
                w.write_raw_step(raw_from_step(_v2_step(3)))
                w.write_raw_step(bad)
            else:
                w.write_raw_steps([raw_from_step(_v2_step(3)), bad, raw_from_step(_v2_step(5))])
            with pytest.raises(TraceError, match=match):
                w.flush()
            with pytest.raises(TraceError):
                w.close()
            with TraceReader(path) as r:
                assert [r.step(i) for i in range(r.num_steps())] == [_v2_step(i) for i in range(4)]


def _writer(path: str, background: bool) -> ProcessTraceWriter:
    w = ProcessTraceWriter(path, make_run())
    if background:
        w.send_in_background()  # what the GPU recorder uses: a thread writes the pipe
    return w


@pytest.mark.parametrize("background", [False, True], ids=["sync", "background"])
def test_child_error_is_reported_in_its_own_words(tmp_path: os.PathLike[str], background: bool) -> None:
    path = os.path.join(tmp_path, "dup.db")
    w = _writer(path, background)
    w.write_step(make_step(0))
    w.write_step(make_step(0))
    with pytest.raises(TraceError, match="step index 0 was written twice"):
        w.flush()
    with pytest.raises(TraceError, match="written twice"):
        w.close()
    with TraceReader(path) as r:
        assert r.num_steps() == 1


def test_start_failure_says_why(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "exists.db")
    ProcessTraceWriter(path, make_run()).close()
    with pytest.raises(TraceError, match="already exists"):
        ProcessTraceWriter(path, make_run())


@pytest.mark.parametrize("background", [False, True], ids=["sync", "background"])
def test_killed_child_is_named_and_nothing_hangs(tmp_path: os.PathLike[str], background: bool) -> None:
    path = os.path.join(tmp_path, "killed.db")
    w = _writer(path, background)
    for i in range(10):
        w.write_step(make_step(i))
    w.flush()
    os.kill(w._proc.pid, signal.SIGKILL)
    w._proc.wait(timeout=10)
    t = time.monotonic()
    with pytest.raises(TraceError, match="killed by SIGKILL"):
        for i in range(10, 10_000):  # the pipe breaks on one of these writes
            w.write_step(make_step(i))
        w.flush()
    with pytest.raises(TraceError, match="killed by SIGKILL"):
        w.close()
    assert time.monotonic() - t < 30
    with TraceReader(path) as r:
        assert [s.index for s in r.steps()] == list(range(10))


def test_status_calls_time_out_with_a_clear_message(tmp_path: os.PathLike[str]) -> None:
    w = ProcessTraceWriter(os.path.join(tmp_path, "stopped.db"), make_run(), status_timeout=1.0)
    os.kill(w._proc.pid, signal.SIGSTOP)
    try:
        t = time.monotonic()
        with pytest.raises(TraceError, match=r"did not answer a flush within 1 s"):
            w.flush()
        assert time.monotonic() - t < 10
    finally:
        os.kill(w._proc.pid, signal.SIGCONT)
    w.close()


def test_orphaned_child_commits_what_arrived_and_exits(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "orphan.db")
    # A parent that sends steps without flushing and then dies abruptly (no close, no atexit).
    script = textwrap.dedent(f"""
        import os
        from specscope.tracer.process_writer import ProcessTraceWriter
        from stepgen import make_run, make_step
        w = ProcessTraceWriter({path!r}, make_run())
        for i in range(25):
            w.write_step(make_step(i))
        print(w._proc.pid, flush=True)
        os._exit(0)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=child_env())
    child = int(out.stdout.split()[0])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and os.path.exists(f"/proc/{child}"):
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{child}") or open(f"/proc/{child}/stat").read().split()[2] == "Z"
    with TraceReader(path) as r:
        assert r.is_closed()  # end of input: it committed everything and closed the trace cleanly
        assert [s.index for s in r.steps()] == list(range(25))


# Killing the writer child of a real `specscope run` is tested in test_engine_crash.py.


def test_frames_larger_than_the_childs_read_buffer(tmp_path: os.PathLike[str]) -> None:
    import dataclasses

    import numpy as np
    from specscope.tracer.schema import ArraySnapshot

    path = os.path.join(tmp_path, "big.db")
    big = np.random.default_rng(0).standard_normal((1200, 1100)).astype(np.float32)  # 5.3 MB > the 4 MiB buffer
    steps = [make_step(0), dataclasses.replace(make_step(1), arrays=make_step(1).arrays + (
        ArraySnapshot("attn_probe", "float32", big.shape, 0, big),)), make_step(2)]  # fmt: skip
    w = ProcessTraceWriter(path, make_run())
    for s in steps:
        w.write_step(s)
    w.close()
    with TraceReader(path) as r:
        assert [r.step(i) for i in range(3)] == steps
