"""Trace store benchmark: write throughput, bytes per step and random-step read latency.

Workload: a spec-decoding run at bs=64 with ~4k-token contexts (prompts 3500-4600 tokens) in 64-token
pages. Requests take contiguous page runs from a shared pool at prefill and single pages from a free
list as they grow; finished requests return their pages and new ones arrive, so page ids interleave
and fragment as in a real server. Every iteration records DRAFT_DECODE x3 (T=1), TARGET_VERIFY (T=4)
and DRAFT_EXTEND (T=accept length), plus an EXTEND step whenever new requests are prefilled; each step
carries the standard metadata arrays of docs/trace-format.md, 64 RequestStates and 2-3 stream spans.

    python benchmarks/trace_store.py --steps 100000 --out benchmarks/results/trace_store.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shlex
import sqlite3
import statistics
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterator

import numpy as np
from specscope.tracer.schema import (
    ArraySnapshot,
    ForwardMode,
    GraphPhase,
    RequestState,
    RunInfo,
    Step,
    StreamSpan,
)
from specscope.tracer.store import TraceReader, TraceWriter
from specscope.tracer.summary import summarize

BS = 64
PAGE = 64
K = 4  # num_draft_tokens: 3 draft steps + the root
MAX_PAGES = 128  # page_table width the kernel sees (max context 8192)
TARGETS = {"write_steps_per_s": 2000.0, "bytes_per_step": 8192.0, "read_ms": 5.0}


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


def bench(args: argparse.Namespace) -> dict:
    """Run the benchmark and return the results dict."""
    workdir = tempfile.mkdtemp(prefix="specscope-bench-")
    path = os.path.join(workdir, "bench.db")
    gen = Workload(seed=args.seed).steps()
    writer = TraceWriter(path, run_info(args))
    # Steps are built in chunks outside the timed region, so the number measures the store, not this
    # script's Python step generator (which on a 2-core machine would also compete for the GIL).
    wall = gen_s = cpu = 0.0
    done = 0
    load_before = os.getloadavg()
    while done < args.steps:
        t = time.perf_counter()
        chunk = [next(gen) for _ in range(min(args.chunk, args.steps - done))]
        gen_s += time.perf_counter() - t
        t, c = time.perf_counter(), time.process_time()
        for s in chunk:
            writer.write_step(s)
        if done + len(chunk) < args.steps:
            writer.flush()
        else:
            writer.close()  # wall time runs until close() returns: everything committed and checkpointed
        wall += time.perf_counter() - t
        cpu += time.process_time() - c
        done += len(chunk)
        del chunk
    gen_rate = done / gen_s
    size = os.path.getsize(path)

    rnd = random.Random(args.seed)
    lat = []
    with TraceReader(path) as reader:
        n = reader.num_steps()
        t = time.perf_counter()
        n = reader.num_steps()
        num_steps_ms = (time.perf_counter() - t) * 1e3
        for _ in range(args.reads):
            i = rnd.randrange(n)
            t = time.perf_counter()
            reader.step(i)
            lat.append((time.perf_counter() - t) * 1e3)
        t = time.perf_counter()
        first_screen = list(reader.step_headers(0, 50))
        headers_ms = (time.perf_counter() - t) * 1e3
        t = time.perf_counter()
        summary = summarize(reader)
        summarize_ms = (time.perf_counter() - t) * 1e3
    lat.sort()
    os.remove(path)
    os.rmdir(workdir)
    res = {
        "steps": n,
        "write_wall_s": round(wall, 3),
        "write_steps_per_s": round(n / wall, 1),
        # CPU seconds of all threads per step while writing: what the store costs, whatever else runs.
        "write_cpu_us_per_step": round(cpu / n * 1e6, 1),
        "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "generator_only_steps_per_s": round(gen_rate, 1),
        "file_bytes": size,
        "bytes_per_step": round(size / n, 1),
        "read_ms_median": round(statistics.median(lat), 3),
        "read_ms_p99": round(lat[int(0.99 * (len(lat) - 1))], 3),
        "read_samples": len(lat),
        "num_steps_ms": round(num_steps_ms, 3),
        "first_50_headers_ms": round(headers_ms, 3),
        "num_headers_read": len(first_screen),
        "summarize_ms": round(summarize_ms, 1),
        "mean_accept_length": round(summary["mean_accept_length"], 3),
        "targets": TARGETS,
        "machine": {
            "cpu_cores": os.cpu_count(),
            "cpu": _cpu_model(),
            "python": platform.python_version(),
            "sqlite": sqlite3.sqlite_version,
            "numpy": np.__version__,
            "platform": platform.platform(),
        },
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": "python benchmarks/trace_store.py " + shlex.join(sys.argv[1:]),
    }
    res["pass"] = {
        "write_steps_per_s": res["write_steps_per_s"] >= TARGETS["write_steps_per_s"],
        "bytes_per_step": res["bytes_per_step"] <= TARGETS["bytes_per_step"],
        "read_ms": res["read_ms_p99"] <= TARGETS["read_ms"],
    }
    return res


def markdown(res: dict, note: str) -> str:
    """A short human-readable report of a results dict."""
    m, t, ok = res["machine"], res["targets"], res["pass"]

    def mark(k: str) -> str:
        return "pass" if ok[k] else "**MISS**"

    rows = [
        ("write throughput",
         f"{res['write_steps_per_s']:,.0f} steps/s ({res['steps']:,} steps in {res['write_wall_s']} s)",
         f">= {t['write_steps_per_s']:,.0f} steps/s", mark("write_steps_per_s")),
        ("file size", f"{res['bytes_per_step']:,.0f} bytes/step ({res['file_bytes'] / 2**20:,.1f} MiB)",
         f"<= {t['bytes_per_step']:,.0f} bytes/step", mark("bytes_per_step")),
        ("random `reader.step(i)`",
         f"median {res['read_ms_median']} ms, p99 {res['read_ms_p99']} ms ({res['read_samples']} reads)",
         f"<= {t['read_ms']} ms", mark("read_ms")),
    ]  # fmt: skip
    table = "\n".join(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows)
    return f"""# Trace store benchmark

- Machine: {m["cpu_cores"]} CPU cores ({m["cpu"]}), {m["platform"]}
- Python {m["python"]}, SQLite {m["sqlite"]}, numpy {m["numpy"]}
- Date: {res["date"]}
- Command: `{res["command"]}`
{note}
Workload: bs=64, contexts of 3500-4600 tokens in 64-token pages from a shared, fragmenting pool;
DRAFT_DECODE x3, TARGET_VERIFY (T=4), DRAFT_EXTEND per iteration, EXTEND on admissions; the nine
standard arrays, 64 RequestStates and 2-3 spans per step. Steps are generated in untimed chunks, so
write throughput measures the store (`write_step` calls until `close()` returned).

| metric | result | target | |
|---|---|---|---|
{table}

Writer CPU (all threads, per step): {res["write_cpu_us_per_step"]} us. Load average (1 min) before / after
the write phase: {res["load_average_before_after"][0]} / {res["load_average_before_after"][1]}.

Also measured: `num_steps()` {res["num_steps_ms"]} ms; first 50 step headers {res["first_50_headers_ms"]} ms;
`summarize()` (what `specscope info` computes) {res["summarize_ms"]} ms; this script's step generator
alone {res["generator_only_steps_per_s"]:,.0f} steps/s.
"""


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; exits 1 if a target is missed."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--reads", type=int, default=1000, help="random step reads to time")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chunk", type=int, default=2000, help="steps generated per untimed chunk")
    ap.add_argument("--out", help="write the results JSON here")
    ap.add_argument("--md", help="write a short markdown report here")
    ap.add_argument("--note", default="", help="a line for the markdown report (e.g. machine load)")
    args = ap.parse_args(argv)
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
