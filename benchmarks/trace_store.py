"""Trace store benchmark: write throughput, bytes per step, random-step reads and the viewer queries.

Workload: a spec-decoding run at bs=64 with ~4k-token contexts (prompts 3500-4600 tokens) in 64-token
pages. Requests take contiguous page runs from a shared pool at prefill and single pages from a free
list as they grow; finished requests return their pages and new ones arrive, so page ids interleave
and fragment as in a real server. Every iteration records DRAFT_DECODE x3 (T=1), TARGET_VERIFY (T=4)
and DRAFT_EXTEND (T=accept length), plus an EXTEND step whenever new requests are prefilled; each step
carries the standard metadata arrays of docs/trace-format.md, 64 RequestStates and 2-3 stream spans.

    python benchmarks/trace_store.py --steps 100000 --out benchmarks/results/trace_store.json \
        --md benchmarks/results/trace_store.md
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import random
import shlex
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import zstandard
from specscope.tracer.live_check import LiveCheck
from specscope.tracer.pipe_format import raw_from_step
from specscope.tracer.process_writer import ProcessTraceWriter
from specscope.tracer.query import StepFilter
from specscope.tracer.schema import (
    ArraySnapshot,
    ForwardMode,
    GraphPhase,
    RequestState,
    RunInfo,
    Severity,
    Step,
    StreamSpan,
    Violation,
)
from specscope.tracer.store import TraceReader, TraceWriter, append_violations
from specscope.tracer.summary import summarize

BS = 64
PAGE = 64
K = 4  # num_draft_tokens: 3 draft steps + the root
MAX_PAGES = 128  # page_table width the kernel sees (max context 8192)
TARGETS = {"write_steps_per_s": 2000.0, "bytes_per_step": 8192.0, "read_ms": 5.0, "summaries_ms": 100.0,
           "find_steps_ms": 200.0}


class Workload:
    """A page allocator plus the EAGLE loop's bookkeeping; yields Steps."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.num_pages = BS * MAX_PAGES // 2 + BS * 8
        self.free: deque[int] = deque(range(1, self.num_pages))  # page 0 is the padding page
        self.pt = np.zeros((BS, MAX_PAGES), np.int32)  # slot -> page ids
        self.npages = np.zeros(BS, np.int64)
        self.seq = np.zeros(BS, np.int64)  # committed KV length S
        self.stop = np.zeros(BS, np.int64)
        self.rid = np.zeros(BS, np.int64)
        self.next_rid = 0
        self.index = 0
        self.iteration = 0
        self.clock = 1_000_000_000
        self.pending_prefill: list[int] = []
        for slot in range(BS):
            self._admit(slot)

    def _admit(self, slot: int) -> None:
        prompt = int(self.rng.integers(3500, 4601))
        self.seq[slot] = prompt
        self.stop[slot] = prompt + int(self.rng.integers(64, 512))
        self.rid[slot] = self.next_rid
        self.next_rid += 1
        self.npages[slot] = 0
        self._grow(slot, prompt + K)
        self.pending_prefill.append(slot)

    def _grow(self, slot: int, tokens: int) -> None:
        need = -(-tokens // PAGE)
        while self.npages[slot] < need:
            self.pt[slot, self.npages[slot]] = self.free.popleft()
            self.npages[slot] += 1

    def _retire(self, slot: int) -> None:
        pages = self.pt[slot, : self.npages[slot]].tolist()
        self.free.extend(pages)
        self.pt[slot] = 0

    def steps(self) -> Iterator[Step]:
        """Infinite stream of steps."""
        slots = np.arange(BS, dtype=np.int64)
        while True:
            if self.pending_prefill:
                rows = np.array(sorted(self.pending_prefill))
                self.pending_prefill = []
                yield self._step(ForwardMode.EXTEND, "target", None, rows, self.seq[rows], np.zeros_like(rows), 0)
            for slot in range(BS):
                self._grow(slot, int(self.seq[slot]) + K)
            s = self.seq.copy()
            for i in range(K - 1):
                yield self._step(ForwardMode.DRAFT_DECODE, "draft", i, slots, np.ones(BS, np.int64), s + i, 0)
            # chain acceptance: each draft accepted with p=0.7 until the first rejection, plus the bonus token
            acc = 1 + np.minimum((self.rng.random((BS, K - 1)) < 0.7).cumprod(axis=1).sum(axis=1), K - 1)
            yield self._step(ForwardMode.TARGET_VERIFY, "target", None, slots, np.full(BS, K), s, acc)
            yield self._step(ForwardMode.DRAFT_EXTEND, "draft", None, slots, acc, s, 0)
            self.seq += acc
            for slot in np.nonzero(self.seq >= self.stop)[0]:
                self._retire(int(slot))
                self._admit(int(slot))
            self.iteration += 1

    def _step(self, mode: ForwardMode, model: str, step_id: int | None, rows: np.ndarray, q: np.ndarray,
              start: np.ndarray, acc: np.ndarray | int) -> Step:  # fmt: skip
        bs = len(rows)
        q = np.asarray(q, np.int64)
        kv = (start + q).astype(np.int32)  # KV length each row attends to, new tokens included
        live = int(-(-int(kv.max()) // PAGE))
        page_table = self.pt[rows, :live]
        pos = np.concatenate([np.arange(a, a + n) for a, n in zip(start.tolist(), q.tolist(), strict=True)])
        row_of = np.repeat(np.arange(bs), q)
        loc = page_table[row_of, pos // PAGE].astype(np.int64) * PAGE + pos % PAGE
        cu_q = np.zeros(bs + 1, np.int32)
        np.cumsum(q, out=cu_q[1:])
        cu_k = np.zeros(bs + 1, np.int32)
        np.cumsum(kv, out=cu_k[1:])
        base = 0x7F3A_0000_0000 + (hash(mode.value) & 0xFFF) * 0x10000
        arrays = (
            ArraySnapshot("cache_seqlens", "int32", (BS,), base, kv),
            ArraySnapshot("cu_seqlens_q", "int32", (BS + 1,), base + 0x200, cu_q),
            ArraySnapshot("cu_seqlens_k", "int32", (BS + 1,), base + 0x400, cu_k),
            ArraySnapshot("page_table", "int32", (BS, MAX_PAGES), base + 0x600, page_table),
            ArraySnapshot("seq_lens", "int32", (BS,), base + 0x8600, start.astype(np.int32)),
            ArraySnapshot("req_pool_indices", "int32", (BS,), base + 0x8800, rows.astype(np.int32)),
            ArraySnapshot("out_cache_loc", "int64", (len(loc),), base + 0x9000, loc),
            ArraySnapshot("positions", "int64", (len(pos),), base + 0xA000, pos.astype(np.int64)),
            ArraySnapshot("req_to_token_page_starts", "int32", (BS, MAX_PAGES), 0, page_table * PAGE),
        )
        verify = mode == ForwardMode.TARGET_VERIFY
        accs = np.broadcast_to(np.asarray(acc), (bs,)).tolist()
        drafts = self.rng.integers(0, 32000, (bs, K - 1)).tolist() if verify else None
        bonus = self.rng.integers(0, 32000, bs).tolist() if verify else None
        s_list, q_list, rid, rws = start.tolist(), q.tolist(), self.rid[rows].tolist(), rows.tolist()
        reqs = []
        for j in range(bs):
            if verify:
                al = accs[j]
                d = tuple(drafts[j])
                acc_tokens = d[: al - 1] + (bonus[j],)
                reqs.append(RequestState(rid[j], rws[j], s_list[j], s_list[j] + al, K, d, acc_tokens, al))
            else:
                reqs.append(RequestState(rid[j], rws[j], s_list[j], s_list[j] + q_list[j], q_list[j]))
        t0 = self.clock
        dur = 120_000 if verify else 60_000
        spans = [StreamSpan("compute", mode.value.lower(), t0 + 5_000, t0 + dur)]
        if mode in (ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND):
            spans.append(StreamSpan("plan", "metadata", t0 - 40_000, t0 - 5_000))
        spans.append(StreamSpan("host", "launch", t0, t0 + 4_000))
        self.clock += dur + 2_000
        step = Step(
            index=self.index, iteration=self.iteration, mode=mode, model=model, step_id=step_id,
            batch_size=bs, padded_batch_size=BS if mode != ForwardMode.EXTEND else bs,
            graph=GraphPhase.REPLAY if mode != ForwardMode.EXTEND else GraphPhase.EAGER,
            tokens_per_request=int(q.max()), num_draft_tokens=K, page_size=PAGE, start_ns=t0, end_ns=t0 + dur,
            scalars={"max_seq_len_q": int(q.max()), "max_seq_len_k": int(kv.max()), "frozen_max_seq_len_q": K},
            requests=tuple(reqs), arrays=arrays, spans=tuple(spans),
        )  # fmt: skip
        self.index += 1
        return step


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run_info(args: argparse.Namespace) -> RunInfo:
    """RunInfo of the synthetic run."""
    return RunInfo(
        command=" ".join(sys.argv), config={"batch_size": BS, "page_size": PAGE, "num_draft_tokens": K},
        target_model="synthetic", draft_model="synthetic", device="cpu", device_capability=None,
        attention_kernel="none", versions={"python": platform.python_version(), "sqlite": sqlite3.sqlite_version},
        git_commit=None, start_ns=time.time_ns(),
    )  # fmt: skip


def _fresh(workdir: str, name: str) -> str:
    path = os.path.join(workdir, name)
    for p in (path, path + "-wal", path + "-shm"):
        if os.path.exists(p):
            os.remove(p)
    return path


def write_once(args: argparse.Namespace, path: str, writer_kind: str, steps: int, check: bool = False) -> dict:
    """Write `steps` steps with one writer kind; returns wall/CPU time and size.

    Steps (and, for the process writer, their compact raw form) are built in untimed chunks, so the
    numbers measure the store, not this script's step generator."""
    gen = Workload(seed=args.seed).steps()
    if writer_kind == "process":
        writer: Any = ProcessTraceWriter(path, run_info(args))
    else:
        writer = TraceWriter(path, run_info(args), threaded=writer_kind == "thread")
    # The live checker, as `specscope run` starts it: beside the writer, once the trace exists.
    live = LiveCheck(path) if check and writer_kind == "process" else None
    wall = cpu = 0.0
    done = 0
    child_cpu0 = _children_cpu()
    load_before = os.getloadavg()[0]
    close_s = 0.0
    while done < steps:
        chunk = [next(gen) for _ in range(min(args.chunk, steps - done))]
        if writer_kind == "process":
            chunk = [raw_from_step(s) for s in chunk]
        t, c = time.perf_counter(), time.process_time()
        if writer_kind == "process":
            for s in chunk:
                writer.write_raw_step(s)
        else:
            for s in chunk:
                writer.write_step(s)
        if done + len(chunk) < steps:
            writer.flush()
        else:
            writer.flush()  # everything committed: the write phase ends here
            wall += time.perf_counter() - t
            cpu += time.process_time() - c
            t = time.perf_counter()
            writer.close()  # checkpoint
            if live is not None:
                live.finish()  # the checker's last verdicts
            close_s = time.perf_counter() - t
            t = c = None
        if t is not None:
            wall += time.perf_counter() - t
            cpu += time.process_time() - c
        done += len(chunk)
        del chunk
    child_cpu = _children_cpu() - child_cpu0
    res = {
        "writer": writer_kind, "check": check, "steps": steps, "write_wall_s": round(wall, 3),
        "write_steps_per_s": round(steps / wall, 1), "close_s": round(close_s, 3),
        "cpu_us_per_step_this_process": round(cpu / steps * 1e6, 1),
        "cpu_us_per_step_children": round(child_cpu / steps * 1e6, 1),
        "file_bytes": os.path.getsize(path), "bytes_per_step": round(os.path.getsize(path) / steps, 1),
        "load_average_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }  # fmt: skip
    if live is not None:
        res["check_result"] = dataclasses.asdict(live.result) if live.result else None
    return res


def _children_cpu() -> float:
    t = os.times()
    return t.children_user + t.children_system


def _timed(fn: Callable[[], Any], repeat: int) -> tuple[list[float], Any]:
    out, last = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        last = fn()
        out.append((time.perf_counter() - t) * 1e3)
    return out, last


def _stats(ms: list[float]) -> dict:
    ms = sorted(ms)
    return {"median_ms": round(statistics.median(ms), 3), "p99_ms": round(ms[int(0.99 * (len(ms) - 1))], 3),
            "max_ms": round(ms[-1], 3), "samples": len(ms)}  # fmt: skip


def read_bench(args: argparse.Namespace, path: str) -> dict:
    """Read-side timings on a written trace: random steps, summaries, searches, spans, histories."""
    rnd = random.Random(args.seed)
    # Violations a checker would have written: sparse I10s everywhere, one rare I21 near the end.
    with TraceReader(path) as r:
        n = r.num_steps()
    viol = [Violation("I10", Severity.ERROR, i, f"step {i}: page_table[3, 7] = 12 but req_to_token says 13", 3,
                      array="page_table", row=3, col=7, found="12", expected="13") for i in range(0, n, 997)]
    viol.append(Violation("I21", Severity.ERROR, n - 1234, "plan work started before its producers ended"))
    append_violations(path, viol, source="check", replace=True)
    res: dict[str, Any] = {}
    with TraceReader(path) as r:
        ms, _ = _timed(lambda: r.num_steps(), 50)
        res["num_steps"] = _stats(ms)
        lat = []
        for _ in range(args.reads):
            i = rnd.randrange(n)
            t = time.perf_counter()
            r.step(i)
            lat.append((time.perf_counter() - t) * 1e3)
        res["step_all_arrays"] = _stats(lat)
        lat = []
        for _ in range(args.reads):
            i = rnd.randrange(n)
            t = time.perf_counter()
            r.step(i, arrays=("cache_seqlens",))
            lat.append((time.perf_counter() - t) * 1e3)
        res["step_one_array"] = _stats(lat)
        starts = [rnd.randrange(n - 1000) for _ in range(20)]
        ms = []
        for a in starts:
            t = time.perf_counter()
            rows = r.summaries(a, a + 1000)
            ms.append((time.perf_counter() - t) * 1e3)
            assert len(rows) == 1000
        res["summaries_1000"] = _stats(ms)
        ms, found = _timed(lambda: r.find_steps("I21"), 5)
        res["find_steps_rare_check_id"] = _stats(ms) | {"found": found}
        ms, found = _timed(lambda: r.find_steps("I10", after=n // 2, limit=None), 5)
        res["find_steps_check_id_all_after_half"] = _stats(ms) | {"found": len(found)}
        # A request alive in the second half of the run: all its steps, and the next one after a point.
        mid = r.step(n * 3 // 4, arrays=()).requests[0].request_id
        ms, found = _timed(lambda: r.find_steps(f"request {mid}", limit=None), 5)
        res["find_steps_request_all"] = _stats(ms) | {"request_id": mid, "found": len(found)}
        ms, found = _timed(lambda: r.find_steps(StepFilter(request_id=mid), after=n * 3 // 4), 5)
        res["find_steps_request_next"] = _stats(ms) | {"found": found}
        ms, hist = _timed(lambda: r.request_history(mid), 5)
        res["request_history"] = _stats(ms) | {"rows": len(hist)}
        ms, found = _timed(lambda: r.find_steps("EXTEND", after=n // 2, limit=10), 5)
        res["find_steps_mode"] = _stats(ms) | {"found": len(found)}
        s = r.summary(n // 2)
        ms, spans = _timed(lambda: r.spans(s.start_ns, s.start_ns + 2_000_000), 20)
        res["spans_2ms_window"] = _stats(ms) | {"rows": len(spans)}
        ms, spans = _timed(lambda: r.spans(steps=(n // 2, n // 2 + 1000)), 20)
        res["spans_1000_steps"] = _stats(ms) | {"rows": len(spans)}
        ms, _ = _timed(lambda: r.capture_of(n - 1), 20)
        res["capture_of"] = _stats(ms)
        t = time.perf_counter()
        summary = summarize(r)
        res["summarize_ms"] = round((time.perf_counter() - t) * 1e3, 1)
        res["mean_accept_length"] = round(summary["mean_accept_length"], 3)
    return res


def bench(args: argparse.Namespace) -> dict:
    """Run the benchmark and return the results dict."""
    workdir = tempfile.mkdtemp(prefix="specscope-bench-")
    runs = []
    for k in range(args.runs):
        for kind in args.writers:
            path = _fresh(workdir, f"bench-{kind}.db")
            runs.append(write_once(args, path, kind, args.steps) | {"run": k})
            print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
            if not (k == args.runs - 1 and kind == args.writers[0]):
                os.remove(path)
    read_path = os.path.join(workdir, f"bench-{args.writers[0]}.db")
    reads = read_bench(args, read_path)
    os.remove(read_path)
    checked = None
    if args.check_steps:
        path = _fresh(workdir, "bench-check.db")
        checked = write_once(args, path, "process", args.check_steps, check=True)
        os.remove(path)
    os.rmdir(workdir)
    by_kind: dict[str, dict] = {}
    for kind in args.writers:
        rs = [r for r in runs if r["writer"] == kind]
        rates = [r["write_steps_per_s"] for r in rs]
        by_kind[kind] = {
            "write_steps_per_s_median": round(statistics.median(rates), 1),
            "write_steps_per_s_min": min(rates), "write_steps_per_s_max": max(rates),
            "bytes_per_step": rs[-1]["bytes_per_step"],
            "cpu_us_per_step_writer": round(statistics.median(
                r["cpu_us_per_step_children"] if kind == "process" else r["cpu_us_per_step_this_process"]
                for r in rs), 1),
        }  # fmt: skip
    head = by_kind[args.writers[0]]
    res = {
        "steps": args.steps,
        "headline_writer": args.writers[0],
        "write": by_kind,
        "runs": runs,
        "with_checker": checked,
        "read": reads,
        "targets": TARGETS,
        "machine": {
            "cpu_cores": os.cpu_count(), "cpu": _cpu_model(), "python": platform.python_version(),
            "sqlite": sqlite3.sqlite_version, "numpy": np.__version__, "zstandard": zstandard.__version__,
            "platform": platform.platform(), "specscope_git": _git_head(),
        },  # fmt: skip
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": "python benchmarks/trace_store.py " + shlex.join(sys.argv[1:]),
    }
    res["pass"] = {
        "write_steps_per_s": head["write_steps_per_s_median"] >= TARGETS["write_steps_per_s"],
        "bytes_per_step": head["bytes_per_step"] <= TARGETS["bytes_per_step"],
        "read_ms": reads["step_all_arrays"]["p99_ms"] <= TARGETS["read_ms"],
        "summaries_ms": reads["summaries_1000"]["max_ms"] <= TARGETS["summaries_ms"],
        "find_steps_ms": max(reads["find_steps_rare_check_id"]["max_ms"],
                             reads["find_steps_request_all"]["max_ms"]) <= TARGETS["find_steps_ms"],
    }  # fmt: skip
    return res


def _git_head() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=os.path.dirname(os.path.abspath(__file__)))  # fmt: skip
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def markdown(res: dict, note: str) -> str:
    """A short human-readable report of a results dict."""
    m, t, ok, rd = res["machine"], res["targets"], res["pass"], res["read"]

    def mark(k: str) -> str:
        return "pass" if ok[k] else "**MISS**"

    head = res["write"][res["headline_writer"]]
    rows = [
        (f"write throughput ({res['headline_writer']} writer, median of {len(res['runs']) // len(res['write'])})",
         f"{head['write_steps_per_s_median']:,.0f} steps/s (min {head['write_steps_per_s_min']:,.0f},"
         f" max {head['write_steps_per_s_max']:,.0f})", f">= {t['write_steps_per_s']:,.0f} steps/s",
         mark("write_steps_per_s")),
        ("file size", f"{head['bytes_per_step']:,.0f} bytes/step", f"<= {t['bytes_per_step']:,.0f} bytes/step",
         mark("bytes_per_step")),
        ("random `reader.step(i)`", f"median {rd['step_all_arrays']['median_ms']} ms, p99 "
         f"{rd['step_all_arrays']['p99_ms']} ms", f"<= {t['read_ms']} ms (p99)", mark("read_ms")),
        ("`summaries(a, a + 1000)`, 20 random a", f"median {rd['summaries_1000']['median_ms']} ms, max "
         f"{rd['summaries_1000']['max_ms']} ms", f"<= {t['summaries_ms']:.0f} ms", mark("summaries_ms")),
        ("`find_steps` by violation id (one I21 near the end)", f"max {rd['find_steps_rare_check_id']['max_ms']} ms",
         f"<= {t['find_steps_ms']:.0f} ms", mark("find_steps_ms")),
        ("`find_steps` by request id (all its steps)", f"max {rd['find_steps_request_all']['max_ms']} ms "
         f"({rd['find_steps_request_all']['found']} steps)", f"<= {t['find_steps_ms']:.0f} ms", mark("find_steps_ms")),
    ]  # fmt: skip
    table = "\n".join(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows)
    writers = "\n".join(
        f"| {k} | {v['write_steps_per_s_median']:,.0f} | {v['write_steps_per_s_min']:,.0f} – "
        f"{v['write_steps_per_s_max']:,.0f} | {v['cpu_us_per_step_writer']} | {v['bytes_per_step']:,.0f} |"
        for k, v in res["write"].items())  # fmt: skip
    other = "\n".join(f"- `{k}`: " + ", ".join(f"{a} {b}" for a, b in v.items()) if isinstance(v, dict)
                      else f"- `{k}`: {v}" for k, v in rd.items())  # fmt: skip
    chk = res.get("with_checker")
    chk_text = ""
    if chk:
        chk_text = (f"\nWith the live checker on (`LiveCheck` beside the process writer, {chk['steps']:,} steps): "
                    f"{chk['write_steps_per_s']:,.0f} steps/s until every step was committed, then "
                    f"{chk['close_s']} s in `close()` for the checker to finish its last verdicts "
                    f"({chk.get('check_result')}).\n")
    return f"""# Trace store benchmark (schema 2)

- Machine: {m["cpu_cores"]} CPU cores ({m["cpu"]}), {m["platform"]}
- Python {m["python"]}, SQLite {m["sqlite"]}, numpy {m["numpy"]}, zstandard {m["zstandard"]},
  specscope {m["specscope_git"]}
- Date: {res["date"]}
- Command: `{res["command"]}`
{note}
Workload: bs=64, contexts of 3500-4600 tokens in 64-token pages from a shared, fragmenting pool;
DRAFT_DECODE x3, TARGET_VERIFY (T=4), DRAFT_EXTEND per iteration, EXTEND on admissions; the nine
standard arrays, 64 RequestStates and 2-3 spans per step. Steps (and the compact raw form the engine
sends) are generated in untimed chunks; write throughput is `write_*` calls until a flush returned with
every step committed. The `process` writer is what `specscope run` uses (binary step frames over a pipe to a child
that encodes and commits synchronously); `sync` is that child's `TraceWriter(threaded=False)` fed Step
objects in-process; `thread` the in-process threaded writer.

| metric | result | target | |
|---|---|---|---|
{table}

| writer | steps/s (median) | min – max | writer CPU us/step | bytes/step |
|---|---|---|---|---|
{writers}
{chk_text}
Read side, all on the {res["steps"]:,}-step trace:

{other}
"""


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; exits 1 if a target is missed."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--reads", type=int, default=1000, help="random step reads to time")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chunk", type=int, default=2000, help="steps generated per untimed chunk")
    ap.add_argument("--runs", type=int, default=3, help="write runs per writer kind (median and spread)")
    ap.add_argument("--writers", default="process,sync", help="writer kinds, headline first: process, sync, thread")
    ap.add_argument("--check-steps", type=int, default=10_000, help="steps of the run with the live checker (0: none)")
    ap.add_argument("--out", help="write the results JSON here")
    ap.add_argument("--md", help="write a short markdown report here")
    ap.add_argument("--note", default="", help="a line for the markdown report (e.g. machine load)")
    args = ap.parse_args(argv)
    args.writers = [w.strip() for w in args.writers.split(",") if w.strip()]
    res = bench(args)
    text = json.dumps(res, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(res, f"- Note: {args.note}\n" if args.note else ""))
    return 0 if all(res["pass"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
