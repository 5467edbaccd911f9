"""One model with its KV pool, its TRTLLM MHA backends and its graph runners; runs and records forwards.

A forward runs in two halves, as SGLang splits it: `prepare` (metadata: eager init, or the graph's buffer fill
and `_apply`; this is the half the overlap plan stream runs) and `execute` (compute stream: the draft-dependent
inputs, the snapshot of what the kernels will consume, the forward or graph replay).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

import torch

from ..tracer.probe import Probe, StepRecord, is_sticky_cuda_error
from ..tracer.schema import ForwardMode, GraphPhase
from .forward_batch import ForwardBatch
from .graph_runner import GraphRunner
from .memory import KVPool, ReqToTokenPool
from .model import LlamaForCausalLM
from .trtllm_mha_backend import AttentionKernels, MissingFixupHookBackend, TRTLLMHABackend


@dataclass
class Prepared:
    """A forward whose metadata is ready: the batch the kernels will see, and the runner if it is a replay."""

    fb: ForwardBatch
    backend: TRTLLMHABackend
    runner: GraphRunner | None
    live: ForwardBatch


class ModelRunner:
    """A target or draft model on the engine's device, with everything its forwards need."""

    def __init__(
        self, *, name: str, model: LlamaForCausalLM, num_layers: int, num_kv_heads: int, head_dim: int,
        dtype: torch.dtype, r2t: ReqToTokenPool, num_kv_pages: int, page_size: int,
        max_context_len: int, num_draft_tokens: int, num_draft_steps: int, kernels: AttentionKernels,
        device: torch.device, faults: frozenset[str], recorder: Probe,
        num_q_heads: int = 0, max_bs: int = 1, tokens_per_req: int = 1, attention_every: int = 0,
    ) -> None:
        self.name = name
        self.model = model
        self.r2t = r2t
        self.page_size = page_size
        self.num_kv_pages = num_kv_pages
        self.device = device
        self.recorder: Probe = recorder  # the tracer's Recorder, or NullProbe with tracing off
        self.faults = faults
        self.kv_pool = KVPool(num_layers, num_kv_pages, page_size, num_kv_heads, head_dim, dtype, device)
        missing_hook = name == "target" and "missing-fixup-hook" in faults
        target_cls = MissingFixupHookBackend if missing_hook else TRTLLMHABackend

        def make(cls: type[TRTLLMHABackend], step: int) -> TRTLLMHABackend:
            return cls(req_to_token_pool=r2t, kv_pool=self.kv_pool, page_size=page_size,
                       max_context_len=max_context_len, num_draft_tokens=num_draft_tokens, kernels=kernels,
                       device=device, speculative_step_id=step, faults=faults)

        self.backend = make(target_cls, 0)
        # One backend per draft step, as TRTLLMHAAttnMultiStepDraftBackend builds them.
        self.draft_backends = [make(TRTLLMHABackend, i) for i in range(num_draft_steps)]
        self.runners: dict[tuple[ForwardMode, int | None], GraphRunner] = {}
        self.attention_every = attention_every if recorder.enabled else 0
        if self.attention_every:
            for be in [self.backend, *self.draft_backends]:
                be.enable_probe(max_bs * tokens_per_req, num_q_heads, head_dim, dtype)
        self._strided = torch.arange(0, max_context_len + page_size, page_size, device=device)
        self.max_context_len = max_context_len
        # The engine's compute stream (its forwards' spans are stamped on it); None on the CPU.
        self.compute_stream: torch.cuda.Stream | None = None
        self._layouts: dict[tuple[Any, ...], Any] = {}  # snapshot layouts by the (address, shape) of each tensor
        # A replay's: by the address and the object of each tensor (a graph's buffers come back every replay). An
        # entry holds its tensors, so their ids are not reused while it is cached, and a tensor object's shape is
        # fixed: reading 8 shapes per step costs more than the rest of the key.
        self._replay_layouts: dict[tuple[Any, ...], tuple[Any, list[torch.Tensor]]] = {}
        self._crops: dict[int, dict[str, int]] = {}
        # A traced replay's snapshot record (layout, scalars, host mirror) is made at the next poll
        # (`Recorder.later`), not between launches; the graph runners and backends whose record is still to be made
        # (it is made before either, or any eager forward, is prepared again).
        self._deferred_for: set[Any] = set()  # GraphRunners and TRTLLMHABackends

    def backend_for(self, mode: ForwardMode, step_id: int | None) -> TRTLLMHABackend:
        """The backend that serves a forward mode (draft decode step i has its own)."""
        if mode == ForwardMode.DRAFT_DECODE:
            assert step_id is not None  # every draft decode forward is one numbered draft step
            return self.draft_backends[step_id]
        return self.backend

    # ---- graphs --------------------------------------------------------------------------------------
    def capture_graphs(self, modes: Sequence[tuple[ForwardMode, int | None, int]], max_bs: int,
                       template: ForwardBatch, ladder: list[int] | None = None,
                       on_captured: Callable[[], None] | None = None) -> None:
        """Capture (mode, step_id, tokens/request) for every ladder size; each capture is a recorded step, and
        `on_captured` is called after each (the engine counts captures among its forwards)."""
        self._run_later()
        for mode, step_id, tpr in modes:
            backend = self.backend_for(mode, step_id)
            backend.init_cuda_graph_state(max_bs, max_bs * tpr)

            def ring_write(fb: ForwardBatch, be: TRTLLMHABackend = backend) -> int:
                return self.write_snapshot_row(be, fb)

            runner = GraphRunner(
                name=f"{self.name}:{mode.value}:{step_id}", mode=mode, forward=self.model.forward, backend=backend,
                template=_with(template, mode, step_id, backend), max_bs=max_bs, tokens_per_req=tpr,
                device=self.device, pad_seq_len_from_live="padded-row-seqlen" in self.faults,
                ladder=ladder, stamps=self.recorder.compute_stamps,
                ring_write=ring_write if self.recorder.enabled else None)
            self.runners[(mode, step_id)] = runner
            # Largest batch first, as SGLang captures: smaller graphs reuse the memory pool the largest allocated.
            for bs in reversed(runner.ladder):
                rec = self.recorder.begin_step(
                    iteration=-1, mode=mode, model=self.name, step_id=step_id, batch_size=bs,
                    padded_batch_size=bs, graph=GraphPhase.CAPTURE, tokens_per_request=tpr,
                    num_draft_tokens=backend.speculative_num_draft_tokens, page_size=self.page_size)
                fb = runner.prepare_capture(bs)
                self.recorder.fired(rec, backend.take_fired())
                with self._record_failure(rec, backend, fb):
                    runner.capture_forward(fb)
                if rec is not None:
                    self.record_snapshot(rec, backend, fb)
                    self.recorder.end_step(rec)
                if on_captured is not None:
                    on_captured()

    def _record_failure(self, rec: StepRecord | None, backend: TRTLLMHABackend, fb: ForwardBatch) -> _RecordFailure:
        """If the forward raises (a kernel rejecting its arguments, a sticky CUDA error), still record the step:
        the error as a CallError (the call, the exception type, its message verbatim) and, unless the device is
        gone, the metadata the kernel was handed. The catalogue decides what it means (K1)."""
        return _RecordFailure(self, rec, backend, fb)

    def _failed(self, rec: StepRecord | None, backend: TRTLLMHABackend, fb: ForwardBatch, e: Exception) -> None:
        fatal = is_sticky_cuda_error(e)
        call, backend.calling = backend.calling or "forward", None
        if rec is not None:
            self.recorder.error(rec, call, e, fatal=fatal)
            if not fatal:
                self.record_snapshot(rec, backend, fb)
            self.recorder.end_step(rec)

    # ---- one forward ---------------------------------------------------------------------------------
    def begin(self, live: ForwardBatch, iteration: int, num_draft_tokens: int) -> tuple[StepRecord | None, Any]:
        """Open the step record for a forward of `live` (eager, or a replay of the matching graph)."""
        return self.begin_for(live.forward_mode, live.spec_step_id, live.batch_size, _tokens_per_request(live),
                              iteration, num_draft_tokens)

    def begin_for(self, mode: ForwardMode, step_id: int | None, batch_size: int, tokens_per_request: int,
                  iteration: int, num_draft_tokens: int) -> tuple[StepRecord | None, Any]:
        """Open the step record of a forward before its batch exists (so spans of its producers can go on it)."""
        runner = self.runners.get((mode, step_id))
        padded = runner.padded_size(batch_size) if runner else batch_size
        rec = self.recorder.begin_step(
            iteration=iteration, mode=mode, model=self.name, step_id=step_id, batch_size=batch_size,
            padded_batch_size=padded, graph=GraphPhase.REPLAY if runner else GraphPhase.EAGER,
            tokens_per_request=tokens_per_request, num_draft_tokens=num_draft_tokens, page_size=self.page_size)
        return rec, runner

    def prepare(self, live: ForwardBatch, runner: GraphRunner | None, rec: StepRecord | None = None) -> Prepared:
        """Metadata for the forward: `_apply` into the graph's buffers, or eager init (faults that changed it are
        noted on `rec`, for fault accounting)."""
        backend = self.backend_for(live.forward_mode, live.spec_step_id)
        if self._deferred_for and (runner is None or runner in self._deferred_for or backend in self._deferred_for):
            self._run_later()  # what a deferred record reads (the graph's buffers, the backend's metadata) changes now
        if runner is None:
            live.attn_backend = backend
            backend.init_forward_metadata(live)
            prep = Prepared(live, backend, None, live)
        else:
            prep = Prepared(runner.replay_prepare(live), backend, runner, live)
        self.recorder.fired(rec, backend.take_fired())
        return prep

    def execute(self, prep: Prepared, rec: StepRecord | None,
                logits_indices: torch.Tensor | None = None) -> torch.Tensor:
        """Run the forward (compute stream); returns float32 logits `[live num_tokens, vocab]`, or only the rows in
        `logits_indices` int64 `[n]` when given (eager steps compute only those: an 8B vocab over a whole prefill
        would not fit)."""
        if rec is not None:
            self.recorder.assign_index(rec)  # numbered at launch, so --record-attention N can sample by index
        span = self.recorder.span
        if prep.runner is not None:
            prep.runner.copy_draft_dependent_inputs(prep.live, prep.fb.batch_size)
            stamps = prep.runner.stamps
            with self._record_failure(rec, prep.backend, prep.fb):
                # Traced, the graph stamps its own span ("forward": first node to last).
                if rec is not None and stamps is not None:
                    logits = prep.runner.replay(prep.fb, prep.live.num_tokens)
                    self.recorder.graph_span(rec, "compute", "forward", stamps)
                else:
                    with span(rec, "compute", "forward", self.compute_stream):
                        logits = prep.runner.replay(prep.fb, prep.live.num_tokens)
            if rec is not None:
                # The replay's ring row is numbered now (launch order); the rest of its record reads objects nothing
                # changes before this runner is prepared again, so it is made at the next poll, where the host waits
                # for the GPU, not here, where the GPU may be waiting for the next launch (the row's length too: it is
                # the captured graph's).
                recorder = self.recorder
                seq = recorder.claim_row()
                self._deferred_for.update((prep.runner, prep.backend))
                recorder.later(self._record_replay, rec, prep.backend, prep.fb, seq, prep.runner)
                self.record_attention(rec, prep, replayed=self.device.type == "cuda")
            return logits if logits_indices is None else logits[logits_indices]
        with self._record_failure(rec, prep.backend, prep.fb), span(rec, "compute", "forward", self.compute_stream):
            logits = self.model.forward(prep.fb.input_ids, prep.fb.positions, prep.fb,
                                        logits_indices=logits_indices)
        if rec is not None:
            self.record_snapshot(rec, prep.backend, prep.fb)
            self.record_attention(rec, prep, replayed=False)
        return logits

    def _run_later(self) -> None:
        if self._deferred_for:  # records are deferred only while tracing
            self.recorder.run_later()

    def _record_replay(self, rec: StepRecord, backend: TRTLLMHABackend, fb: ForwardBatch, seq: int,
                       runner: GraphRunner) -> None:
        """A replay's deferred record: its snapshot-ring row `seq` holds `runner.ring_len` values of `fb`'s metadata."""
        self._deferred_for.discard(runner)
        self._deferred_for.discard(backend)
        ring_len = runner.ring_len(fb.batch_size)
        # A step is recorded only while tracing, and a traced engine's graphs write the snapshot ring.
        assert ring_len > 0
        self.record_snapshot(rec, backend, fb, ring_len, seq)

    def record_attention(self, rec: StepRecord, prep: Prepared, replayed: bool) -> None:
        """On sampled steps, keep layer 0's q, output and the KV pages its live rows use (differential check).

        Finding the pages is data-dependent, so a sampled step synchronizes the GPU once; unsampled steps
        never do."""
        if not self.attention_every or rec.index % self.attention_every:
            return
        be, fb = prep.backend, prep.fb
        got = be.probe_result(fb.num_tokens, replayed)
        if got is None:
            return
        q, out = got
        md, p, bs = be.forward_metadata, self.page_size, prep.live.batch_size
        width = -(-md.max_seq_len_k // p)
        starts = self.r2t.req_to_token[fb.req_pool_indices[:bs, None], self._strided[None, :width]]
        ids = torch.unique(torch.cat([md.page_table[:bs, :width].reshape(-1), (starts // p).reshape(-1)]))
        kv = be.kv_pool.kv_buffer[0][ids.long()]
        snap = self.recorder.snapshot_float
        # At the tensors' own width (a bf16 pool as its raw 16-bit patterns, half the bytes of float32), with the
        # dtype named in attn_dtype; the torch-free decoder widens exactly (tracer/attention_call.py).
        bits = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float64: torch.int64}
        for name, t in (("attn_q", q), ("attn_out", out), ("attn_kv", kv)):
            snap(rec, name, t.view(bits[t.dtype]) if t.dtype in bits else t)
        dtype_name = str(kv.dtype).removeprefix("torch.")
        snap(rec, "attn_dtype", torch.tensor(list(dtype_name.encode("ascii")), dtype=torch.uint8))
        snap(rec, "attn_page_ids", ids.to(torch.int32))
        snap(rec, "attn_scaling", torch.tensor([self.model.attention_layers[0].scaling], dtype=torch.float32))
        # The kernel's arguments as forward_decode / forward_extend pass them for this mode, so `replay` and the
        # differential check re-run one recorded call (fields: tracer/attention_call.py CALL_FIELDS).
        n, mode = fb.num_tokens, fb.forward_mode
        mask = None
        if mode in (ForwardMode.DECODE, ForwardMode.DRAFT_DECODE, ForwardMode.TARGET_VERIFY):
            ql = md.kernel_q_len if mode == ForwardMode.TARGET_VERIFY else 1
            mask = be.spec_mask(n // ql, ql) if mode == ForwardMode.TARGET_VERIFY else None
            call = [0, ql, be.max_context_len, n // ql, p, n, int(mask is not None)]
        else:
            call = [1, md.kernel_q_len, be.max_context_len, md.cu_seqlens_q.shape[0] - 1, p, n, 0]
        snap(rec, "attn_call", torch.tensor(call, dtype=torch.int64))
        if mask is not None:
            snap(rec, "attn_mask", mask.view(torch.int16))  # uint16 has no numpy twin in the recorder

    @staticmethod
    def _metadata_values(backend: TRTLLMHABackend, fb: ForwardBatch) -> list[torch.Tensor]:
        """The metadata the kernels consume and the inputs behind it, in `_METADATA_NAMES` order (no kernel runs to
        list them)."""
        md = backend.forward_metadata
        return [md.cache_seqlens_int32, md.cu_seqlens_q, md.cu_seqlens_k, md.page_table, fb.seq_lens,
                fb.req_pool_indices, fb.out_cache_loc, fb.positions]

    @classmethod
    def _metadata_tensors(cls, backend: TRTLLMHABackend, fb: ForwardBatch) -> list[tuple[str, torch.Tensor]]:
        """`_metadata_values` with their names."""
        return list(zip(_METADATA_NAMES, cls._metadata_values(backend, fb), strict=True))

    def max_pack_len(self, max_bs: int, tokens_per_req: int) -> int:
        """An upper bound on `pack_snapshot`'s length for a graph of `max_bs` rows (what a ring row must hold)."""
        pages = -(-self.max_context_len // self.page_size)
        return max_bs * (5 + 2 * pages + 2 * tokens_per_req) + 2

    def pack_snapshot(self, backend: TRTLLMHABackend, fb: ForwardBatch) -> torch.Tensor:
        """All snapshot tensors in one int64 vector, so recording costs one device->host copy per step
        (and, inside a CUDA graph, no host work at all: the graph computes it on every replay)."""
        cols = self._strided[None, : backend.forward_metadata.page_table.shape[1]]
        starts = self.r2t.req_to_token[fb.req_pool_indices[:, None], cols]
        tensors = [*self._metadata_values(backend, fb), starts]
        return torch.cat([t.reshape(-1).to(torch.int64) for t in tensors])

    def write_snapshot_row(self, backend: TRTLLMHABackend, fb: ForwardBatch) -> int:
        """Write `pack_snapshot`'s values into the recorder's snapshot ring (its current row; device ops only, so a
        graph captures them) and return their number: one kernel where the ring has a packer (GPU with Triton) and
        the row is small enough for it, else the torch pack and a row copy."""
        # A graph writes ring rows only where the ring was open when it was captured (and it stays open).
        ring = self.recorder.ring
        assert ring is not None
        if ring.packer is not None:
            parts = [t.reshape(-1) for t in self._metadata_values(backend, fb)]
            cols = backend.forward_metadata.page_table.shape[1]
            if ring.packer.takes(parts, fb.req_pool_indices, cols):
                return ring.packer.write(parts, self.r2t.req_to_token, fb.req_pool_indices, cols, self.page_size)
        packed = self.pack_snapshot(backend, fb)
        ring.write(packed)
        return packed.numel()

    def record_snapshot(self, rec: StepRecord, backend: TRTLLMHABackend, fb: ForwardBatch, ring_len: int = 0,
                        seq: int | None = None) -> None:
        """Hand the packed snapshot (eager steps and captures pack it here) to the recorder with its layout, and the
        scalars the checks need. A replay that wrote `ring_len` values into the recorder's snapshot ring hands over
        its row instead (`seq`: the row's number, when it was claimed at launch)."""
        md, p = backend.forward_metadata, self.page_size
        replay = ring_len > 0
        width = -(-md.max_seq_len_k // p)
        # Same order as pack_snapshot; the layout comes from shapes and addresses alone, read on every step (a
        # replay's addresses are what I15 checks), and is built once per distinct set of tensors and addresses.
        tensors = self._metadata_values(backend, fb)
        hit = None
        if replay:
            rkey = (*map(_DATA_PTR, tensors), *map(id, tensors))
            hit = self._replay_layouts.get(rkey)
        if hit is not None:
            layout = hit[0]
        else:
            key = tuple([(t.data_ptr(), t.shape) for t in tensors])
            layout = self._layouts.get(key)
            if layout is None:
                full = [(name, t.dtype, tuple(t.shape), t.data_ptr())
                        for name, t in zip(_METADATA_NAMES, tensors, strict=True)]
                full.append(("req_to_token_page_starts", self.r2t.req_to_token.dtype,
                             (fb.req_pool_indices.shape[0], md.page_table.shape[1]), 0))
                if len(self._layouts) >= 4096:
                    self._layouts.clear()
                layout = self._layouts[key] = self.recorder.intern_layout(full)
            if replay:
                if len(self._replay_layouts) >= 256:  # a backend that makes new tensors per replay (I15)
                    self._replay_layouts.clear()
                self._replay_layouts[rkey] = (layout, tensors)
        crop = self._crops.get(width)
        if crop is None:
            crop = self._crops[width] = {"page_table": width, "req_to_token_page_starts": width}
        if replay:
            self.recorder.snapshot_ring(rec, ring_len, layout, crop, seq)
        else:
            self.recorder.snapshot_pack(rec, self.pack_snapshot(backend, fb), layout, crop_cols=crop)
        scalars = {
            "max_seq_len_q": md.max_seq_len_q, "kernel_q_len": md.kernel_q_len, "max_seq_len_k": md.max_seq_len_k,
            "max_context_len": backend.max_context_len, "num_kv_pages": self.num_kv_pages,
            "seq_len_fill_value": backend.get_cuda_graph_seq_len_fill_value(),
            "backend_num_draft_tokens": backend.speculative_num_draft_tokens,
            "speculative_step_id": backend.speculative_step_id}
        if rec.scalars:
            rec.scalars.update(scalars)
        else:
            rec.scalars = scalars
        # The host mirror the backend sized its refresh from, as it is now (checked against device seq_lens).
        self.recorder.snapshot_host(rec, "seq_lens_cpu", fb.seq_lens_cpu)
        if md.captured_max_seq_len_q is not None:
            rec.scalars["captured_max_seq_len_q"] = md.captured_max_seq_len_q


class _RecordFailure:
    """`ModelRunner._record_failure`'s context manager (a small class: it wraps every replay, traced or not, and a
    generator-based one cost µs each)."""

    __slots__ = ("runner", "rec", "backend", "fb")

    def __init__(self, runner: ModelRunner, rec: StepRecord | None, backend: TRTLLMHABackend,
                 fb: ForwardBatch) -> None:
        self.runner, self.rec, self.backend, self.fb = runner, rec, backend, fb

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        if isinstance(exc, Exception):
            self.runner._failed(self.rec, self.backend, self.fb, exc)
        return False  # the exception goes on


_METADATA_NAMES = ("cache_seqlens", "cu_seqlens_q", "cu_seqlens_k", "page_table", "seq_lens", "req_pool_indices",
                   "out_cache_loc", "positions")
_DATA_PTR = torch.Tensor.data_ptr


def request_states(
    reqs: list[Any], seq_before: list[int], seq_after: list[int], q_lens: list[int],
    drafts: list[list[int]] | None = None, accepted: list[list[int]] | None = None,
) -> dict[str, list[Any]]:
    """Per-request state of a step's live rows, as columns (RequestState fields; built in the writer process)."""
    cols: dict[str, list[Any]] = {
        "request_id": [r.request_id for r in reqs], "slot": [r.slot for r in reqs], "seq_len_before": seq_before,
        "seq_len_after": seq_after, "num_q_tokens": q_lens,
        "accept_length": [len(a) for a in accepted] if accepted else [0] * len(reqs)}
    if drafts:
        cols["draft_tokens"] = drafts
    if accepted:
        cols["accepted_tokens"] = accepted
    return cols


def _tokens_per_request(fb: ForwardBatch) -> int:
    if fb.extend_seq_lens_cpu:
        return max(fb.extend_seq_lens_cpu)
    return fb.num_tokens // max(fb.batch_size, 1)


def _with(t: ForwardBatch, mode: ForwardMode, step_id: int | None, backend: TRTLLMHABackend) -> ForwardBatch:
    return ForwardBatch(
        forward_mode=mode, batch_size=t.batch_size, input_ids=t.input_ids, positions=t.positions,
        seq_lens=t.seq_lens, seq_lens_cpu=t.seq_lens_cpu, req_pool_indices=t.req_pool_indices,
        out_cache_loc=t.out_cache_loc, req_to_token_pool=t.req_to_token_pool, token_to_kv_pool=t.token_to_kv_pool,
        attn_backend=backend, spec_step_id=step_id)
