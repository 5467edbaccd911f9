"""Readers on several threads at once: each sees exactly what a single-threaded read sees.

The TUI and the dashboard read traces from worker threads, so readers of different traces decode their step
bodies and request rows at the same moment. Every trace here is recorded with `--record-attention 1`, so its
bodies are large (the attention call's q / k / v) and take long enough to decode that the threads overlap.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from specscope.tracer.store import TraceReader

# Three different workloads (seed and request count), small enough to record in seconds on a CPU.
RUNS = {"a": ["--seed", "0", "--requests", "3"], "b": ["--seed", "1", "--requests", "4"],
        "c": ["--seed", "2", "--requests", "5"]}  # fmt: skip
COMMON = ["--device", "cpu", "--batch-size", "2", "--max-new-tokens", "6", "--verify-tokens", "2",
          "--record-attention", "1", "--quiet"]  # fmt: skip
THREADS_PER_TRACE = 2  # two threads on every trace, each with a reader of its own
ROUNDS = 30  # full reads per thread; one zstd context shared by the process failed (or crashed) in a few


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Paths of the attention-sampled traces, recorded side by side."""
    folder = Path(tmp_path_factory.mktemp("reader-threads"))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # three runs on a small machine: one core each is plenty
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "specscope.ui.cli", "run", *COMMON, *extra, "-o", str(folder / f"{name}.db")],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        for name, extra in RUNS.items()
    }
    for name, p in procs.items():
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, f"run {name}: {err}"
    return [str(folder / f"{name}.db") for name in RUNS]


def fingerprint(reader: TraceReader) -> list[Any]:
    """Everything the reader decodes from compressed bytes, as comparable values (arrays by digest)."""
    out: list[Any] = []
    request_ids: set[int] = set()
    for st in reader.steps():
        arrays = [(a.name, a.dtype, a.shape, a.values.dtype.str, a.values.shape,
                   hashlib.blake2b(a.values.tobytes(), digest_size=16).digest()) for a in st.arrays]  # fmt: skip
        out.append((st.header_dict(), st.requests, st.spans, st.waits, st.errors, arrays))
        request_ids.update(r.request_id for r in st.requests)
    # Request histories decode the `step_requests` rows, the other compressed column a reader reads.
    out.extend(reader.request_history(rid) for rid in sorted(request_ids))
    return out


def read(path: str) -> list[Any]:
    """The fingerprint of one trace through a reader of its own."""
    with TraceReader(path) as r:
        return fingerprint(r)


def test_attention_traces_read_on_several_threads_match_a_single_threaded_read(traces: list[str]) -> None:
    """Two threads per trace, each with its own reader, read every trace over and over at the same time; every
    read equals the single-threaded one and none reports a valid trace as damaged."""
    expected = {p: read(p) for p in traces}
    for p, fp in expected.items():
        with TraceReader(p) as r:
            assert any(s.array("attn_q") is not None for s in r.steps()), f"{p} recorded no attention call"
        assert len(fp) > 20, p
    workers = [p for p in traces for _ in range(THREADS_PER_TRACE)]
    start = threading.Barrier(len(workers))  # every thread begins its first read together
    failures: list[str] = []
    lock = threading.Lock()

    def work(path: str) -> None:
        start.wait()
        for k in range(ROUNDS):
            try:
                got = read(path)
            except Exception as e:  # noqa: BLE001 - any failure is the finding; the message is reported below
                problem = f"{os.path.basename(path)} round {k}: {type(e).__name__}: {e}"
            else:
                if got == expected[path]:
                    continue
                problem = f"{os.path.basename(path)} round {k}: decoded differently from the single-threaded read"
            with lock:
                failures.append(problem)
            return

    threads = [threading.Thread(target=work, args=(p,), name=f"reader-{i}") for i, p in enumerate(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in threads), "a reader thread hung"
    assert not failures, "\n".join(failures)


def test_one_reader_shared_by_several_threads_matches_a_single_threaded_read(traces: list[str]) -> None:
    """Threads sharing one reader per trace (as a viewer's prefetch does) see the single-threaded steps too."""
    expected = {p: read(p) for p in traces}
    readers = {p: TraceReader(p) for p in traces}
    failures: list[str] = []
    lock = threading.Lock()
    workers = [p for p in traces for _ in range(THREADS_PER_TRACE)]
    start = threading.Barrier(len(workers))

    def work(path: str) -> None:
        start.wait()
        for k in range(ROUNDS // 4):
            try:
                ok = fingerprint(readers[path]) == expected[path]
                problem = "" if ok else "decoded differently from the single-threaded read"
            except Exception as e:  # noqa: BLE001 - any failure is the finding
                problem = f"{type(e).__name__}: {e}"
            if problem:
                with lock:
                    failures.append(f"{os.path.basename(path)} round {k}: {problem}")
                return

    try:
        threads = [threading.Thread(target=work, args=(p,)) for p in workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
        assert not any(t.is_alive() for t in threads), "a reader thread hung"
    finally:
        for r in readers.values():
            r.close()
    assert not failures, "\n".join(failures)
