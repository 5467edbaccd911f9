"""The engine: requests arrive and finish; each iteration prefills newcomers, then runs EAGLE-style
draft decode (N steps, topk=1) -> target verify (T = N+1 tokens per request) -> accept -> draft extend,
or plain decode when there is no draft. Every forward goes through the TRTLLM MHA backend and is recorded.

Sequence conventions (SGLang spec v2): a running request has `seq_len` = S committed KV positions in both
models and a root token (the newest output) at position S that is not in the KV cache yet.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..tracer.recorder import NullRecorder, Recorder
from ..tracer.schema import ForwardMode, RequestRecord
from .engine_config import EngineConfig
from .forward_batch import ForwardBatch
from .memory import PageAllocator, ReqToTokenPool, RequestKV
from .model_runner import ModelRunner, request_states
from .request import Request
from .sampling import greedy_accept, rejection_accept
from .streams import Streams, nvtx


@dataclass
class RunStats:
    """What a run did, for the end-of-run summary."""

    iterations: int = 0
    output_tokens: int = 0
    verify_rows: int = 0
    accepted_total: int = 0  # tokens committed by verifies, bonus included
    accepted_by_position: list[int] = field(default_factory=list)
    wall_s: float = 0.0
    iteration_s: list[float] = field(default_factory=list)  # wall time of each iteration
    iteration_bs: list[int] = field(default_factory=list)  # requests decoded in it
    iteration_prefill: list[bool] = field(default_factory=list)  # whether it also prefilled newcomers

    @property
    def mean_accept_length(self) -> float | None:
        """Tokens committed per verify row, bonus included."""
        return self.accepted_total / self.verify_rows if self.verify_rows else None


class Engine:
    """Drives real draft/verify steps for a list of requests."""

    def __init__(self, cfg: EngineConfig, target: Any, draft: Any | None, kernels: Any,
                 recorder: Recorder | NullRecorder) -> None:
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.recorder = recorder
        self.spec = draft is not None and cfg.spec_steps > 0
        self.T = cfg.verify_tokens if self.spec else 1
        self.K = cfg.spec_steps + 1 if self.spec else 1  # what the backend caches at construction
        self.num_draft_steps = self.T - 1
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
        self.draft = None
        if self.spec:
            dm, dc = draft
            self.draft = ModelRunner(name="draft", model=dm, num_layers=dc.num_hidden_layers,
                                     num_kv_heads=dc.num_key_value_heads, head_dim=dc.head_dim,
                                     num_q_heads=dc.num_attention_heads, num_draft_steps=self.num_draft_steps,
                                     **common)
        self.streams = Streams(self.device, cfg.plan_stream)
        self.nvtx = self.device.type == "cuda"
        # Persistent device inputs the producers write and the plan stream reads.
        self.seq_lens_buf = torch.zeros(cfg.batch_size, dtype=torch.int32, device=self.device)
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.stats = RunStats(accepted_by_position=[0] * max(self.num_draft_steps, 0))
        self.iteration = 0
        if cfg.cuda_graph:
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
                                           self._template(self.target), ladder)
                return
            self.target.capture_graphs([(ForwardMode.TARGET_VERIFY, None, self.T)], self.cfg.batch_size,
                                       self._template(self.target), ladder)
            self.draft.capture_graphs([(ForwardMode.DRAFT_DECODE, i, 1) for i in range(self.num_draft_steps)],
                                      self.cfg.batch_size, self._template(self.draft), ladder)

    # ---- the run -------------------------------------------------------------------------------------
    def run(self, requests: list[Request], progress: Callable[[int, int], None] | None = None) -> RunStats:
        """Serve every request to completion; returns run statistics."""
        waiting = sorted(requests, key=lambda r: (r.arrival_iteration, r.request_id))
        running: list[Request] = []
        total = sum(r.max_new_tokens for r in requests)
        t0 = time.perf_counter()
        while waiting or running:
            t_it = time.perf_counter()
            admitted = []
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
            self.recorder.poll()
            self.stats.iteration_s.append(time.perf_counter() - t_it)
            self.stats.iteration_bs.append(len(live))
            self.stats.iteration_prefill.append(bool(admitted))
            self.iteration += 1
            self.stats.iterations = self.iteration
            if progress:
                progress(sum(len(r.output) for r in requests), total)
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
    def _batch(self, runner: ModelRunner, mode: ForwardMode, reqs: list[Request], *, input_ids: torch.Tensor,
               positions: list[int], seq_lens: torch.Tensor, seq_lens_cpu: list[int], q_lens: list[int],
               step_id: int | None = None) -> ForwardBatch:
        dev = self.device
        rpi = torch.tensor([r.slot for r in reqs], dtype=torch.int64, device=dev)
        pos = torch.tensor(positions, dtype=torch.int64, device=dev)
        # Built on the host: repeat_interleave with device repeats would sync the GPU on every batch.
        row = torch.tensor([r.slot for r, n in zip(reqs, q_lens, strict=True) for _ in range(n)], device=dev)
        out_loc = self.r2t.req_to_token[row, pos].to(torch.int64)
        uniform = mode in (ForwardMode.DECODE, ForwardMode.DRAFT_DECODE, ForwardMode.TARGET_VERIFY)
        return ForwardBatch(
            forward_mode=mode, batch_size=len(reqs), input_ids=input_ids, positions=pos, seq_lens=seq_lens,
            seq_lens_cpu=torch.tensor(seq_lens_cpu, dtype=torch.int32), req_pool_indices=rpi,
            out_cache_loc=out_loc, req_to_token_pool=self.r2t, token_to_kv_pool=runner.kv_pool,
            attn_backend=runner.backend_for(mode, step_id),
            extend_seq_lens_cpu=None if uniform else list(q_lens), spec_step_id=step_id,
            num_tokens_per_req=q_lens[0] if uniform else 1)

    def _forward(self, runner: ModelRunner, fb: ForwardBatch, states: Callable[[], list[Any]],
                 logits_indices: torch.Tensor | None = None) -> torch.Tensor:
        """Prepare and execute one forward on the compute stream, recorded as one step."""
        rec, graph = runner.begin(fb, self.iteration, self.K)
        compute = self.streams.compute
        with self._span(rec, "compute", "metadata", compute):
            prep = runner.prepare(fb, graph, rec)
        with self._span(rec, "compute", "forward", compute):
            logits = runner.execute(prep, rec, logits_indices)
        if rec is not None:
            rec.requests = states()
            self.recorder.end_step(rec)
        return logits

    def _sample(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Next tokens `[n]` (argmax, or sampled at temperature) and their probabilities (sampling only)."""
        if self.cfg.temperature <= 0:
            return logits.argmax(-1), None
        probs = torch.softmax(logits.float() / self.cfg.temperature, -1)
        return torch.multinomial(probs.cpu(), 1, generator=self.gen).view(-1).to(logits.device), probs

    # ---- prefill -------------------------------------------------------------------------------------
    def _prefill(self, reqs: list[Request]) -> None:
        for r in reqs:
            r.kv = RequestKV(self.r2t.alloc())
            r.kv.ensure(len(r.prompt), self.pages, self.r2t)
        lens = [len(r.prompt) for r in reqs]
        ids = torch.tensor([t for r in reqs for t in r.prompt], dtype=torch.int64, device=self.device)
        positions = [p for n in lens for p in range(n)]
        seq = torch.tensor(lens, dtype=torch.int32, device=self.device)
        runners = [self.target] + ([self.draft] if self.spec else [])
        last = torch.tensor(lens, device=self.device).cumsum(0) - 1
        first = None
        for runner in runners:
            fb = self._batch(runner, ForwardMode.EXTEND, reqs, input_ids=ids, positions=positions, seq_lens=seq,
                             seq_lens_cpu=lens, q_lens=lens)
            fb.extend_prefix_lens_cpu = [0] * len(reqs)
            with nvtx(f"{runner.name} extend", self.nvtx):
                logits = self._forward(runner, fb, lambda: request_states(reqs, [0] * len(reqs), lens, lens), last)
            if runner is self.target:
                first, _ = self._sample(logits)
        for r, t in zip(reqs, first.tolist(), strict=True):
            r.seq_len = len(r.prompt)
            r.commit([t], self.iteration)

    # ---- plain decode --------------------------------------------------------------------------------
    def _decode_iteration(self, reqs: list[Request]) -> None:
        bs = len(reqs)
        for r in reqs:
            r.kv.ensure(r.seq_len + 1, self.pages, self.r2t)
        s = [r.seq_len for r in reqs]
        self.seq_lens_buf[:bs].copy_(torch.tensor([x + 1 for x in s], dtype=torch.int32))
        ids = torch.tensor([r.root for r in reqs], dtype=torch.int64, device=self.device)
        fb = self._batch(self.target, ForwardMode.DECODE, reqs, input_ids=ids, positions=s,
                         seq_lens=self.seq_lens_buf[:bs], seq_lens_cpu=[x + 1 for x in s], q_lens=[1] * bs)
        with nvtx("decode", self.nvtx):
            logits = self._forward(self.target, fb, lambda: request_states(reqs, s, [x + 1 for x in s], [1] * bs))
        nxt, _ = self._sample(logits)
        for r, t in zip(reqs, nxt.tolist(), strict=True):
            r.seq_len += 1
            r.commit([t], self.iteration)

    # ---- speculative iteration -----------------------------------------------------------------------
    def _spec_iteration(self, reqs: list[Request]) -> None:
        bs, T, dev, faults = len(reqs), self.T, self.device, self.cfg.faults
        s = [r.seq_len for r in reqs]
        streams, recorder = self.streams, self.recorder
        plan_on = streams.plan_enabled
        no_wait = plan_on and "no-plan-wait" in faults
        rec_v, graph_v = self.target.begin_for(ForwardMode.TARGET_VERIFY, None, bs, T, self.iteration, self.K)
        rec_e, _ = self.draft.begin_for(ForwardMode.DRAFT_EXTEND, None, bs, T, self.iteration, self.K)
        prepared: dict[str, Any] = {}
        where = "plan" if plan_on else "compute"

        def plan(which: str) -> None:
            # Verify and draft-extend metadata depend on seq_lens, req_to_token and T, not on draft outputs.
            if which in prepared:
                return
            rec, runner, fb, graph = ((rec_v, self.target, fb_v, graph_v) if which == "verify"
                                      else (rec_e, self.draft, fb_e, None))
            with streams.on_plan() as stream, nvtx(f"plan: {which} metadata", self.nvtx):
                with self._span(rec, where, "metadata", stream):
                    prepared[which] = runner.prepare(fb, graph, rec)

        # Producers of what the verify / draft-extend metadata reads (compute stream): KV pages and req_to_token
        # rows for the verify window, then seq_lens. Timed as the span "producers" of both steps.
        with self._span([rec_v, rec_e], "compute", "producers", streams.compute):
            for r in reqs:
                r.kv.ensure(r.seq_len + T, self.pages, self.r2t)
            verify_ids = torch.zeros(bs * T, dtype=torch.int64, device=dev)
            verify_pos = [x + t for x in s for t in range(T)]
            fb_v = self._batch(self.target, ForwardMode.TARGET_VERIFY, reqs, input_ids=verify_ids,
                               positions=verify_pos, seq_lens=self.seq_lens_buf[:bs], seq_lens_cpu=s, q_lens=[T] * bs)
            ext_seq = torch.tensor([x + T for x in s], dtype=torch.int32, device=dev)
            ext_ids = torch.zeros(bs * T, dtype=torch.int64, device=dev)
            fb_e = self._batch(self.draft, ForwardMode.DRAFT_EXTEND, reqs, input_ids=ext_ids, positions=verify_pos,
                               seq_lens=ext_seq, seq_lens_cpu=[x + T for x in s], q_lens=[T] * bs)
            if no_wait and dev.type == "cpu":
                # CPU rendering of the race: the unordered plan stream runs before the producer's seq_lens write
                # lands, so its metadata reads last iteration's seq_lens (and its spans start inside "producers").
                plan("verify")
                plan("extend")
            elif no_wait:
                torch.cuda._sleep(10_000_000)  # make the missing edge bite: delay the producer on the GPU
            self.seq_lens_buf[:bs].copy_(torch.tensor(s, dtype=torch.int32).to(dev, non_blocking=True))
        producers = streams.record_event(streams.compute)
        if no_wait:
            recorder.fired([rec_v, rec_e], ["no-plan-wait"])
        elif streams.plan_wait(producers):
            recorder.wait([rec_v, rec_e], "plan", "compute", "producers")

        # Draft decode: N steps, chain (topk=1), each through its own backend / graph.
        drafts: list[torch.Tensor] = []
        draft_probs: list[torch.Tensor] = []
        tok = torch.tensor([r.root for r in reqs], dtype=torch.int64, device=dev)
        for i in range(self.num_draft_steps):
            fb = self._batch(self.draft, ForwardMode.DRAFT_DECODE, reqs, input_ids=tok, positions=[x + i for x in s],
                             seq_lens=self.seq_lens_buf[:bs], seq_lens_cpu=s, q_lens=[1] * bs, step_id=i)
            with nvtx(f"draft step {i}", self.nvtx):
                logits = self._forward(self.draft, fb, lambda: request_states(reqs, s, s, [1] * bs))
            if plan_on and i == 0:
                # Enqueue the verify metadata while the first draft step is in flight, so it runs under it.
                plan("verify")
            tok, probs = self._sample(logits)
            drafts.append(tok)
            if probs is not None:
                draft_probs.append(probs)

        # Target verify.
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
        draft_mat = torch.stack(drafts, 1) if drafts else torch.zeros(bs, 0, dtype=torch.int64, device=dev)
        root = torch.tensor([r.root for r in reqs], dtype=torch.int64, device=dev)
        verify_ids.copy_(torch.cat([root[:, None], draft_mat], 1).view(-1))
        with nvtx("verify", self.nvtx), self._span(rec_v, "compute", "forward", streams.compute):
            logits_v = self.target.execute(pv, rec_v)
        # Draft-extend metadata needs only S + T, so it is planned under the verify forward.
        plan("extend")
        pe = prepared["extend"]

        # Accept (the one host sync per iteration: the scheduler needs the tokens).
        d_host = draft_mat.tolist()
        if self.cfg.temperature <= 0:
            predict = logits_v.argmax(-1).view(bs, T).tolist()
            accepted = [greedy_accept(d_host[b], predict[b]) for b in range(bs)]
        else:
            p_t = torch.softmax(logits_v.float() / self.cfg.temperature, -1).view(bs, T, -1).cpu()
            q_d = torch.stack(draft_probs, 1).cpu()
            accepted = [rejection_accept(d_host[b], q_d[b], p_t[b], self.gen) for b in range(bs)]
            predict = [(acc + acc[-1:] * T)[:T] for acc in accepted]
        for r, acc in zip(reqs, accepted, strict=True):
            r.commit(acc, self.iteration)
        s_after = [x + len(a) for x, a in zip(s, accepted, strict=True)]
        if rec_v is not None:
            rec_v.requests = request_states(reqs, s, s_after, [T] * bs, d_host, accepted)
            self.recorder.end_step(rec_v)
        for acc in accepted:
            self.stats.verify_rows += 1
            self.stats.accepted_total += len(acc)
            for j in range(len(acc) - 1):
                self.stats.accepted_by_position[j] += 1

        # Draft extend over [root, predict[0..T-2]]: refills draft KV for the window with target tokens.
        ext_ids.copy_(torch.cat([root[:, None], torch.tensor([p[:T - 1] for p in predict], dtype=torch.int64,
                                                             device=dev)], 1).view(-1))
        if streams.compute_wait_plan():
            recorder.wait(rec_e, "compute", "plan", "metadata")
        with nvtx("draft extend", self.nvtx), self._span(rec_e, "compute", "forward", streams.compute):
            self.draft.execute(pe, rec_e, torch.arange(T - 1, bs * T, T, device=dev))
        if rec_e is not None:
            rec_e.requests = request_states(reqs, s, [x + T for x in s], [T] * bs)
            self.recorder.end_step(rec_e)

        # Commit: rejected draft slots past the new length go back to the allocator.
        for r, n in zip(reqs, s_after, strict=True):
            r.seq_len = n
            r.kv.shrink(n, self.pages, self.r2t)

    def _span(self, rec: Any, stream: str, name: str, cuda_stream: Any) -> Any:
        return self.recorder.span(rec, stream, name, cuda_stream)
