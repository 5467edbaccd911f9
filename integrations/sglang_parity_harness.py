"""The batches of upstream parity and the two backends they go through: SGLang's own `TRTLLMHAAttnBackend`
(loaded by `sglang_loader`) and ours (backend/trtllm_mha_backend.py + backend/graph_runner.py) over one
req_to_token table, with graph runners for every graph mode; random batches (re-drawn slots, fragmented pages)
sent eager, at capture, at replay and at padded replay, each forward compared (`sglang_parity_compare`)."""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

import torch

from ..backend.forward_batch import ForwardBatch
from ..backend.graph_runner import GraphRunner
from ..backend.memory import KVPool, PageAllocator, ReqToTokenPool, RequestKV
from ..backend.trtllm_mha_backend import TRTLLMHABackend
from ..tracer.schema import ForwardMode
from .sglang_driver import UpstreamGraphRunner, specscope_batch, step_backends, upstream_batch
from .sglang_loader import UpstreamSglang
from .sglang_parity_compare import Comparison, record, snapshot, tensor_ptrs
from .sglang_stand_ins import make_model_runner

GRAPH_MODES = (ForwardMode.DECODE, ForwardMode.DRAFT_DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND)
ALL_MODES = (*GRAPH_MODES, ForwardMode.EXTEND)
PHASES = ("eager", "capture", "replay", "padded replay")


class _NoKernels:
    """The kernels of a backend that only prepares metadata: parity never runs attention."""

    name = "none"

    def decode(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Not available: the parity backends compare metadata only."""
        raise RuntimeError("the parity backends prepare metadata only; no attention kernel runs")

    def context(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Not available: the parity backends compare metadata only."""
        raise RuntimeError("the parity backends prepare metadata only; no attention kernel runs")



def _no_forward(ids: torch.Tensor, pos: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
    # Metadata only: the captured "model" does nothing (our GraphRunner runs the forward once at capture on a CPU).
    return torch.zeros(ids.shape[0], 1)


class ParityHarness:
    """Both backends over one req_to_token table, with graph runners for every graph mode."""

    def __init__(self, up: UpstreamSglang, *, page_size: int, K: int, T: int, num_steps: int, ladder: list[int],
                 context_len: int = 1024, faults: frozenset[str] = frozenset(),
                 graph_modes: Iterable[ForwardMode] = GRAPH_MODES) -> None:
        self.up, self.P, self.K, self.T, self.C = up, page_size, K, T, context_len
        self.ladder = ladder
        self.max_bs = max(ladder)
        self.num_slots = self.max_bs * 2
        self.r2t = ReqToTokenPool(self.num_slots, context_len, torch.device("cpu"))
        pages = self.num_slots * (-(-context_len // page_size)) + 2
        self.alloc = PageAllocator(pages, page_size)
        kv = KVPool(1, 2, page_size, 1, 8, torch.float32, torch.device("cpu"))  # the constructor wants one
        self.kv = kv

        def ours(step: int = 0) -> TRTLLMHABackend:
            return TRTLLMHABackend(req_to_token_pool=self.r2t, kv_pool=kv, page_size=page_size,
                                   max_context_len=context_len, num_draft_tokens=K, kernels=_NoKernels(),
                                   device=torch.device("cpu"), speculative_step_id=step, faults=faults)

        def mr(draft: bool) -> Any:
            return make_model_runner(req_to_token=self.r2t.req_to_token, page_size=page_size, context_len=context_len,
                                     num_draft_tokens=K, is_draft_worker=draft)

        n_draft = num_steps - 1
        # SGLang's target model captures one kind (TARGET_VERIFY with speculation, DECODE without), so the plain
        # decode comparisons get their own target backend on both sides.
        self.up_decode = up.backend_cls(mr(False))
        self.up_target = up.backend_cls(mr(False))
        self.up_draft = up.multi_step_cls(mr(True), 1, num_steps)
        self.up_draft_extend = up.backend_cls(mr(True))
        self.our_decode = ours()
        self.our_target = ours()
        self.our_draft = [ours(i) for i in range(n_draft)]
        self.our_draft_extend = ours()
        self.n_draft = n_draft
        self.faults = faults
        self.graph_modes = tuple(m for m in GRAPH_MODES if m in tuple(graph_modes))
        self.cmp: list[Comparison] = []
        self.up_runners: dict[ForwardMode, UpstreamGraphRunner] = {}
        self.our_runners: dict[tuple[ForwardMode, int | None], GraphRunner] = {}
        self.our_capture_ptrs: dict[tuple[ForwardMode, int | None, int], dict[str, int]] = {}
        self.up_capture_ptrs: dict[tuple[ForwardMode, int, int], dict[str, int]] = {}
        self.kvs: dict[int, RequestKV] = {}
        self._capture()

    # ---- wiring --------------------------------------------------------------------------------------
    def _tokens(self, mode: ForwardMode) -> int:
        return self.T if mode in (ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND) else 1

    def _up_backend(self, mode: ForwardMode) -> Any:
        return {ForwardMode.DECODE: self.up_decode, ForwardMode.TARGET_VERIFY: self.up_target,
                ForwardMode.DRAFT_DECODE: self.up_draft, ForwardMode.DRAFT_EXTEND: self.up_draft_extend,
                ForwardMode.EXTEND: self.up_target}[mode]

    def _our_backend(self, mode: ForwardMode, step: int | None) -> TRTLLMHABackend:
        if mode == ForwardMode.DRAFT_DECODE:
            return self.our_draft[step or 0]
        if mode == ForwardMode.DECODE:
            return self.our_decode
        return self.our_draft_extend if mode == ForwardMode.DRAFT_EXTEND else self.our_target

    def _template(self, be: TRTLLMHABackend, mode: ForwardMode, step: int | None) -> ForwardBatch:
        z = torch.zeros(1, dtype=torch.int64)
        return ForwardBatch(mode, 1, z, z, torch.ones(1, dtype=torch.int32), torch.ones(1, dtype=torch.int32), z, z,
                            self.r2t, self.kv, be, spec_step_id=step)

    def _capture(self) -> None:
        for mode in self.graph_modes:
            t = self._tokens(mode)
            be_up = self._up_backend(mode)
            upr = UpstreamGraphRunner(self.up, be_up, mode, tokens_per_req=t, ladder=self.ladder)
            self.up_runners[mode] = upr
            steps = list(range(self.n_draft)) if mode == ForwardMode.DRAFT_DECODE else [None]
            for s in steps:
                be = self._our_backend(mode, s)
                be.init_cuda_graph_state(self.max_bs, self.max_bs * t)
                self.our_runners[(mode, s)] = GraphRunner(
                    name=f"parity:{mode.value}:{s}", mode=mode, forward=_no_forward, backend=be,
                    template=self._template(be, mode, s), max_bs=self.max_bs, tokens_per_req=t,
                    device=torch.device("cpu"), pad_seq_len_from_live="padded-row-seqlen" in self.faults,
                    ladder=self.ladder)
            for bs in reversed(self.ladder):  # upstream captures largest first; so do we here
                upr.capture(bs)
                for i, s in enumerate(steps):
                    runner = self.our_runners[(mode, s)]
                    fb = runner.prepare_capture(bs)
                    runner.capture_forward(fb)
                    be = self._our_backend(mode, s)
                    md = be.forward_metadata
                    self.our_capture_ptrs[(mode, s, bs)] = tensor_ptrs(md)
                    up_md = step_backends(be_up)[i].forward_metadata
                    self.up_capture_ptrs[(mode, i, bs)] = tensor_ptrs(up_md)
                    record(self.cmp, mode, "capture", s, bs, bs,
                             snapshot(up_md, kernel_q_len=getattr(up_md, "max_seq_len_q", None), reuses=None),
                             snapshot(md, kernel_q_len=md.kernel_q_len, reuses=None), self.P, self.K, t)

    # ---- batches -------------------------------------------------------------------------------------
    def new_batch(self, rng: random.Random, bs: int, max_extra: int) -> list[tuple[int, int]]:
        """`bs` distinct request slots with random committed lengths S; KV pages allocated up to S + max_extra.

        Slots are re-drawn each time and their pages freed and re-allocated, so page tables change between
        batches (what stale-column bugs need to show)."""
        slots = rng.sample(range(1, self.num_slots + 1), bs)
        rows = []
        for slot in slots:
            old = self.kvs.pop(slot, None)
            if old is not None:
                old.release(self.alloc)
                self.r2t.req_to_token[slot].zero_()
            kv = RequestKV(slot)
            s = rng.randint(1, self.C - max_extra - 1)
            kv.ensure(s + max_extra, self.alloc, self.r2t)
            self.kvs[slot] = kv
            rows.append((slot, s))
        return rows

    def our_batch(self, mode: ForwardMode, rows: list[tuple[int, int]], step: int | None = None,
                  prefix: list[int] | None = None) -> ForwardBatch:
        """Our ForwardBatch for `rows` = (slot, S) under specscope's conventions (backend/forward_batch.py)."""
        return specscope_batch(self.r2t, self.kv, self._our_backend(mode, step), mode, rows,
                               T=self._tokens(mode), step=step, prefix=prefix)

    # ---- one forward through both --------------------------------------------------------------------
    def eager(self, mode: ForwardMode, rows: list[tuple[int, int]], prefix: list[int] | None = None) -> None:
        """Eager metadata from both backends for the same batch."""
        steps = list(range(self.n_draft)) if mode == ForwardMode.DRAFT_DECODE else [None]
        up_fb = upstream_batch(self.up, self.our_batch(mode, rows, steps[0], prefix))
        be_up = self._up_backend(mode)
        be_up.init_forward_metadata(up_fb)
        for i, s in enumerate(steps):
            fb = self.our_batch(mode, rows, s, prefix)
            be = self._our_backend(mode, s)
            be.init_forward_metadata(fb)
            up_md, md = step_backends(be_up)[i].forward_metadata, be.forward_metadata
            record(self.cmp, mode, "eager", s, len(rows), len(rows),
                     snapshot(up_md, kernel_q_len=getattr(up_md, "max_seq_len_q", None), reuses=None),
                     snapshot(md, kernel_q_len=md.kernel_q_len, reuses=None), self.P, self.K, self._tokens(mode))

    def replay(self, mode: ForwardMode, rows: list[tuple[int, int]]) -> None:
        """Replay prep on both sides (padded to the next captured size) for the same batch."""
        steps = list(range(self.n_draft)) if mode == ForwardMode.DRAFT_DECODE else [None]
        upr = self.up_runners[mode]
        view = upr.replay_prepare(upstream_batch(self.up, self.our_batch(mode, rows, steps[0])))
        bs = view.batch_size
        phase = "padded replay" if bs != len(rows) else "replay"
        for i, s in enumerate(steps):
            runner = self.our_runners[(mode, s)]
            runner.replay_prepare(self.our_batch(mode, rows, s))
            be = self._our_backend(mode, s)
            md = be.forward_metadata
            up_be = step_backends(upr.backend)[i]
            up_md = up_be.forward_metadata
            ours_reuse = (md is be.graph_metadata.get((mode, bs))
                          and tensor_ptrs(md) == self.our_capture_ptrs[(mode, s, bs)])
            up_reuse = (up_md is not None and up_md is upr.captured[(bs, i)]
                        and tensor_ptrs(up_md) == self.up_capture_ptrs[(mode, i, bs)])
            record(self.cmp, mode, phase, s, len(rows), bs,
                     snapshot(up_md, kernel_q_len=upr.captured_q_len[(bs, i)], reuses=up_reuse),
                     snapshot(md, kernel_q_len=md.kernel_q_len, reuses=ours_reuse), self.P, self.K, self._tokens(mode))


def run_parity(up: UpstreamSglang, *, page_size: int, K: int, T: int, seed: int = 0, iterations: int = 4,
               faults: frozenset[str] = frozenset(), modes: Iterable[ForwardMode] = ALL_MODES,
               ladder: tuple[int, ...] = (1, 2, 4, 8)) -> list[Comparison]:
    """Eager, capture, replay and padded replay of `modes` on both backends; every comparison made."""
    rng = random.Random(seed * 1000 + page_size * 10 + K * 3 + T)
    modes = tuple(modes)
    h = ParityHarness(up, page_size=page_size, K=K, T=T, num_steps=max(K - 1, 2), ladder=list(ladder), faults=faults,
                      graph_modes=modes)
    sizes = [3, max(ladder), 1, 5, 2, 7, 4, 6]
    for it in range(iterations):
        bs = min(sizes[it % len(sizes)], max(ladder))
        rows = h.new_batch(rng, bs, max_extra=max(T, K) + 2)
        for mode in modes:
            if mode == ForwardMode.EXTEND:
                h.eager(mode, rows)  # no prefix: new tokens = the whole sequence
                pre = [rng.randint(0, s - 1) for _, s in rows]
                h.eager(mode, rows, prefix=pre)
                continue
            h.eager(mode, rows)
            if mode in GRAPH_MODES:
                h.replay(mode, rows)
    return h.cmp
