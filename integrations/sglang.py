"""Record a live SGLang `TRTLLMHAAttnBackend` into a specscope trace: every forward it prepares becomes a `Step`.

Usage in-process (a server, a test, a driver script):

    from specscope.integrations import sglang as ss
    tracer = ss.SglangTracer("run.db")                      # opens a TraceWriter
    ss.instrument(trtllm_mha_backend_module, tracer)       # patches its two classes (idempotent)
    ...                                                     # run SGLang as usual
    tracer.close()

In a real server, `specscope sglang-hook install` plus `SPECSCOPE_TRACE=run.db` does the same without editing
SGLang (see `sglang_hook.py` and docs/sglang.md).

What a step holds (names as the engine's recorder writes them, docs/trace-format.md):

- arrays, after the backend's prep (eager `init_forward_metadata`, capture, and each replay's `_apply`):
  `cache_seqlens`, `cu_seqlens_q`, `cu_seqlens_k`, `page_table` (live columns, full shape kept) — exactly the
  tensors in `backend.forward_metadata`, with their device addresses; the batch's `seq_lens`, `seq_lens_cpu`,
  `req_pool_indices`, `positions`, `out_cache_loc`, `req_to_token_page_starts`; `draft_tokens` (verify) and
  `accept_lens` (draft extend) when the spec input carries them.
- scalars: `max_seq_len_q`, `max_seq_len_k` (releases that have it: up to 0.5.13), `kernel_q_len` (the q length
  the kernels run with: the live value eagerly, the value frozen at capture for a graph), `captured_max_seq_len_q`,
  `seq_len_fill_value`, `backend_num_draft_tokens`, `max_context_len`, `speculative_step_id`, `seq_lens_cpu_max`
  (when the batch carries a host mirror); `plan_stream` and `fixup_hook_ok` for verifies once the plan-stream
  fix-up hook ran.
- spans: `host`/`metadata` always; on a CUDA device also CUDA-event spans of the prep on its stream, named
  `compute` for the stream draft decode runs on and `plan` for any other (SGLang's overlap plan stream).
- errors: a `CallError` for each prep or hook call that raised (then re-raised unchanged), e.g.
  `update_verify_buffers_to_fill_after_draft` → `NotImplementedError` on backends without PR #25925.

How a prep call becomes a step's facts is `sglang_steps`; how the classes are patched is `sglang_patch`; what the
server is (provenance) is `sglang_provenance`. The steps are recorded by the engine's own recorder
(`tracer.recorder.Recorder`, through the probe's calls) writing into this process's trace writer: one recorder for
the engine and for SGLang. A verify is held open until the plan-stream fix-up hook ran and the draft extend that
carries its accept lengths was prepared; its request rows are made from the landed values when it is resolved.

Versions (`sglang_versions.facts_for`): a field the release lacks is recorded as absent, never made up, and named in
the run's `config["not_recorded"]["fields"]`; the page table is cropped by the recorded `cache_seqlens` then. From
0.5.15 a graph's metadata is computed inside the graph (`init_forward_metadata_in_graph`, a Triton kernel the
graph records and every replay re-runs): a capture is recorded after that call's warm-up run, and a replay, which
runs it inside `graph.replay()` where Python never sees it, is a step without metadata (header, requests, spans;
`config["not_recorded"]["replay_metadata"]`). `seq_lens_cpu` is recorded when the batch carries one (0.5.14+
backends do not ask for it).

What the trace says beside the steps: `run.config["sglang"]` holds the provenance (version, where the backend was
imported from, the server args that shape attention and speculation, the spec-decoding variables SGLang saw set,
GPU and kernel versions, the rank) and the features specscope does not model that this server uses (ragged verify,
unified KV pool, SWA, CP, FP8/NVFP4 KV, topk > 1). A failure of the recorder never reaches SGLang; it is stored in
the trace's `meta` row `recording_problems` (`SPECSCOPE_DEBUG=1` raises instead).

Recording never changes what the backend computes: it reads the metadata after the original call returns,
copies it (CPU: clone; CUDA: one packed non-blocking copy per device into the recorder's pinned ring, resolved when
its event completes, so nothing synchronizes; spans are device stamps), and never writes to a tensor the backend owns
(tested in tests/unit/test_sglang_integration.py).
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import platform
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from ..tracer import user_env
from ..tracer.adapter_recorder import AdapterRecorder
from ..tracer.probe import StepRecord, _PendingPack
from ..tracer.schema import ForwardMode, GraphPhase, RunInfo
from ..tracer.step_sink import InProcessSink
from ..tracer.store import TraceWriter
from . import sglang_state as state
from .sglang_patch import instrument as instrument
from .sglang_patch import instrument_class as instrument_class
from .sglang_patch import uninstrument as uninstrument
from .sglang_provenance import facts_of, installed_sglang_version, kernel_versions, module_version
from .sglang_provenance import parallel_facts as parallel_facts
from .sglang_provenance import rank_label as rank_label
from .sglang_state import BACKEND_FACTS as BACKEND_FACTS
from .sglang_state import describe
from .sglang_state import live_batch as live_batch
from .sglang_state import set_tracer_factory as set_tracer_factory
from .sglang_steps import (
    CROPPED,
    FIXUP,
    IN_GRAPH,
    Prep,
    RequestRows,
    StepBuilder,
    StepFacts,
    accept_lengths,
    columns,
    mode_of,
    snapshot_entry,
)

# The text the checker reads in run.config["not_recorded"]["replay_metadata"] (agreed with tracer/checks/).
REPLAY_METADATA_IN_GRAPH = "computed inside the graph (SGLang 0.5.15+)"


@dataclass(eq=False)
class _Step:
    """A step begun on the recorder, until it is ended (a verify waits for its fix-up hook and draft extend)."""

    rec: StepRecord
    facts: StepFacts
    backend_id: int
    hold: bool = False  # a verify waits for the plan-stream fix-up hook (or the next prep) before it is ended
    await_accept: bool = False  # ... and for the draft extend that carries its accept lengths
    accept_from: StepRecord | None = None  # that draft extend
    drafts: list[_PendingPack] = field(default_factory=list)  # the draft-token snapshot (replaced at the fix-up)


class SglangTracer:
    """Turns the instrumented backends' prep calls into steps of one trace, through the engine's recorder.

    The file is created when the first thing is recorded (or at close), so its run info holds what the backends
    constructed by then tell: the server args, the rank, the features specscope does not model. A path that
    exists (without `overwrite`) or is a directory is refused here, at once."""

    def __init__(self, path: str | os.PathLike[str], *, overwrite: bool = False, sglang_version: str | None = None,
                 config: dict[str, Any] | None = None, command: str | None = None) -> None:
        from ..tracer.errors import TraceError

        self.path = os.fspath(path)
        if os.path.isdir(self.path):
            raise TraceError("is a directory, not a trace file", self.path)
        if os.path.lexists(self.path) and not overwrite:
            raise TraceError("already exists (pass overwrite=True to replace it)", self.path)
        self._overwrite = overwrite
        self._config = dict(config or {})
        self._command = command or " ".join(sys.argv)
        self._start_ns = time.time_ns()
        self._recorder: AdapterRecorder | None = None
        self._lock = threading.RLock()
        self._builder = StepBuilder(self.note_feature)
        self._rows = RequestRows()
        self._open: list[_Step] = []  # begun, not ended, in index order
        # 0.5.15+: a capture's metadata exists once `init_forward_metadata_in_graph` ran (backend id -> the call).
        self._await_in_graph: dict[int, tuple[Any, ForwardMode, Prep, int, Any, Any, Any]] = {}
        self._problems: dict[str, dict[str, Any]] = {}  # what -> {"what", "first_step", "count", "detail"}
        self._problems_dirty = False
        self._features: list[dict[str, str]] = []  # the unmodelled features the run info names
        self._late_features: list[dict[str, str]] = []  # found after the run info was written (meta row)
        self._recorded = 0  # steps begun
        mods = state.MODULES
        self.version = sglang_version or (module_version(mods[-1]) if mods else installed_sglang_version())
        self.facts = facts_of(self.version)
        self.closed = False
        self._facts_from = state.FACTS_SEQ[0]
        state.ACTIVE.append(self)
        early, state.EARLY_PROBLEMS[:] = list(state.EARLY_PROBLEMS), []
        for what, detail in early:
            self.problem(what, detail)

    # ---- the file and its run info ------------------------------------------------------------------------
    @property
    def opened(self) -> bool:
        """Whether the trace file exists yet."""
        return self._recorder is not None

    @property
    def recorder(self) -> AdapterRecorder:
        """The recorder writing the trace (the file is created at the first use)."""
        with self._lock:
            if self._recorder is None:
                writer = TraceWriter(self.path, self._run_info(), overwrite=self._overwrite)
                cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
                device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
                self._recorder = AdapterRecorder(InProcessSink(writer), device)
                # After the writer's own exit hook, so run first: steps still pending in the recorder are written
                # before the writer closes (a server that exits without closing its tracer).
                atexit.register(self.close)
                if self._problems:
                    self._write_problems()
            return self._recorder

    def _run_info(self) -> RunInfo:
        """The run as the backends constructed so far describe it (each part guarded: a part that cannot be read
        is a recording problem and is left out)."""
        dev, cap = "cpu", None
        if torch.cuda.is_available():
            dev = torch.cuda.get_device_name()
            cap = "{}.{}".format(*torch.cuda.get_device_capability())
        versions = {"python": platform.python_version(), "torch": torch.__version__, "sglang": self.version}
        try:
            from importlib.metadata import version

            versions["specscope"] = version("specscope")
        except Exception:  # noqa: BLE001 - a source checkout without metadata
            versions["specscope"] = "unknown"
        sg: dict[str, Any] = {"version": self.version,
                              "tested": bool(self.facts is not None and self.facts.tested)}
        if not sg["tested"]:
            sg["untested"] = f"untested SGLang {self.version}"
        try:
            kernels = kernel_versions()
            versions.update(kernels)
            sg["kernels"] = kernels
        except Exception as e:  # noqa: BLE001 - provenance is best effort, and says so
            self.problem("provenance: kernel versions", describe(e))
        sg["gpu"] = {"name": dev, "capability": cap}
        if state.MODULES:
            sg["backend_file"] = str(getattr(state.MODULES[-1], "__file__", None))
        # The backends built since this tracer was made (a drive, a test), else all this process built (the hook
        # opens its tracer at the first forward, after the server built its backends).
        known = [f for f in BACKEND_FACTS if f["seq"] > self._facts_from] or list(BACKEND_FACTS)
        facts = next((f for f in known if f["model"] == "target"), known[0] if known else None)
        if facts is not None:
            sg["server_args"] = facts["server_args"]
            sg["env"] = facts["env"]
            sg["parallel"] = facts["parallel"]
        else:
            sg["server_args_source"] = "no backend constructed before the trace opened"
        seen = {f["feature"] for f in self._features}
        for bf in known:
            for f in bf["features"]:
                if f["feature"] not in seen:
                    seen.add(f["feature"])
                    self._features.append(f)
        sg["unmodelled"] = list(self._features)
        config = dict(self._config, source="sglang", sglang=sg)
        nr = self._not_recorded()
        if nr:
            config["not_recorded"] = nr
        return RunInfo(
            command=self._command, config=config,
            target_model=target_name if (target_name := user_env.get(user_env.TARGET_MODEL)) is not None
            else "sglang",
            draft_model=user_env.get(user_env.DRAFT_MODEL), device=dev, device_capability=cap,
            attention_kernel="sglang trtllm_mha", versions=versions, git_commit=None, start_ns=self._start_ns,
            hostname=socket.gethostname())

    def _not_recorded(self) -> dict[str, Any]:
        """What this release's backend does not give the recorder (the checker skips what needs it)."""
        out: dict[str, Any] = {}
        f = self.facts
        md_cls = getattr(state.MODULES[-1], "TRTLLMMHAMetadata", None) if state.MODULES else None
        fields = getattr(md_cls, "__dataclass_fields__", None)
        has_k = ("max_seq_len_k" in fields) if fields is not None else (f is None or f.has_max_seq_len_k)
        if not has_k:
            out["fields"] = {"max_seq_len_k": f"TRTLLMMHAMetadata has no max_seq_len_k in SGLang {self.version} "
                                              "(dropped in 0.5.14: the kernels get max_context_len)"}
        if self._in_graph():
            out["replay_metadata"] = REPLAY_METADATA_IN_GRAPH
        return out

    def _in_graph(self) -> bool:
        """Whether graph metadata is computed inside the graph (0.5.15+): from the facts, else from the class."""
        if self.facts is not None:
            return self.facts.graph_metadata_in_graph
        cls = getattr(state.MODULES[-1], "TRTLLMHAAttnBackend", None) if state.MODULES else None
        return cls is not None and IN_GRAPH in vars(cls)

    # ---- what could not be recorded --------------------------------------------------------------------
    def problem(self, what: str, detail: str, step: int | None = None) -> None:
        """Count one recording failure under `what`; the trace's `meta.recording_problems` says it (written at
        the first of each kind, then as counts double and at every flush)."""
        with self._lock:
            ent = self._problems.get(what)
            if ent is None:
                ent = self._problems[what] = {"what": what, "first_step": step, "count": 0,
                                              "detail": " ".join(detail.split())[:2000]}
            ent["count"] += 1
            self._problems_dirty = True
            n = ent["count"]
            if self._recorder is not None and n & (n - 1) == 0:  # 1, 2, 4, ...: a killed server shows them grow
                self._write_problems()

    def _write_problems(self) -> None:
        assert self._recorder is not None, "problems are written once the file exists"
        self._recorder.writer.write_meta("recording_problems", json.dumps(list(self._problems.values())))
        self._problems_dirty = False

    def next_index(self) -> int:
        """The index the next recorded step gets."""
        return self._recorder.next_index if self._recorder is not None else 0

    def note_feature(self, feature: str, detail: str, source: str) -> None:
        """A feature specscope does not model, seen in a step or a backend after the run info was written: kept
        in `meta.unmodelled_features` (the run info's list plus these)."""
        with self._lock:
            known = {f["feature"] for f in self._features + self._late_features}
            if feature in known:
                return
            entry = {"feature": feature, "detail": detail, "source": source}
            if self._recorder is None:
                self._features.append(entry)
                return
            self._late_features.append(entry)
            self._recorder.writer.write_meta("unmodelled_features",
                                             json.dumps(self._features + self._late_features))

    # ---- prep calls --------------------------------------------------------------------------------------
    def timing(self) -> tuple[int, Any]:
        """A prep call's start: host ns, and on a GPU outside stream capture a device stamp on the current stream."""
        start = time.perf_counter_ns()
        if torch.cuda.is_available() and torch.cuda.is_initialized() and \
                not torch.cuda.is_current_stream_capturing():
            stream = torch.cuda.current_stream()
            return start, (self.recorder.mark(stream), stream)
        return start, None

    def record_prep(self, backend: Any, prep: Prep, start_ns: int, mark: Any, error: BaseException | None) -> None:
        """One finished prep call of `backend` (successful or not)."""
        with self._lock:
            self._finish_held(backend)
            mode = mode_of(prep.fb)
            if mode is None:
                return
            ctx = (state.LIVE.get(), state.WRAPPER.get())
            if prep.phase == GraphPhase.CAPTURE and prep.in_capture and error is None and self._in_graph():
                # 0.5.15+: out_graph only bound the buffers; the values come with init_forward_metadata_in_graph.
                self._await_in_graph[id(backend)] = (backend, mode, prep, start_ns, mark, *ctx)
                return
            with_md = not (prep.phase == GraphPhase.REPLAY and self._in_graph())
            self._add(self._begin(backend, mode, prep, start_ns, mark, error, *ctx, with_metadata=with_md))

    def record_in_graph(self, backend: Any, error: BaseException | None) -> None:
        """`init_forward_metadata_in_graph` returned on `backend`: a capture waiting for it is recorded now, with
        the values it wrote (on a CUDA device only outside stream capture: a copy inside would join the graph)."""
        with self._lock:
            held = self._await_in_graph.pop(id(backend), None)
            if held is None:
                return  # a replay's (a driver or a debug replay calls it): replays are recorded at out_graph
            be, mode, prep, start_ns, mark, live, wrap = held
            capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
            if capturing:
                self.problem("capture metadata not recorded",
                             "init_forward_metadata_in_graph ran only under CUDA-graph stream capture (no warm-up "
                             "run), where a copy of its output would join the graph", self.next_index())
            self._add(self._begin(be, mode, prep, start_ns, None if capturing else mark, error, live, wrap,
                                  with_metadata=not capturing))

    def _flush_in_graph(self, backend_id: int | None) -> None:
        """Captures whose in_graph call never came (the backend moved on, or the trace closes): written without
        metadata, and said."""
        for bid in [k for k in self._await_in_graph if backend_id is None or k == backend_id]:
            be, mode, prep, start_ns, mark, live, wrap = self._await_in_graph.pop(bid)
            self.problem("capture metadata not recorded",
                         "init_forward_metadata_in_graph did not follow the capture's init_forward_metadata_out_graph "
                         "(SGLang 0.5.15+ computes the graph's metadata there)", self.next_index())
            self._add(self._begin(be, mode, prep, start_ns, mark, None, live, wrap, with_metadata=False))

    def _begin(self, be: Any, mode: ForwardMode, prep: Prep, start_ns: int, mark: Any, error: BaseException | None,
               live: Any, wrap: Any, *, with_metadata: bool) -> _Step:
        """A step begun and numbered on the recorder, its tensors snapshot, its spans and errors recorded."""
        facts = self._builder.build(be, mode, prep, start_ns, error, live, wrap, with_metadata=with_metadata)
        r = self.recorder
        rec = r.begin_step(**facts.header)
        assert rec is not None, "the recorder records every step it begins"
        rec.start_ns, rec.end_ns, rec.scalars = facts.start_ns, facts.end_ns, facts.scalars
        r.assign_index(rec)  # numbered at its prep, in the order the server prepared its forwards
        self._recorded += 1
        r.snapshot_tensors(rec, facts.tensors, facts.crop, hidden=facts.hidden)
        step = _Step(rec, facts, id(be))
        if facts.draft_tokens is not None:
            step.drafts = r.snapshot_tensors(rec, [snapshot_entry("draft_tokens", facts.draft_tokens)], {},
                                             hidden=facts.hidden)
        r.add_span(rec, "host", "metadata", facts.start_ns, facts.end_ns)
        if mark is not None:
            start, stream = mark
            r.add_span(rec, self._builder.stream_name(mode, stream), "metadata", start, r.mark(stream))
        for call, err in facts.errors:
            r.error(rec, call, err)
        step.hold = step.await_accept = (mode == ForwardMode.TARGET_VERIFY and prep.phase != GraphPhase.CAPTURE
                                         and error is None)
        return step

    def _add(self, step: _Step) -> None:
        if step.rec.mode == ForwardMode.DRAFT_EXTEND and any(t[0] == "accept_lens" for t in step.facts.tensors):
            # Spec v2: the draft extend after a verify carries that verify's accept lengths.
            for q in self._open:
                if q.await_accept:
                    q.accept_from, q.await_accept, q.hold = step.rec, False, False
        self._open.append(step)
        self._end_ready()

    def _end_ready(self) -> None:
        """End the steps nothing holds any more, and let the recorder write what has landed."""
        for step in [s for s in self._open if not (s.hold or s.await_accept)]:
            self._open.remove(step)
            after = [step.accept_from] if step.accept_from is not None else []
            self.recorder.end_step(step.rec, finish=functools.partial(self._finish, step), after=after)
        self.recorder.poll()

    def _finish(self, step: _Step, rec: StepRecord) -> None:
        """Complete a step from its landed values (the recorder calls it when it resolves the step, in index order):
        the live crop, the request rows, a verify's drafts and accept lengths."""
        r, facts = self.recorder, step.facts
        values = r.values(rec)
        if facts.crop_live and "cache_seqlens" in values:
            # The pages the kernels read: ceil(cache_seqlens / P) for every row the metadata holds.
            cs = values["cache_seqlens"]
            width = max(-(-int(cs.max()) // rec.page_size) if cs.size else 0, 0)
            for name in CROPPED:
                facts.crop[name] = min(facts.crop[name], width)
        if facts.req_args is None:
            return
        rows = self._rows.rows(values, facts.req_args)
        rec.batch_size = len(rows)
        tok = values.get("draft_tokens")  # also when hidden: the request rows carry the drafts either way
        T = rec.tokens_per_request
        if tok is not None and rec.mode == ForwardMode.TARGET_VERIFY and tok.size >= len(rows) * T:
            drafts = tok.reshape(-1)[: len(rows) * T].reshape(len(rows), T)
            for b, row in enumerate(rows):  # the root (the last verify's bonus token) is not a draft
                row["draft_tokens"] = tuple(int(x) for x in drafts[b, 1:])
        if rec.mode == ForwardMode.TARGET_VERIFY:
            got = accept_lengths(r.values(step.accept_from)) if step.accept_from is not None else {}
            rec.scalars["acceptance_recorded"] = int(self._rows.accept(rows, got))
        rec.requests = columns(rows)

    def record_fixup(self, backend: Any, spec_info: Any, error: BaseException | None) -> None:
        """The plan-stream fix-up hook ran for the verify `backend` just prepared (or raised)."""
        with self._lock:
            held = [s for s in self._open if s.hold and s.backend_id == id(backend)]
            if not held:
                return
            step = held[-1]
            r = self.recorder
            step.rec.scalars.update(plan_stream=1, fixup_hook_ok=int(error is None))
            if error is not None:
                r.error(step.rec, FIXUP, error)
            else:
                tok = getattr(spec_info, "draft_token", None)
                if isinstance(tok, torch.Tensor):  # final now: the hook runs after the compute stream's wait
                    r.drop_snapshot(step.rec, step.drafts)
                    step.drafts = r.snapshot_tensors(step.rec, [snapshot_entry("draft_tokens", tok)], {},
                                                     hidden=step.facts.hidden)
            step.hold = False
            if error is not None:
                step.await_accept = False  # nothing after this: SGLang raises
            self._end_ready()
            if error is not None:
                self.flush()  # the server is about to die of this exception: keep the evidence

    def _finish_held(self, backend: Any) -> None:
        # The backend prepares its next forward: whatever its held verify was waiting for will not come.
        self._flush_in_graph(id(backend))
        released = False
        for s in self._open:
            if s.backend_id == id(backend) and (s.hold or s.await_accept):
                s.hold = s.await_accept = False
                released = True
        if released:
            self._end_ready()

    def flush(self) -> None:
        """Write every recorded step (waits for its copies) and commit."""
        with self._lock:
            self._flush_in_graph(None)
            for s in self._open:
                s.hold = s.await_accept = False
            if self._open:
                self._end_ready()
            r = self.recorder  # creates the file the problems go into
            if self._problems_dirty:
                self._write_problems()
            r.flush()

    def close(self) -> None:
        """Flush and close the trace (created now if nothing was recorded, with the reason); the patched classes
        stop recording into it."""
        if self.closed:
            return
        with self._lock:
            self._flush_in_graph(None)
            if self._recorded == 0 and not self._problems:
                what = "nothing recorded"
                detail = ("no instrumented TRTLLM MHA backend prepared a forward while the trace was open"
                          if state.MODULES else "no trtllm_mha_backend module was instrumented in this process")
                self.problem(what, detail)
            self.flush()
            self.recorder.close()
            self.closed = True
            atexit.unregister(self.close)
        if self in state.ACTIVE:
            state.ACTIVE.remove(self)
