"""Perfetto export: a trace as Chrome Trace Event JSON (what ui.perfetto.dev and chrome://tracing open).

Layout: one process per model (target, draft) with one thread track per stream (plan, compute, host), a
"steps" track whose slices carry the NVTX range names the engine pushes (`draft step 0`, `verify`, `plan: verify
metadata`, ... — `backend/engine.py`), an "iterations" track (`iteration N`, as the engine's outer NVTX range),
and a "violations" track of instant events. Slices that would overlap on one track go to sub-tracks
("compute #2"), so no track holds overlapping complete slices. Flows join each plan slice to the launch that
waited on it (`Step.waits`; without recorded waits, the plan `metadata` span to the same step's compute
`forward`). Counters: batch size, mean accept length, KV pages in use. Timestamps are the trace's integer
nanoseconds written as microseconds with three decimals (exact).
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..reader import TraceReader
from ..schema import ForwardMode, Step

STREAMS = ("plan", "compute", "host")
_PIDS = {"target": 1, "draft": 2}
_TID = {"iterations": 1, "steps": 2, "plan": 10, "compute": 20, "host": 30, "violations": 90}
_SUB = 100  # sub-track k of a stream: tid = base + k * _SUB


def nvtx_name(step: Step | Any, span_name: str, stream: str) -> str:
    """The NVTX range the engine pushes around this span (backend/engine.py), or the span's own name."""
    mode, model = step.mode, step.model
    if getattr(step, "graph", None) is not None and step.graph.value == "capture":
        return "capture"
    if stream == "plan":
        which = "verify" if mode == ForwardMode.TARGET_VERIFY else "extend"
        return f"plan: {which} metadata"
    if span_name != "forward":
        return span_name
    if mode == ForwardMode.DRAFT_DECODE:
        return f"draft step {step.step_id}"
    if mode == ForwardMode.TARGET_VERIFY:
        return "verify"
    if mode == ForwardMode.DRAFT_EXTEND:
        return "draft extend"
    if mode == ForwardMode.EXTEND:
        return f"{model} extend"
    return "decode"


def ts_us(ns: int) -> float:
    """Integer ns -> float µs; `round(ts * 1000)` gives the ns back exactly for trace-clock values."""
    return int(ns) / 1000.0


@dataclass
class _Lanes:
    """Greedy interval partition: a slice goes to the first sub-track whose last slice ended by its start."""

    ends: list[int] = field(default_factory=list)

    def place(self, start: int, end: int) -> int:
        for k, e in enumerate(self.ends):
            if e <= start:
                self.ends[k] = end
                return k
        self.ends.append(end)
        return len(self.ends) - 1


@dataclass
class _Slice:
    pid: int
    track: str  # "plan", "compute", "host", "steps", "iterations"
    name: str
    start: int
    end: int
    args: dict[str, Any]
    tid: int = 0


def step_args(step: Step, kernel: str) -> dict[str, Any]:
    """The slice arguments of a step: mode, bs, padded bs, T, K, accept lengths, kernel, ..."""
    a: dict[str, Any] = {
        "step": step.index, "iteration": step.iteration, "mode": step.mode.value, "model": step.model,
        "graph": step.graph.value, "bs": step.batch_size, "padded_bs": step.padded_batch_size,
        "T": step.tokens_per_request, "K": step.num_draft_tokens, "kernel": kernel,
    }  # fmt: skip
    if step.step_id is not None:
        a["step_id"] = step.step_id
    for k in ("max_seq_len_q", "kernel_q_len", "max_seq_len_k", "captured_max_seq_len_q"):
        if k in step.scalars:
            a[k] = step.scalars[k]
    if step.mode == ForwardMode.TARGET_VERIFY and step.requests:
        a["accept_lengths"] = [r.accept_length for r in step.requests]
        a["request_ids"] = [r.request_id for r in step.requests]
    if step.errors:
        a["errors"] = [f"{e.call}: {e.error_type}: {e.message}" for e in step.errors]
    if step.faults_fired:
        a["faults_fired"] = list(step.faults_fired)
    return a


def pages_in_use(step: Step) -> int | None:
    """KV pages the live rows read (sum of ceil(cache_seqlens / page_size)), None without cache_seqlens."""
    cs = step.array("cache_seqlens")
    if cs is None or step.page_size <= 0:
        return None
    live = cs.values[: step.batch_size].astype("int64")
    return int(((live + step.page_size - 1) // step.page_size).clip(min=0).sum())


def build_events(reader: TraceReader, start: int = 0, stop: int | None = None) -> list[dict[str, Any]]:
    """The Chrome Trace Event list for steps start <= index < stop (metadata events first, then by time)."""
    kernel = reader.run.attention_kernel
    slices: list[_Slice] = []
    flows: list[tuple[_Slice, _Slice]] = []
    counters: list[dict[str, Any]] = []
    instants: list[dict[str, Any]] = []
    iterations: dict[tuple[int, int], list[int]] = {}
    shared: dict[tuple[int, str, str, int, int], _Slice] = {}  # by (pid, track, name, start, end)
    models: set[str] = set()
    steps = [s.index for s in reader.iter_summaries(start, stop)]
    viol_by_step: dict[int, list[Any]] = {}
    for v in reader.violations():
        if start <= v.step and (stop is None or v.step < stop):
            viol_by_step.setdefault(v.step, []).append(v)
    for i in steps:
        step = reader.step(i, arrays=("cache_seqlens",))
        pid = _pid(step.model)
        models.add(step.model)
        args = step_args(step, kernel)
        by_key: dict[tuple[str, str], _Slice] = {}
        for sp in step.spans:
            if sp.end_ns < sp.start_ns:
                continue
            stream = sp.stream if sp.stream in STREAMS else "host"
            key = (pid, stream, sp.name, sp.start_ns, sp.end_ns)
            sl = shared.get(key)
            if sl is not None:
                # One span of several steps (the draft loop's metadata, made for every draft step at once): one
                # slice, which names every step it belongs to.
                sl.args.setdefault("steps", [sl.args["step"]]).append(step.index)
            else:
                sl = shared[key] = _Slice(pid, stream, sp.name, sp.start_ns, sp.end_ns,
                                          dict(args, span=sp.name, stream=sp.stream))
                slices.append(sl)
            by_key.setdefault((sp.stream, sp.name), sl)
            # The NVTX-named copy on the steps track: one per compute forward and per plan metadata span.
            if sp.name == "forward" or sp.stream == "plan":
                slices.append(_Slice(pid, "steps", nvtx_name(step, sp.name, sp.stream), sp.start_ns, sp.end_ns,
                                     dict(args, span=sp.name, stream=sp.stream)))
        flows.extend(_flows(step, by_key))
        if step.iteration >= 0:
            iterations.setdefault((pid, step.iteration), []).extend([step.start_ns, step.end_ns])
        counters.append(_counter(pid, "batch size", step.start_ns, {"bs": step.batch_size,
                                                                    "padded_bs": step.padded_batch_size}))
        if step.mode == ForwardMode.TARGET_VERIFY and step.requests:
            mean = sum(r.accept_length for r in step.requests) / len(step.requests)
            counters.append(_counter(pid, "accept length", step.end_ns, {"mean": round(mean, 4)}))
        pages = pages_in_use(step)
        if pages is not None:
            counters.append(_counter(pid, "KV pages in use", step.start_ns, {"pages": pages}))
        for v in viol_by_step.get(i, []):
            instants.append({"ph": "i", "s": "t", "pid": pid, "tid": _TID["violations"], "ts": ts_us(step.start_ns),
                             "name": f"{v.check_id} {v.severity.value}", "cat": "violation",
                             "args": {"message": v.message, "step": v.step, "request_id": v.request_id,
                                      "check_id": v.check_id}})
    for (pid, it), ts in iterations.items():
        slices.append(_Slice(pid, "iterations", f"iteration {it}", min(ts), max(ts), {"iteration": it}))
    _assign_tracks(slices)
    events: list[dict[str, Any]] = []
    for sl in slices:
        events.append({"ph": "X", "pid": sl.pid, "tid": sl.tid, "ts": ts_us(sl.start), "dur": ts_us(sl.end - sl.start),
                       "name": sl.name, "cat": sl.track, "args": sl.args})
    for n, (src, dst) in enumerate(flows):
        fid = n + 1
        events.append({"ph": "s", "id": fid, "pid": src.pid, "tid": src.tid, "ts": ts_us(src.start),
                       "name": "waited on", "cat": "flow"})
        events.append({"ph": "f", "bp": "e", "id": fid, "pid": dst.pid, "tid": dst.tid, "ts": ts_us(dst.start),
                       "name": "waited on", "cat": "flow"})
    events += counters + instants
    events.sort(key=lambda e: (e["ts"], _ORDER[e["ph"]]))
    return _metadata(slices, models, bool(instants)) + events


_ORDER = {"X": 0, "s": 1, "f": 2, "C": 3, "i": 4}


def _pid(model: str) -> int:
    return _PIDS.get(model, 3 + sum(map(ord, model)) % 1000)


def _counter(pid: int, name: str, ns: int, values: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "C", "pid": pid, "tid": 0, "ts": ts_us(ns), "name": name, "args": values}


def _flows(step: Step, by_key: dict[tuple[str, str], _Slice]) -> list[tuple[_Slice, _Slice]]:
    """(source, destination) slice pairs: each recorded wait, or plan metadata -> compute forward."""
    out = []
    waits = list(step.waits)
    if not waits and ("plan", "metadata") in by_key and ("compute", "forward") in by_key:
        return [(by_key[("plan", "metadata")], by_key[("compute", "forward")])]
    for w in waits:
        src = by_key.get((w.on_stream, w.on_span))
        if src is None:
            continue
        dst = _waiter(w.stream, src, by_key)
        if dst is not None:
            out.append((src, dst))
    return out


def _waiter(stream: str, src: _Slice, by_key: dict[tuple[str, str], _Slice]) -> _Slice | None:
    """The first span of `stream` that starts once `src` has ended (the launch the wait held back)."""
    if stream == "compute" and ("compute", "forward") in by_key:
        return by_key[("compute", "forward")]
    cands = sorted((s for (st, _), s in by_key.items() if st == stream), key=lambda s: s.start)
    after = [s for s in cands if s.start >= src.end] or [s for s in cands if s.start >= src.start]
    return after[0] if after else None


def _assign_tracks(slices: list[_Slice]) -> None:
    lanes: dict[tuple[int, str], _Lanes] = {}
    for sl in sorted(slices, key=lambda s: (s.start, s.end)):
        k = lanes.setdefault((sl.pid, sl.track), _Lanes()).place(sl.start, sl.end)
        sl.tid = _TID[sl.track] + k * _SUB


def _metadata(slices: list[_Slice], models: set[str], violations: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in sorted(models, key=lambda m: _pid(m)):
        pid = _pid(m)
        out.append({"ph": "M", "pid": pid, "tid": 0, "name": "process_name", "args": {"name": f"{m} model"}})
        out.append({"ph": "M", "pid": pid, "tid": 0, "name": "process_sort_index", "args": {"sort_index": pid}})
        if violations:
            out += _thread(pid, _TID["violations"], "violations")
    seen: set[tuple[int, int]] = set()
    for sl in slices:
        if (sl.pid, sl.tid) in seen:
            continue
        seen.add((sl.pid, sl.tid))
        k = (sl.tid - _TID[sl.track]) // _SUB
        out += _thread(sl.pid, sl.tid, sl.track if k == 0 else f"{sl.track} #{k + 1}")
    return out


def _thread(pid: int, tid: int, name: str) -> list[dict[str, Any]]:
    return [{"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": name}},
            {"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}}]


def trace_json(events: Iterable[dict[str, Any]], reader: TraceReader, name: str | None = None) -> dict[str, Any]:
    """The JSON object: `traceEvents` plus the run's command, device and kernel as `metadata` (`name`: the file to
    name in it; default the one the reader was opened on, a bundle's .zip rather than its trace.db copy)."""
    run = reader.run
    return {"traceEvents": list(events), "displayTimeUnit": "ns",
            "metadata": {"specscope_trace": name or os.path.basename(reader.display_path), "command": run.command,
                         "device": run.device, "attention_kernel": run.attention_kernel,
                         "versions": run.versions, "git_commit": run.git_commit,
                         "clock": "host monotonic ns (time.perf_counter_ns); GPU spans converted to it"}}


def write_perfetto(reader: TraceReader, out: str, start: int = 0, stop: int | None = None, *,
                   name: str | None = None) -> int:
    """Write the export to `out` (gzip when it ends in .gz); returns the number of trace events."""
    doc = trace_json(build_events(reader, start, stop), reader, name)
    data = json.dumps(doc, separators=(",", ":")).encode()
    tmp = out + ".tmp"
    with open(tmp, "wb") as raw:
        if out.endswith(".gz"):
            with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:  # mtime 0: the same trace, the same bytes
                f.write(data)
        else:
            raw.write(data)
    os.replace(tmp, out)
    return len(doc["traceEvents"])
