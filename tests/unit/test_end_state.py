"""How a run ended, as the trace records it (`meta.end_state`) and `specscope info` shows it: a clean close,
Ctrl-C, the engine process killed, a sticky CUDA error, another exception, a viewer's stop, and older traces
without the record."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from specscope.tracer.checks import check_steps
from specscope.tracer.process_writer import ProcessTraceWriter
from specscope.tracer.schema import SCHEMA_VERSION, EndState
from specscope.tracer.store import TraceReader, TraceWriter
from stepgen import child_env, make_run, make_step

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = Path(HERE).parents[1]
CLI = [sys.executable, "-m", "specscope.ui.cli"]
SMALL = ["--device", "cpu", "--requests", "4", "--batch-size", "2", "--max-new-tokens", "12", "--quiet"]
LONG = ["--device", "cpu", "--requests", "64", "--batch-size", "4", "--max-new-tokens", "64", "--quiet"]
# Raises what a GPU kernel's fault raises, at the kernel boundary (the reference kernels are what a CPU run calls),
# then runs the real CLI: the engine, recorder, session, writer and the CLI's exit path are all the product's own.
FAILING_KERNEL = textwrap.dedent("""
    import sys
    from specscope.backend import reference_attention as ra
    calls, after, kind = [0], int(sys.argv[1]), sys.argv[2]
    decode = ra.ReferenceKernels.decode
    def failing(self, *a, **k):
        calls[0] += 1
        if calls[0] > after:
            if kind == "cuda":
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            raise ValueError("the kernel rejected its arguments")
        return decode(self, *a, **k)
    ra.ReferenceKernels.decode = failing
    from specscope.ui.cli import main
    sys.exit(main(sys.argv[3:]))
""")


def _info(path: str) -> dict[str, Any]:
    out = subprocess.run([*CLI, "info", "--json", path], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _info_text(path: str) -> str:
    out = subprocess.run([*CLI, "info", path], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _committed(path: str) -> int:
    try:
        with TraceReader(path) as r:
            return r.num_steps()
    except Exception:  # noqa: BLE001 - the file may be mid-creation
        return 0


def _run_until(path: str, steps: int) -> subprocess.Popen[str]:
    """A long `specscope run` on the CPU, returned once it has committed `steps` steps."""
    proc = subprocess.Popen([*CLI, "run", *LONG, "-o", path], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.time() + 180
    while time.time() < deadline and _committed(path) < steps and proc.poll() is None:
        time.sleep(0.2)
    if _committed(path) < steps:
        proc.kill()
        raise AssertionError(f"the run did not get far enough: {proc.communicate()[1]}")
    return proc


def _wait_closed(path: str, timeout: float = 60.0) -> None:
    """Wait for the writer process to close the trace (it outlives a killed engine by a moment)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        with TraceReader(path) as r:
            if r.is_closed():
                return
        time.sleep(0.1)
    raise AssertionError("the writer process did not close the trace")


def _steps_dense_and_clean(path: str) -> int:
    """The committed steps form a dense prefix that checks clean; returns how many there are."""
    with TraceReader(path) as r:
        steps = list(r.steps())
        vs = list(check_steps(steps, r.run))
    assert [s.index for s in steps] == list(range(len(steps)))
    assert vs == [], vs[:3]
    return len(steps)


def test_a_clean_run_says_closed(tmp_path: Path) -> None:
    path = str(tmp_path / "clean.db")
    res = subprocess.run([*CLI, "run", *SMALL, "-o", path], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    d = _info(path)
    n = d["steps"]
    assert d["is_closed"] and d["end_state"]["state"] == "closed" and d["end_state"]["recorded"]
    assert (d["end_state"]["step"], d["end_state"]["lost_in_flight"]) == (n - 1, 0)
    text = _info_text(path)
    assert ", closed)" in text.splitlines()[0]
    assert f"end      closed after step {n - 1}; no step in flight was lost" in text


@pytest.mark.skipif(sys.platform == "win32", reason="signals")
def test_ctrl_c_says_interrupted_at_the_last_committed_step(tmp_path: Path) -> None:
    """SIGINT once steps are committed: exit 130, and the trace says it was interrupted at its last committed step,
    with the number of steps the recorder had begun that never reached it."""
    path = str(tmp_path / "sigint.db")
    proc = _run_until(path, 40)
    os.kill(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    n = _steps_dense_and_clean(path)
    end = _info(path)["end_state"]
    assert (end["state"], end["step"], end["detail"]) == ("interrupted", n - 1, "SIGINT")
    assert isinstance(end["lost_in_flight"], int) and 0 <= end["lost_in_flight"] <= 16
    assert end["label"] == f"interrupted (SIGINT) at step {n - 1}"
    assert f"(schema {SCHEMA_VERSION}, interrupted (SIGINT) at step {n - 1})" in _info_text(path).splitlines()[0]
    # A bug report cut from it says how the run it came from ended.
    zp = str(tmp_path / "sigint.zip")
    out = subprocess.run([*CLI, "export", path, "--bundle", zp, "--steps", "10:20"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    bend = _info(zp)["end_state"]
    assert (bend["state"], bend["step"], bend["label"]) == ("interrupted", n - 1, end["label"])


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_a_killed_engine_says_the_engine_process_ended(tmp_path: Path) -> None:
    """SIGKILL of the engine: its writer process sees the pipe end without a close frame and records that; nobody
    is left who knows how many steps were in flight."""
    path = str(tmp_path / "sigkill.db")
    proc = _run_until(path, 40)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    _wait_closed(path)
    n = _steps_dense_and_clean(path)
    end = _info(path)["end_state"]
    assert (end["state"], end["step"], end["lost_in_flight"]) == ("engine_ended", n - 1, None)
    assert end["label"] == "interrupted (the engine process ended)"
    assert "the steps it had in flight are unknown" in end["description"]


@pytest.mark.parametrize("kind", ["cuda", "other"])
def test_a_run_that_fails_says_what_ended_it_and_where(tmp_path: Path, kind: str) -> None:
    """A kernel that raises a sticky CUDA error (what a device fault looks like to the engine) ends the run through
    the CLI's real path: the trace says "ended by a CUDA error at step N", N the step carrying the fatal error.
    Any other exception is "ended by an error (its type)"."""
    path = str(tmp_path / f"{kind}.db")
    res = subprocess.run([sys.executable, "-c", FAILING_KERNEL, "60", kind, "run", *SMALL, "-o", path],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    with TraceReader(path) as r:
        steps = list(r.steps())
    carrying = [s.index for s in steps if s.errors]
    end = _info(path)["end_state"]
    assert end["step"] == steps[-1].index and end["error_step"] == carrying[-1]
    assert isinstance(end["lost_in_flight"], int) and end["lost_in_flight"] >= 0
    if kind == "cuda":
        assert [e.fatal for e in steps[carrying[-1]].errors] == [True]
        assert end["state"] == "cuda_error" and "illegal memory access" in end["detail"]
        assert end["label"] == f"ended by a CUDA error at step {carrying[-1]}"
    else:
        assert end["state"] == "error" and end["detail"] == "ValueError: the kernel rejected its arguments"
        assert end["label"] == f"ended by an error (ValueError) at step {carrying[-1]}"
    assert end["label"] in _info_text(path).splitlines()[0]


def test_a_viewer_stop_is_recorded_as_a_stop(tmp_path: Path) -> None:
    """The live viewer stops the run (RunStopped from its control point): a clean end of a run cut short."""
    pytest.importorskip("torch")
    from specscope.backend.control import RunStopped
    from specscope.backend.engine_config import EngineConfig
    from specscope.backend.session import run_session

    class StopAfter:
        """A control point that stops the run after step 30."""

        def after_step(self, index: int, iteration: int, flush: Any) -> None:
            if index >= 30:
                raise RunStopped(f"stopped by the viewer after step {index}")

        def close(self) -> None:
            pass

    path = str(tmp_path / "stopped.db")
    cfg = EngineConfig(device="cpu", num_requests=4, batch_size=2, max_new_tokens=12)
    run_session(cfg, path, command="pytest stop", control=StopAfter(), check=False)  # type: ignore[arg-type]
    with TraceReader(path) as r:
        end, n = r.end_state(), r.num_steps()
    assert (end.state, end.step, end.clean) == ("stopped", n - 1, True)
    assert end.detail.startswith("stopped by the viewer after step")
    assert end.label == f"stopped on request at step {n - 1}"


def test_the_writer_process_records_a_pipe_that_ends_without_a_close(tmp_path: Path) -> None:
    """A parent that dies without closing (os._exit): its writer child commits what arrived and records the end;
    an end record the parent sent first is kept."""
    for told in (False, True):
        path = str(tmp_path / f"orphan-{told}.db")
        script = textwrap.dedent(f"""
            import os
            from specscope.tracer.process_writer import ProcessTraceWriter
            from stepgen import make_run, make_step
            w = ProcessTraceWriter({path!r}, make_run())
            for i in range(25):
                w.write_step(make_step(i))
            if {told!r}:
                w.set_end("interrupted", lost_in_flight=2, detail="SIGINT")
            os._exit(0)
        """)
        subprocess.run([sys.executable, "-c", script], check=True, timeout=60, env=child_env())
        _wait_closed(path)
        with TraceReader(path) as r:
            end = r.end_state()
        want = ("interrupted", 24, 2) if told else ("engine_ended", 24, None)
        assert (end.state, end.step, end.lost_in_flight) == want


def test_a_writer_closed_without_being_told_records_closed(tmp_path: Path) -> None:
    """Writers other than the engine's (SGLang's hook, tests) record a plain close; the copy of a trace keeps the
    end record of the run it copies, step numbers and all."""
    path = str(tmp_path / "plain.db")
    with TraceWriter(path, make_run()) as w:
        for i in range(5):
            w.write_step(make_step(i))
    with TraceReader(path) as r:
        assert r.end_state() == EndState("closed", 4, None)
    before = signal.getsignal(signal.SIGINT)
    w = ProcessTraceWriter(str(tmp_path / "empty.db"), make_run())
    w.close()
    assert signal.getsignal(signal.SIGINT) is before  # the writer's Ctrl-C guard is gone with it
    with TraceReader(str(tmp_path / "empty.db")) as r:
        assert r.end_state() == EndState("closed", None, None)
    copy = str(tmp_path / "copy.db")
    with TraceWriter(copy, make_run()) as w:
        w.write_step(make_step(0))
        w.copy_end(EndState("interrupted", 317, 3, "SIGINT"))
    with TraceReader(copy) as r:
        assert r.end_state() == EndState("interrupted", 317, 3, "SIGINT")
    with pytest.raises(ValueError, match="unknown end state"):
        TraceWriter(str(tmp_path / "bad.db"), make_run(), threaded=False).set_end("unclosed", lost_in_flight=0)


def test_traces_without_the_record_read_as_before(tmp_path: Path) -> None:
    """A trace written before the end record: "closed" when `closed_ns` is there (as it always read), flagged as
    not recorded; "not closed" without it; a damaged record reads as "unknown", never as a clean close."""
    path = str(tmp_path / "old.db")
    with TraceWriter(path, make_run()) as w:
        for i in range(3):
            w.write_step(make_step(i))
    conn = sqlite3.connect(path)
    conn.execute("DELETE FROM meta WHERE key = 'end_state'")
    conn.commit()
    with TraceReader(path) as r:
        assert r.end_state() == EndState("closed", 2, None, recorded=False)
    d = _info(path)
    assert d["end_state"]["state"] == "closed" and d["end_state"]["recorded"] is False
    assert ", closed)" in _info_text(path).splitlines()[0]
    conn.execute("DELETE FROM meta WHERE key = 'closed_ns'")
    conn.commit()
    with TraceReader(path) as r:
        end = r.end_state()
    assert (end.state, end.step, end.clean) == ("unclosed", 2, False)
    assert end.label == "not closed (live, or its writer was killed)"
    conn.execute("INSERT INTO meta (key, value) VALUES ('end_state', '{not json')")
    conn.commit()
    conn.close()
    with TraceReader(path) as r:
        end = r.end_state()
    assert (end.state, end.clean) == ("unknown", False)
    sample = ROOT / "samples" / "traces" / "cpu-default.db"
    if sample.exists():
        with TraceReader(str(sample)) as r:
            meta = r.meta()
            end = r.end_state()
        if "end_state" not in meta:
            assert end.state == ("closed" if "closed_ns" in meta else "unclosed") and not end.recorded


CTRL_C_WRITER = textwrap.dedent("""
    import dataclasses, sys
    import numpy as np
    from specscope.tracer.process_writer import ProcessTraceWriter
    from specscope.tracer.schema import ArraySnapshot
    from stepgen import make_run, make_step
    w = ProcessTraceWriter(sys.argv[1], make_run(), status_timeout=20)
    big = np.random.default_rng(0).integers(0, 1 << 30, 1 << 18, dtype=np.int64)  # 2 MiB a step: the pipe fills
    print("ready", flush=True)
    i = 0
    try:
        while True:
            s = make_step(i)
            extra = (ArraySnapshot("big", "int64", big.shape, 0, big + i),)
            w.write_step(dataclasses.replace(s, arrays=s.arrays + extra))
            i += 1
    except KeyboardInterrupt:
        w.set_end("interrupted", lost_in_flight=0, detail="SIGINT")
    w.close()
    print("closed", flush=True)
""")


@pytest.mark.skipif(sys.platform == "win32", reason="signals")
@pytest.mark.parametrize("delay", [0.4, 0.7, 1.0, 1.3])
def test_ctrl_c_while_the_pipe_is_full_leaves_no_torn_message(tmp_path: Path, delay: float) -> None:
    """Ctrl-C lands while the engine's thread is blocked writing a large message into a full pipe: the message
    still goes whole (the writer holds the KeyboardInterrupt back until it has), so the end record and the close
    frame that follow are read as themselves and the trace closes as interrupted. A torn message made the close
    wait for its status deadline and left the trace without an end."""
    path = str(tmp_path / "full-pipe.db")
    proc = subprocess.Popen([sys.executable, "-c", CTRL_C_WRITER, path], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_env())
    try:
        assert proc.stdout.readline().strip() == "ready"  # type: ignore[union-attr]
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and out.strip().endswith("closed"), err
    with TraceReader(path) as r:
        end, n = r.end_state(), r.num_steps()
        assert [s.index for s in r.steps(max(0, n - 2), n)] == list(range(max(0, n - 2), n))
    assert (end.state, end.step) == ("interrupted", n - 1) and n > 0
