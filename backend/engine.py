"""The engine: requests arrive and finish; each iteration prefills newcomers, then runs the EAGLE loop as SGLang's
spec-v2 worker does (topk=1 chain, N drafts, T = N+1 verified tokens per request): N-1 draft decodes (the first
draft token comes from the previous draft extend's logits) -> target verify -> accept on the device -> draft extend
over the verified tokens, whose logits at the last accepted position give the next first draft token. Plain
decode when there is no draft. Every forward goes through the TRTLLM MHA backend and is recorded through the probe
(`tracer.probe`; `NullProbe` with tracing off). The engine numbers its forwards itself (graph captures included, in
the order they are launched, as the trace numbers its steps) and after each one calls `on_step_end`, where a live
viewer can hold the run (`backend/control.py`), recorded or not.

Sequence conventions (SGLang spec v2): a running request has `seq_len` = S committed KV positions in the target
and a root token (the newest output) at position S that is not in the target's KV cache yet. The draft reads token
p+1 at position p, as an EAGLE draft does (its prefill is over prompt[1:] + the first output token), so the draft
has consumed the root and draft step i writes position S+i.

Host/device traffic per steady-state iteration: one pinned non-blocking upload of the batch's host inputs (slots,
seq_lens, new pages) and one read of the accept result (drafts, verified tokens, accept lengths) — the only
synchronization; positions, KV slots, draft tokens, acceptance and the next roots stay on the device.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ..tracer.probe import Probe, StepRecord
from ..tracer.schema import ForwardMode, RequestRecord
from .engine_config import EngineConfig
from .forward_batch import ForwardBatch
from .host_inputs import HostInputs
from .memory import PageAllocator, PageWrites, ReqToTokenPool, RequestKV
from .model import LlamaForCausalLM
from .model_config import ModelConfig
from .model_runner import ModelRunner, request_states
from .request import Request
from .run_stats import RunStats, StepCallback
from .sampling import greedy_accept_device, rejection_accept_device, sample_device
from .streams import Streams, nvtx, nvtx_wanted

if TYPE_CHECKING:
    from ..tracer.probe import RequestColumns


class Engine:
    """Drives real draft/verify steps for a list of requests."""

    def __init__(self, cfg: EngineConfig, target: tuple[LlamaForCausalLM, ModelConfig],
                 draft: tuple[LlamaForCausalLM, ModelConfig] | None, kernels: Any, recorder: Probe,
                 on_step_end: StepCallback | None = None) -> None:
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.recorder: Probe = recorder  # the tracer's Recorder, or NullProbe with tracing off
        self.on_step_end = on_step_end
        # Forwards launched so far, graph captures included: the next forward's step index. The recorder numbers
        # steps in the same order (`Recorder.assign_index` at launch, `end_step` for a capture), so with recording on
        # the index reported to `on_step_end` is the trace's.
        self.forwards = 0
        spec_draft = draft if cfg.spec_steps > 0 else None  # a draft runs only when the run speculates
        self.spec = spec_draft is not None
        self.T = cfg.verify_tokens if self.spec else 1
        self.K = cfg.spec_steps + 1 if self.spec else 1  # what the backend caches at construction
        self.num_drafts = self.T - 1  # N draft tokens per request and iteration
        self.num_draft_steps = max(self.T - 2, 0)  # draft decode forwards: the first draft comes from draft extend
        p = cfg.page_size
        self.r2t = ReqToTokenPool(cfg.batch_size, cfg.max_context_len, self.device)
        pages_per_req = -(-cfg.max_context_len // p)
        num_pages = cfg.batch_size * pages_per_req + 2
        self.pages = PageAllocator(num_pages, p)
        common = dict(dtype=cfg.torch_dtype, r2t=self.r2t, num_kv_pages=num_pages,
                      page_size=p, max_context_len=cfg.max_context_len, num_draft_tokens=self.K,
                      kernels=kernels, device=self.device, faults=cfg.faults, recorder=recorder)
        common.update(max_bs=cfg.batch_size, tokens_per_req=self.T, attention_every=cfg.record_attention)
        tm, tc = target
        self.target = ModelRunner(name="target", model=tm, num_layers=tc.num_hidden_layers,
                                  num_kv_heads=tc.num_key_value_heads, head_dim=tc.head_dim,
                                  num_q_heads=tc.num_attention_heads, num_draft_steps=0, **common)
        self.draft: ModelRunner | None = None  # exactly when self.spec
        if spec_draft is not None:
            dm, dc = spec_draft
            self.draft = ModelRunner(name="draft", model=dm, num_layers=dc.num_hidden_layers,
                                     num_kv_heads=dc.num_key_value_heads, head_dim=dc.head_dim,
                                     num_q_heads=dc.num_attention_heads, num_draft_steps=self.num_draft_steps,
                                     **common)
        self.streams = Streams(self.device, cfg.plan_stream)
        for runner in (self.target, self.draft):
            if runner is not None:
                runner.compute_stream = self.streams.compute
        # NVTX ranges per phase when a profiler that reads them is attached (Nsight sets its injection variables).
        self.nvtx = self.device.type == "cuda" and nvtx_wanted()
        dev, slots = self.device, cfg.batch_size + 1
        # Persistent device inputs the producers write and the plan stream reads.
        self.seq_lens_buf = torch.zeros(cfg.batch_size, dtype=torch.int32, device=dev)
        # Per request slot, on the device: the root (newest committed token) and the next first draft token (and,
        # when sampling, the draft's probabilities for it), so the loop never sends tokens from the host.
        self.root_tok = torch.zeros(slots, dtype=torch.int64, device=dev)
        self.first_draft = torch.zeros(slots, dtype=torch.int64, device=dev)
        self.first_draft_probs: torch.Tensor | None = None
        self.inputs = HostInputs(dev)
        self._arange = torch.arange(max(cfg.batch_size, self.T) + 1, dtype=torch.int64, device=dev)
        self._readback: torch.Tensor | None = None
        self._readback_event = torch.cuda.Event() if dev.type == "cuda" else None
        self.gen = torch.Generator(device=dev).manual_seed(cfg.seed)
        self.stats = RunStats(accepted_by_position=[0] * self.num_drafts)
        self.iteration = 0
        # flashinfer's paged-prefill wrapper plans on the host from cache_seqlens (it cannot be captured), so with
        # --prefill-kernel flashinfer draft extend stays eager; --no-draft-extend-graph keeps it eager too.
        self.draft_extend_graph = getattr(kernels, "prefill", "") != "flashinfer" and cfg.draft_extend_graph
        if cfg.cuda_graph:
            if recorder.enabled:
                # Replays write their snapshots into device rows inside the graph (tracer.ring_pack.SnapshotRing).
                runners = [self.target] + ([self.draft] if self.draft is not None else [])
                recorder.open_ring(max(r.max_pack_len(cfg.batch_size, self.T) for r in runners))
            self._capture()

    # ---- setup ---------------------------------------------------------------------------------------
    def _template(self, runner: ModelRunner) -> ForwardBatch:
        z = torch.zeros(1, dtype=torch.int64, device=self.device)
        return ForwardBatch(ForwardMode.DECODE, 1, z, z, self.seq_lens_buf[:1], torch.ones(1, dtype=torch.int32),
                            z, z, self.r2t, runner.kv_pool, runner.backend)

    def _capture(self) -> None:
        with nvtx("capture", self.nvtx):
            ladder = list(self.cfg.graph_batch_sizes) or None
            if not self.spec:
                self.target.capture_graphs([(ForwardMode.DECODE, None, 1)], self.cfg.batch_size,
                                           self._template(self.target), ladder, self._captured)
                return
            self.target.capture_graphs([(ForwardMode.TARGET_VERIFY, None, self.T)], self.cfg.batch_size,
                                       self._template(self.target), ladder, self._captured)
            draft = self.draft
            assert draft is not None  # a speculative engine has a draft runner
            modes: list[tuple[ForwardMode, int | None, int]] = [
                (ForwardMode.DRAFT_DECODE, i, 1) for i in range(self.num_draft_steps)]
            if self.draft_extend_graph:
                modes.append((ForwardMode.DRAFT_EXTEND, None, self.T))
            draft.capture_graphs(modes, self.cfg.batch_size, self._template(draft), ladder, self._captured)

    def _captured(self) -> None:
        """A graph capture ended: it is a forward (and a recorded step) of iteration -1."""
        index = self.forwards
        self.forwards = index + 1
        if self.on_step_end is not None:
            self.on_step_end(index, -1, self.recorder.flush)

    # ---- the run -------------------------------------------------------------------------------------
    def run(self, requests: list[Request], progress: Callable[[int, int], None] | None = None) -> RunStats:
        """Serve every request to completion; returns run statistics."""
        waiting = sorted(requests, key=lambda r: (r.arrival_iteration, r.request_id))
        running: list[Request] = []
        total = sum(r.max_new_tokens for r in requests)
        t0 = time.perf_counter()
        while waiting or running:
            t_it = time.perf_counter()
            admitted: list[Request] = []
            while (waiting and waiting[0].arrival_iteration <= self.iteration
                   and len(running) + len(admitted) < self.cfg.batch_size):
                admitted.append(waiting.pop(0))
            if not running and not admitted and waiting:
                self.iteration = waiting[0].arrival_iteration  # idle until the next arrival
                continue
            if admitted:
                self._prefill(admitted)
                running += admitted
            live = [r for r in running if r.finish_iteration is None]
            if live:
                with nvtx(f"iteration {self.iteration}", self.nvtx):
                    self._spec_iteration(live) if self.spec else self._decode_iteration(live)
            for r in [r for r in running if r.finish_iteration is not None]:
                self._finish(r)
            running = [r for r in running if r.finish_iteration is None]
            self.stats.iteration_s.append(time.perf_counter() - t_it)
            self.stats.iteration_bs.append(len(live))
            self.stats.iteration_prefill.append(bool(admitted))
            self.iteration += 1
            self.stats.iterations = self.iteration
            if progress:
                progress(sum(len(r.output) for r in requests), total)
        self.recorder.poll()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.stats.wall_s = time.perf_counter() - t0
        self.stats.output_tokens = sum(len(r.output) for r in requests)
        return self.stats

    def _finish(self, r: Request) -> None:
        assert r.kv is not None
        r.kv.release(self.pages)
        self.r2t.free(r.slot)
        self.recorder.write_request(RequestRecord(
            request_id=r.request_id, prompt_tokens=tuple(r.prompt), output_tokens=tuple(r.output),
            arrival_iteration=r.arrival_iteration, finish_iteration=r.finish_iteration,
            finish_reason=r.finish_reason))

    # ---- helpers -------------------------------------------------------------------------------------
    def _batch(self, runner: ModelRunner, mode: ForwardMode, bs: int, *, rpi: torch.Tensor, rows: torch.Tensor,
               input_ids: torch.Tensor, positions: torch.Tensor, seq_lens: torch.Tensor,
               seq_lens_cpu: list[int] | torch.Tensor, q_lens: list[int], step_id: int | None = None,
               out_loc: torch.Tensor | None = None) -> ForwardBatch:
        """A forward batch from device tensors: rpi int64 `[bs]`, rows / positions int64 `[num_tokens]` (the request
        slot and position of every query token); the KV write slots int64 `[num_tokens]` are looked up on the device
        unless `out_loc` gives them. `seq_lens_cpu`: a list, or an int32 `[bs]` host tensor the caller made."""
        if out_loc is None:
            out_loc = self.r2t.req_to_token[rows, positions].to(torch.int64)
        if not isinstance(seq_lens_cpu, torch.Tensor):
            seq_lens_cpu = torch.tensor(seq_lens_cpu, dtype=torch.int32)
        uniform = mode in (ForwardMode.DECODE, ForwardMode.DRAFT_DECODE, ForwardMode.TARGET_VERIFY)
        return ForwardBatch(
            forward_mode=mode, batch_size=bs, input_ids=input_ids, positions=positions, seq_lens=seq_lens,
            seq_lens_cpu=seq_lens_cpu, req_pool_indices=rpi,
            out_cache_loc=out_loc, req_to_token_pool=self.r2t, token_to_kv_pool=runner.kv_pool,
            attn_backend=runner.backend_for(mode, step_id),
            extend_seq_lens_cpu=None if uniform else list(q_lens), spec_step_id=step_id,
            num_tokens_per_req=q_lens[0] if uniform else 1)

    def _forward(self, runner: ModelRunner, fb: ForwardBatch, states: Callable[[], RequestColumns],
                 logits_indices: torch.Tensor | None = None) -> torch.Tensor:
        """Prepare and execute one forward on the compute stream, recorded as one step."""
        rec, graph = runner.begin(fb, self.iteration, self.K)
        compute = self.streams.compute
        with self.recorder.span(rec, "compute", "metadata", compute):
            prep = runner.prepare(fb, graph, rec)
        index = self.forwards  # numbered at launch, as the recorder numbers it
        self.forwards = index + 1
        logits = runner.execute(prep, rec, logits_indices)  # its span "forward" is timed inside
        self._end(rec, index, states)
        return logits

    def _end(self, rec: StepRecord | None, index: int, states: Callable[[], RequestColumns]) -> None:
        """Close forward `index`: its recorded step (None: untraced), where `states` makes its request rows when the
        step is resolved, under later GPU work (nothing they read changes any more); then the step callback."""
        if rec is not None:
            self.recorder.end_step(rec, states)
        if self.on_step_end is not None:
            self.on_step_end(index, self.iteration, self.recorder.flush)

    def _sample(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Next tokens int64 `[n]` (argmax, or sampled at temperature) and their probabilities float32 `[n, V]`
        (sampling only); on the device, no sync."""
        if self.cfg.temperature <= 0:
            return logits.argmax(-1), None
        probs = torch.softmax(logits.float() / self.cfg.temperature, -1)
        return sample_device(probs, self.gen), probs

    def _upload(self, parts: list[list[int]], pending: PageWrites) -> list[torch.Tensor]:
        """`parts` as device int64 tensors, sent with the batch's queued page writes in one copy; the pages are
        written into req_to_token on the device."""
        *out, slots, logical, physical = self.inputs.upload([*parts, *pending.parts()])
        PageWrites.apply(self.r2t, self.cfg.page_size, slots, logical, physical)
        return out

    def _read(self, t: torch.Tensor) -> list[int]:
        """The host's one read per phase (int64 `[n]`): a non-blocking copy into pinned memory and an event wait.

        The trace's bookkeeping (resolving finished steps, handing them to the writer) runs first, while the GPU
        works through what was just launched."""
        if self._readback_event is None:
            self.recorder.poll()
            return t.tolist()
        n = t.numel()
        if self._readback is None or self._readback.numel() < n:
            self._readback = torch.empty(max(n, 4096), dtype=torch.int64, pin_memory=True)
        host = self._readback[:n]
        host.copy_(t, non_blocking=True)
        self._readback_event.record()
        self.recorder.poll()
        self._readback_event.synchronize()
        return host.tolist()

    def _keep_first_drafts(self, rpi: torch.Tensor, logits: torch.Tensor) -> None:
        """The draft's next token for each row becomes that request's first draft token of its next iteration."""
        tok, probs = self._sample(logits)
        self.first_draft[rpi] = tok
        if probs is not None:
            if self.first_draft_probs is None:
                self.first_draft_probs = torch.zeros(self.root_tok.shape[0], probs.shape[1], dtype=probs.dtype,
                                                     device=self.device)
            self.first_draft_probs[rpi] = probs

    # ---- prefill -------------------------------------------------------------------------------------
    def _prefill(self, reqs: list[Request]) -> None:
        pending = PageWrites()
        for r in reqs:
            r.kv = RequestKV(self.r2t.alloc())
            r.kv.ensure(len(r.prompt), self.pages, self.r2t, pending)
        lens = [len(r.prompt) for r in reqs]
        n, last_h, acc = len(reqs), [], 0
        for x in lens:
            acc += x
            last_h.append(acc - 1)
        ids, pos, rows, rpi, seq, last = self._upload([
            [t for r in reqs for t in r.prompt], [p for x in lens for p in range(x)],
            [r.slot for r, x in zip(reqs, lens, strict=True) for _ in range(x)], [r.slot for r in reqs], lens,
            last_h], pending)
        seq = seq.to(torch.int32)

        def extend(runner: ModelRunner, input_ids: torch.Tensor) -> torch.Tensor:
            fb = self._batch(runner, ForwardMode.EXTEND, n, rpi=rpi, rows=rows, input_ids=input_ids, positions=pos,
                             seq_lens=seq, seq_lens_cpu=lens, q_lens=lens)
            fb.extend_prefix_lens_cpu = [0] * n
            with nvtx(f"{runner.name} extend", self.nvtx):
                return self._forward(runner, fb, lambda: request_states(reqs, [0] * n, lens, lens), last)

        first, _ = self._sample(extend(self.target, ids))
        self.root_tok[rpi] = first
        if self.draft is not None:  # speculating
            shifted = torch.roll(ids, -1)  # the draft reads token p+1 at position p: prompt[1:] + the first token
            shifted[last] = first
            self._keep_first_drafts(rpi, extend(self.draft, shifted))
        for r, t in zip(reqs, self._read(first), strict=True):  # the scheduler needs the first tokens (stops)
            r.seq_len = len(r.prompt)
            r.commit([t], self.iteration)

    # ---- plain decode --------------------------------------------------------------------------------
    def _decode_iteration(self, reqs: list[Request]) -> None:
        bs = len(reqs)
        pending = PageWrites()
        for r in reqs:
            assert r.kv is not None  # a running request holds its KV from its prefill on
            r.kv.ensure(r.seq_len + 1, self.pages, self.r2t, pending)
        s = [r.seq_len for r in reqs]
        rpi, s_dev = self._upload([[r.slot for r in reqs], s], pending)
        self.seq_lens_buf[:bs].copy_(s_dev + 1)
        fb = self._batch(self.target, ForwardMode.DECODE, bs, rpi=rpi, rows=rpi, input_ids=self.root_tok[rpi],
                         positions=s_dev, seq_lens=self.seq_lens_buf[:bs], seq_lens_cpu=[x + 1 for x in s],
                         q_lens=[1] * bs)
        with nvtx("decode", self.nvtx):
            logits = self._forward(self.target, fb, lambda: request_states(reqs, s, [x + 1 for x in s], [1] * bs))
        nxt, _ = self._sample(logits)
        self.root_tok[rpi] = nxt
        for r, t in zip(reqs, self._read(nxt), strict=True):
            r.seq_len += 1
            r.commit([t], self.iteration)

    # ---- speculative iteration -----------------------------------------------------------------------
    def _spec_iteration(self, reqs: list[Request]) -> None:
        bs, T, N, dev, faults = len(reqs), self.T, self.num_drafts, self.device, self.cfg.faults
        s = [r.seq_len for r in reqs]
        streams, recorder = self.streams, self.recorder
        draft = self.draft
        assert draft is not None  # only a speculative engine runs speculative iterations
        plan_on = streams.plan_enabled
        no_wait = plan_on and "no-plan-wait" in faults
        rec_v, graph_v = self.target.begin_for(ForwardMode.TARGET_VERIFY, None, bs, T, self.iteration, self.K)
        rec_e, graph_e = draft.begin_for(ForwardMode.DRAFT_EXTEND, None, bs, T, self.iteration, self.K)
        prepared: dict[str, Any] = {}
        where = "plan" if plan_on else "compute"

        def plan(which: str) -> None:
            # Verify and draft-extend metadata depend on seq_lens, req_to_token and T, not on draft outputs.
            if which in prepared:
                return
            rec, runner, fb, graph = ((rec_v, self.target, fb_v, graph_v) if which == "verify"
                                      else (rec_e, draft, fb_e, graph_e))
            with streams.on_plan() as stream, nvtx(f"plan: {which} metadata", self.nvtx):
                with self.recorder.span(rec, where, "metadata", stream):
                    prepared[which] = runner.prepare(fb, graph, rec)

        # Producers of what the verify / draft-extend metadata reads (compute stream): KV pages and req_to_token
        # rows for the verify window, then seq_lens. Timed as the span "producers" of both steps.
        with self.recorder.span([rec_v, rec_e], "compute", "producers", streams.compute):
            pending = PageWrites()
            for r in reqs:
                assert r.kv is not None  # a running request holds its KV from its prefill on
                r.kv.ensure(r.seq_len + T, self.pages, self.r2t, pending)
            rpi, s_dev = self._upload([[r.slot for r in reqs], s], pending)
            rows_t = rpi[:, None].expand(bs, T).reshape(-1)  # repeat_interleave may read its output size back
            verify_pos = (s_dev[:, None] + self._arange[None, :T]).reshape(-1)
            verify_ids = torch.zeros(bs * T, dtype=torch.int64, device=dev)
            s_cpu = torch.tensor(s, dtype=torch.int32)  # the host mirror of seq_lens that verify and the drafts read
            seq_lens = self.seq_lens_buf[:bs]
            fb_v = self._batch(self.target, ForwardMode.TARGET_VERIFY, bs, rpi=rpi, rows=rows_t, input_ids=verify_ids,
                               positions=verify_pos, seq_lens=seq_lens, seq_lens_cpu=s_cpu, q_lens=[T] * bs)
            if self.num_draft_steps:
                # Draft step i writes position S+i: column i of the verify window. Its positions and KV slots are
                # taken from there, as SGLang assigns every draft step's cache locations at once (two gathers per
                # iteration instead of three kernels per draft step).
                step_pos = verify_pos.view(bs, T).t().contiguous()  # int64 [T, bs]
                step_loc = fb_v.out_cache_loc.view(bs, T).t().contiguous()
            ext_ids = torch.zeros(bs * T, dtype=torch.int64, device=dev)
            fb_e = self._batch(draft, ForwardMode.DRAFT_EXTEND, bs, rpi=rpi, rows=rows_t, input_ids=ext_ids,
                               positions=verify_pos, seq_lens=(s_dev + T).to(torch.int32),
                               seq_lens_cpu=[x + T for x in s], q_lens=[T] * bs)
            if no_wait and dev.type == "cpu":
                # CPU rendering of the race: the unordered plan stream runs before the producer's seq_lens write
                # lands, so its metadata reads last iteration's seq_lens (and its spans start inside "producers").
                plan("verify")
                plan("extend")
            elif no_wait:
                torch.cuda._sleep(10_000_000)  # make the missing edge bite: delay the producer on the GPU
            self.seq_lens_buf[:bs].copy_(s_dev)
        producers = streams.record_producers(streams.compute)
        if no_wait:
            recorder.fired([rec_v, rec_e], ["no-plan-wait"])
        elif streams.plan_wait(producers):
            recorder.wait([rec_v, rec_e], "plan", "compute", "producers")

        # Draft decode: N-1 steps (chain, topk=1), each through its own backend / graph; draft 1 came from the
        # draft extend (or prefill) before. As SGLang's draft graph runner does (`init_forward_metadata_out_graph`
        # runs `_apply` on every step backend, then the whole loop replays), every step's metadata is made first,
        # in one "metadata" span of all the draft steps: none of it reads a draft output (positions and KV slots
        # come from the verify window; each step's input_ids are copied in at its launch).
        tok = self.first_draft[rpi]
        drafts = [tok]
        draft_probs = [self.first_draft_probs[rpi]] if self.first_draft_probs is not None else []
        steps, preps = [], []
        for i in range(self.num_draft_steps):
            fb = self._batch(draft, ForwardMode.DRAFT_DECODE, bs, rpi=rpi, rows=rpi, input_ids=tok,
                             positions=step_pos[i], seq_lens=seq_lens, seq_lens_cpu=s_cpu, q_lens=[1] * bs,
                             step_id=i, out_loc=step_loc[i])
            steps.append((fb, *draft.begin(fb, self.iteration, self.K)))
        if steps:
            with self.recorder.span([rec for _, rec, _ in steps], "compute", "metadata", streams.compute), \
                    nvtx("draft metadata", self.nvtx):
                preps = [draft.prepare(fb, graph, rec) for fb, rec, graph in steps]
        for i, ((fb, rec, _), prep) in enumerate(zip(steps, preps, strict=True)):
            fb.input_ids = tok  # the draft-dependent input: the previous step's token
            index = self.forwards
            self.forwards = index + 1
            with nvtx(f"draft step {i}", self.nvtx):
                logits = draft.execute(prep, rec)
            self._end(rec, index, lambda: request_states(reqs, s, s, [1] * bs))
            tok, probs = self._sample(logits)
            drafts.append(tok)
            if probs is not None:
                draft_probs.append(probs)

        # Target verify. Its metadata is planned once the whole draft loop is launched (SGLang plans it in `verify`,
        # after `draft` returns), so on the plan stream it is made while the draft forwards run.
        plan("verify")
        pv = prepared["verify"]
        if streams.compute_wait_plan():
            recorder.wait(rec_v, "compute", "plan", "metadata")
        if plan_on:
            # SGLang calls the fix-up hook unconditionally under the plan stream; before PR #25925 it raised there.
            # Record what happened and go on (upstream crashed), so the rest of the run is still checked.
            try:
                self.target.backend.update_verify_buffers_to_fill_after_draft(None, graph_v and pv.fb.batch_size)
            except NotImplementedError as e:
                recorder.error(rec_v, "update_verify_buffers_to_fill_after_draft", e)
                if "missing-fixup-hook" in faults:
                    recorder.fired(rec_v, ["missing-fixup-hook"])
        draft_mat = torch.stack(drafts, 1)  # int64 [bs, N]
        verify_ids.copy_(torch.cat([self.root_tok[rpi][:, None], draft_mat], 1).view(-1))
        index_v = self.forwards
        self.forwards = index_v + 1
        with nvtx("verify", self.nvtx):
            logits_v = self.target.execute(pv, rec_v)
        # Draft-extend metadata needs only S + T, so it is planned under the verify forward.
        plan("extend")
        pe = prepared["extend"]

        # Accept on the device: committed [bs, T] holds the verified tokens (valid up to accept_len), whose last
        # valid entry is the next root.
        if self.cfg.temperature <= 0:
            committed, accept_len = greedy_accept_device(draft_mat, logits_v.argmax(-1).view(bs, T))
        else:
            p_t = torch.softmax(logits_v.float() / self.cfg.temperature, -1).view(bs, T, -1)
            committed, accept_len = rejection_accept_device(draft_mat, torch.stack(draft_probs, 1), p_t, self.gen)
        rows_b = self._arange[:bs]
        self.root_tok[rpi] = committed[rows_b, accept_len - 1]

        # Draft extend over the verified tokens (the draft reads token p+1 at position p): refills the draft KV of
        # the window; its logits at the last accepted position give each request's next first draft token.
        ext_ids.copy_(committed.reshape(-1))
        if streams.compute_wait_plan():
            recorder.wait(rec_e, "compute", "plan", "metadata")
        index_e = self.forwards
        self.forwards = index_e + 1
        with nvtx("draft extend", self.nvtx):
            logits_e = draft.execute(pe, rec_e, rows_b * T + accept_len - 1)
        self._keep_first_drafts(rpi, logits_e)

        # The one sync of the iteration: the scheduler needs the accepted tokens (and the trace the drafts).
        host = self._read(torch.cat([draft_mat.reshape(-1), committed.reshape(-1), accept_len]))
        c0, a0 = bs * N, bs * N + bs * T
        accepted = [host[c0 + b * T: c0 + b * T + host[a0 + b]] for b in range(bs)]
        for r, acc in zip(reqs, accepted, strict=True):
            r.commit(acc, self.iteration)
        s_after = [x + len(a) for x, a in zip(s, accepted, strict=True)]
        self._end(rec_v, index_v, lambda: request_states(reqs, s, s_after, [T] * bs,
                                                [host[b * N:(b + 1) * N] for b in range(bs)], accepted))
        lens = host[a0:a0 + bs]
        self.stats.verify_rows += bs
        self.stats.accepted_total += sum(lens)
        by_pos = self.stats.accepted_by_position
        for j in range(T - 1):  # draft position j was accepted in every row that kept more than j + 1 tokens
            by_pos[j] += sum(1 for n in lens if n > j + 1)
        self._end(rec_e, index_e, lambda: request_states(reqs, s, [x + T for x in s], [T] * bs))

        # Commit: rejected draft slots past the new length go back to the allocator.
        for r, n in zip(reqs, s_after, strict=True):
            r.seq_len = n
            assert r.kv is not None  # a running request holds its KV from its prefill on
            r.kv.shrink(n, self.pages, self.r2t)
