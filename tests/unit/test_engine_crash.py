"""A `specscope run` killed with SIGKILL mid-run leaves a trace whose every committed step reads back intact."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")

from specscope.tracer.checks import check_steps  # noqa: E402
from specscope.tracer.store import TraceReader  # noqa: E402


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_sigkill_during_run_keeps_committed_steps(tmp_path) -> None:
    path = str(tmp_path / "killed.db")
    proc = subprocess.Popen([sys.executable, "-m", "specscope.ui.cli", "run", "--device", "cpu", "--requests", "64",
                             "--batch-size", "4", "--max-new-tokens", "64", "--quiet", "-o", path],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    seen = 0
    while time.time() < deadline and seen < 40:  # wait until the engine has committed some steps
        time.sleep(0.5)
        if os.path.exists(path):
            try:
                with TraceReader(path) as r:
                    seen = r.num_steps()
            except Exception:  # noqa: BLE001 - the file may be mid-creation
                seen = 0
    assert seen >= 40, "the run did not get far enough to test a kill"
    writers = [pid for pid, _ in _children(proc.pid)] if os.path.isdir("/proc") else []
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    # The writer process sees end-of-input, commits what it received and exits: wait for that, not the clock.
    deadline = time.time() + 120
    while time.time() < deadline and any(os.path.exists(f"/proc/{pid}") and not _zombie(pid) for pid in writers):
        time.sleep(0.05)
    if not writers:
        time.sleep(2.0)  # no /proc to watch the writer by
    with TraceReader(path) as r:
        n = r.num_steps()
        steps = list(r.steps())
    assert n >= seen and len(steps) == n
    assert [s.index for s in steps] == list(range(n))
    assert list(check_steps(steps)) == []  # every committed step is whole and consistent


def _zombie(pid: int) -> bool:
    """Whether process `pid` has exited and waits to be reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _children(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the processes whose parent is `pid` (Linux /proc)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid:
            out.append((int(d), cmd))
    return out


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the writer child through /proc")
def test_killed_writer_child_ends_the_run_with_one_line(tmp_path) -> None:
    """The writer child dies mid-run: the engine stops with one line naming it, and every step the writer had
    committed reads back and checks clean."""
    path = str(tmp_path / "writer-killed.db")
    proc = subprocess.Popen([sys.executable, "-m", "specscope.ui.cli", "run", "--device", "cpu", "--requests", "64",
                             "--batch-size", "4", "--max-new-tokens", "64", "--quiet", "-o", path],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline, seen = time.time() + 120, 0
        while time.time() < deadline and seen < 30:
            time.sleep(0.5)
            try:
                with TraceReader(path) as r:
                    seen = r.num_steps()
            except Exception:  # noqa: BLE001 - the file may be mid-creation
                seen = 0
        assert seen >= 30, "the run did not get far enough"
        writers = [p for p, cmd in _children(proc.pid) if "process_writer" in cmd]
        assert len(writers) == 1, _children(proc.pid)
        os.kill(writers[0], signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specscope: error:") and "writer" in lines[0], err
    assert "Traceback" not in err
    with TraceReader(path) as r:
        steps = list(r.steps())
    assert len(steps) >= seen and [s.index for s in steps] == list(range(len(steps)))
    assert list(check_steps(steps)) == []


def _close_failing(rec, msg: str) -> None:
    """Close `rec` while a sticky CUDA error (`msg`, a RuntimeError) propagates, as the engine's `finally` does."""
    with pytest.raises(RuntimeError, match="illegal memory access"):
        try:
            raise RuntimeError(msg)
        finally:
            rec.close()


def test_sticky_device_error_writes_every_held_step_and_marks_the_one_it_hit(tmp_path) -> None:
    """The close path after a sticky CUDA error (its message is all that tells one apart), on the CPU: the
    pending step and the launched-but-unfinished step are written from host data, the latter with the error
    verbatim as a fatal call error; a step begun but never launched is left out."""
    import torch
    from specscope.tracer.process_writer import ProcessTraceWriter
    from specscope.tracer.recorder import Recorder
    from specscope.tracer.schema import ForwardMode, GraphPhase
    from stepgen import make_run

    path = str(tmp_path / "sticky.db")
    rec = Recorder(ProcessTraceWriter(path, make_run()), torch.device("cpu"))
    kw = dict(model="target", step_id=None, batch_size=1, padded_batch_size=1, graph=GraphPhase.EAGER,
              tokens_per_request=4, num_draft_tokens=4, page_size=16)
    msg = "CUDA error: an illegal memory access was encountered\nCompile with `TORCH_USE_CUDA_DSA` to enable ..."
    done = rec.begin_step(iteration=0, mode=ForwardMode.DRAFT_DECODE, **kw)
    rec.snapshot_host(done, "seq_lens_cpu", torch.tensor([5], dtype=torch.int32))
    rec.end_step(done)
    hit = rec.begin_step(iteration=0, mode=ForwardMode.TARGET_VERIFY, **kw)
    rec.begin_step(iteration=0, mode=ForwardMode.DRAFT_EXTEND, **kw)  # prepared, never launched
    rec.assign_index(hit)  # launched
    rec.fired(hit, ["wild-page-id"])
    _close_failing(rec, msg)
    with TraceReader(path) as r:
        steps = list(r.steps())
        assert [(s.index, s.mode) for s in steps] == [(0, ForwardMode.DRAFT_DECODE), (1, ForwardMode.TARGET_VERIFY)]
        assert steps[0].errors == () and steps[0].array("seq_lens_cpu").values.tolist() == [5]
        (err,) = steps[1].errors
        assert (err.call, err.error_type, err.message, err.fatal) == ("cuda", "RuntimeError", msg, True)
        assert steps[1].faults_fired == ("wild-page-id",)
        vs = list(check_steps(steps, r.run))
    assert [(v.check_id, v.step) for v in vs] == [("K1", 1)] and "fatal" in vs[0].message


def test_a_step_ended_after_the_one_the_error_hit_is_not_marked(tmp_path) -> None:
    """`end_step` queues its step at the next poll; a sticky error before that poll must still tell the ended step
    (launched later, finished) from the launched-but-unfinished one the error hit."""
    import torch
    from specscope.tracer.process_writer import ProcessTraceWriter
    from specscope.tracer.recorder import Recorder
    from specscope.tracer.schema import ForwardMode, GraphPhase
    from stepgen import make_run

    path = str(tmp_path / "ended.db")
    rec = Recorder(ProcessTraceWriter(path, make_run()), torch.device("cpu"))
    kw = dict(model="draft", step_id=None, batch_size=1, padded_batch_size=1, graph=GraphPhase.EAGER,
              tokens_per_request=4, num_draft_tokens=4, page_size=16)
    hit = rec.begin_step(iteration=0, mode=ForwardMode.DRAFT_EXTEND, **kw)
    rec.assign_index(hit)  # launched first, never finished
    done = rec.begin_step(iteration=0, mode=ForwardMode.DRAFT_DECODE, **kw)
    rec.assign_index(done)
    rec.end_step(done)  # launched after it and ended; no poll since
    _close_failing(rec, "CUDA error: an illegal memory access was encountered")
    with TraceReader(path) as r:
        steps = {s.index: s for s in r.steps()}
    assert sorted(steps) == [0, 1]
    assert [e.fatal for e in steps[0].errors] == [True] and steps[1].errors == ()
