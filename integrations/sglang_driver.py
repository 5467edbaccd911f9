"""Drive a loaded upstream backend (`sglang_loader`) the way SGLang's graph runners and workers do.

What SGLang's runners do around the backend is reproduced here from their source; what differs between releases
comes from `sglang_versions.facts_for` (`up.facts`):

- capture: static buffers with `seq_lens` = the backend's fill value (1), `req_pool_indices` = 0, `out_cache_loc`
  = 0; the ladder is captured largest batch first (the decode graph runner's capture loop, reversed); the
  backend's capture entry: `init_forward_metadata_out_graph(fb, in_capture=True)` (0.5.13+) or
  `init_forward_metadata_capture_cuda_graph(...)` (0.5.12), then, where graph metadata is computed inside the
  graph (0.5.15+), `init_forward_metadata_in_graph(fb)`: the call the graph records;
- padded replay (raw bs < captured bs): the same fill values in rows `[raw_bs, bs)` (`CudaGraphRunner.replay_prepare`,
  `EAGLEDraftCudaGraphRunner.replay`, `EAGLEDraftExtendCudaGraphRunner.replay`), then the backend's replay entry:
  `init_forward_metadata_out_graph(view)` with the real `build_replay_fb_view` (0.5.13+; its
  `global_num_tokens_cpu` argument from 0.5.21) or `init_forward_metadata_replay_cuda_graph(bs, ...)` (0.5.12);
  from 0.5.15 `graph.replay()` then re-runs the recorded `init_forward_metadata_in_graph` on the capture's own
  static buffers, which is what `replay_prepare` runs after the out-of-graph prep;
- spec inputs: the attributes of `EagleDraftInput` / `EagleVerifyInput` / `EagleDraftExtendInput` the backend reads;
  the draft-extend capture input carries `num_tokens_per_req = T` from 0.5.16 (the runner's `captured_req_width`),
  -1 before (capture derived the width from the token count).

Batches come in specscope's `ForwardBatch` form (backend/forward_batch.py) and are translated by
`upstream_batch`: DRAFT_DECODE becomes SGLang's DECODE with a draft `spec_info`, DRAFT_EXTEND becomes
DRAFT_EXTEND_V2 (uniform T tokens per request), the other modes keep their names. The ForwardBatch fields newer
releases read and specscope does not model (a unified pool's `kv_loc_plan`, ragged verify's layout, LoRA ids, a
host max) are None, as in a ForwardBatch that does not use them.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

import torch

from ..backend.forward_batch import ForwardBatch
from ..backend.memory import KVPool, ReqToTokenPool
from ..tracer.schema import ForwardMode
from .sglang_loader import UpstreamSglang
from .sglang_stand_ins import UpstreamBatch


@dataclass
class DraftInput:
    """What the backend reads of `EagleDraftInput` (draft decode, draft extend v2)."""

    num_tokens_per_req: int = -1
    num_accept_tokens: torch.Tensor | None = None
    num_accept_tokens_cpu: list[int] | None = None
    num_correct_drafts: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    ragged_verify_layout: Any = None  # 0.5.16+: per-request verify lengths (not modelled)

    def is_draft_input(self) -> bool:
        """SpecInput's type test."""
        return True

    def is_verify_input(self) -> bool:
        """SpecInput's type test."""
        return False


@dataclass
class VerifyInput:
    """What a verify forward carries in `EagleVerifyInput` (the backend reads none of it with topk = 1)."""

    draft_token: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    draft_token_num: int = 0
    ragged_verify_layout: Any = None  # 0.5.16+: per-request verify lengths (not modelled)
    extra: dict[str, Any] = field(default_factory=dict)

    def is_draft_input(self) -> bool:
        """SpecInput's type test."""
        return False

    def is_verify_input(self) -> bool:
        """SpecInput's type test."""
        return True


def upstream_mode(up: UpstreamSglang, mode: ForwardMode) -> Any:
    """SGLang's ForwardMode for one of ours (our DRAFT_EXTEND is the spec-v2 worker's DRAFT_EXTEND_V2, which every
    release has; v1 DRAFT_EXTEND is gone from 0.5.14)."""
    fm = up.ForwardMode
    return {ForwardMode.DECODE: fm.DECODE, ForwardMode.DRAFT_DECODE: fm.DECODE,
            ForwardMode.TARGET_VERIFY: fm.TARGET_VERIFY, ForwardMode.EXTEND: fm.EXTEND,
            ForwardMode.DRAFT_EXTEND: fm.DRAFT_EXTEND_V2}[mode]


# ForwardBatch fields newer releases read (the backend or `build_replay_fb_view`) that specscope does not model;
# a ForwardBatch that does not use them holds None.
UNMODELLED_FIELDS = ("kv_loc_plan", "kv_loc_cols", "out_cache_loc_virtual", "max_seq_len_host",
                     "max_seq_len_override", "lora_ids", "can_run_decode_cuda_graph", "origin_out_cache_loc")


def _unmodelled() -> dict[str, None]:
    return dict.fromkeys(UNMODELLED_FIELDS)


def specscope_batch(r2t: ReqToTokenPool, kv: KVPool, backend: Any, mode: ForwardMode, rows: list[tuple[int, int]],
                    *, T: int, step: int | None = None, prefix: list[int] | None = None) -> ForwardBatch:
    """Our ForwardBatch for `rows` = (req slot, S) under specscope's conventions (backend/forward_batch.py): S is
    the committed length; DECODE and DRAFT_EXTEND count this forward's tokens in seq_lens, EXTEND's seq_lens
    is the whole length (new tokens after `prefix`)."""
    bs, table = len(rows), r2t.req_to_token
    ext: list[int] | None  # per-request new tokens and prefix lengths: EXTEND and DRAFT_EXTEND only
    pre: list[int] | None
    if mode == ForwardMode.EXTEND:
        pre = prefix or [0] * bs
        ext = [s - p for (_, s), p in zip(rows, pre, strict=True)]
        seq = [s for _, s in rows]
        pos = [p + j for p, e in zip(pre, ext, strict=True) for j in range(e)]
        slot_of = [slot for (slot, _), e in zip(rows, ext, strict=True) for _ in range(e)]
    else:
        T = 1 if mode in (ForwardMode.DECODE, ForwardMode.DRAFT_DECODE) else T
        off = {ForwardMode.DECODE: 1, ForwardMode.DRAFT_EXTEND: T}.get(mode, 0)
        seq = [s + off for _, s in rows]
        first = {ForwardMode.DRAFT_DECODE: step or 0}.get(mode, 0)
        pos = [s + first + j for _, s in rows for j in range(T)]
        slot_of = [slot for slot, _ in rows for _ in range(T)]
        ext = [T] * bs if mode == ForwardMode.DRAFT_EXTEND else None
        pre = [s for _, s in rows] if mode == ForwardMode.DRAFT_EXTEND else None
    dev = table.device
    pos_t = torch.tensor(pos, dtype=torch.int64, device=dev)
    loc = table[torch.tensor(slot_of, dtype=torch.int64, device=dev), pos_t].to(torch.int64)
    seq_t = torch.tensor(seq, dtype=torch.int32)
    return ForwardBatch(
        forward_mode=mode, batch_size=bs, input_ids=torch.arange(len(pos), dtype=torch.int64, device=dev) + 7,
        positions=pos_t, seq_lens=seq_t.to(dev), seq_lens_cpu=seq_t,
        req_pool_indices=torch.tensor([slot for slot, _ in rows], dtype=torch.int64, device=dev), out_cache_loc=loc,
        req_to_token_pool=r2t, token_to_kv_pool=kv, attn_backend=backend, extend_seq_lens_cpu=ext,
        extend_prefix_lens_cpu=pre, spec_step_id=step, num_tokens_per_req=T if ext is None else 1)


def upstream_batch(up: UpstreamSglang, fb: ForwardBatch, accept_lens: list[int] | None = None,
                   num_steps: int | None = None) -> UpstreamBatch:
    """The SGLang ForwardBatch fields the backend reads, for the same forward as our `fb`.

    For DRAFT_DECODE with `num_steps`, `out_cache_loc` becomes SGLang's request-major `[bs * num_steps]` draft
    slots `req_to_token[rpi, S : S + num_steps]` (what `assign_draft_cache_locs` writes)."""
    mode, bs = fb.forward_mode, fb.batch_size
    spec: Any = None
    loc = fb.out_cache_loc
    if mode == ForwardMode.DRAFT_DECODE:
        spec = DraftInput(num_tokens_per_req=1)
        if num_steps:
            cols = fb.positions[:bs, None] + torch.arange(num_steps, device=fb.positions.device)[None, :]
            loc = fb.req_to_token_pool.req_to_token[fb.req_pool_indices[:, None], cols].reshape(-1).to(torch.int64)
    elif mode == ForwardMode.TARGET_VERIFY:
        spec = VerifyInput(draft_token=fb.input_ids, positions=fb.positions, draft_token_num=fb.num_tokens // bs)
    elif mode == ForwardMode.DRAFT_EXTEND:
        t = fb.num_tokens // bs
        acc = accept_lens or [t] * bs
        spec = DraftInput(num_tokens_per_req=t, num_accept_tokens=torch.tensor(acc, dtype=torch.int32,
                                                                                device=fb.seq_lens.device),
                          num_accept_tokens_cpu=list(acc), positions=fb.positions)
    ext = fb.extend_seq_lens_cpu
    return UpstreamBatch(
        forward_mode=upstream_mode(up, mode), batch_size=bs, input_ids=fb.input_ids, positions=fb.positions,
        seq_lens=fb.seq_lens, seq_lens_cpu=fb.seq_lens_cpu, seq_lens_sum=int(fb.seq_lens_cpu[:bs].sum()),
        req_pool_indices=fb.req_pool_indices, out_cache_loc=loc, encoder_lens=None, spec_info=spec,
        extend_seq_lens=None if ext is None else torch.tensor(ext, dtype=torch.int32, device=fb.seq_lens.device),
        extend_seq_lens_cpu=None if ext is None else list(ext),
        extend_prefix_lens_cpu=list(fb.extend_prefix_lens_cpu or [0] * bs) if ext is not None else None,
        req_to_token_pool=fb.req_to_token_pool, global_num_tokens_cpu=None, **_unmodelled())


def step_backends(backend: Any) -> list[Any]:
    """The per-step backends of a multi-step draft wrapper, or `[backend]`."""
    return list(backend.attn_backends) if hasattr(backend, "speculative_num_steps") else [backend]


class UpstreamGraphRunner:
    """Capture and padded replay of one forward kind on an upstream backend (or its multi-step draft wrapper),
    with the fill values and replay entry points of SGLang's runners. Graphs themselves are not recorded: on a
    CPU this is the metadata half of capture and replay, which is all the backend does; where a release computes
    graph metadata inside the graph (0.5.15+), the in-graph call runs right where the graph would run it."""

    # `build_replay_fb_view` reads these of its buffers: no encoder-decoder model, no mamba tracking.
    encoder_lens = None
    mamba_track_indices = None

    def __init__(self, up: UpstreamSglang, backend: Any, mode: ForwardMode, *, tokens_per_req: int,
                 ladder: list[int], device: torch.device | str = "cpu") -> None:
        self.up, self.backend, self.mode = up, backend, mode
        self.T = tokens_per_req
        self.ladder = sorted(set(ladder))
        self.max_bs = self.ladder[-1]
        dev = torch.device(device)
        n = self.max_bs * self.T
        self.fill = step_backends(backend)[0].get_cuda_graph_seq_len_fill_value()
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n, dtype=torch.int64, device=dev)
        # The draft graph's KV write slots cover every draft step: [max_bs * speculative_num_steps].
        self.out_cache_loc = torch.zeros(n * getattr(backend, "speculative_num_steps", 1), dtype=torch.int64,
                                         device=dev)
        self.seq_lens = torch.full((self.max_bs,), self.fill, dtype=torch.int32, device=dev)
        self.seq_lens_cpu = torch.full((self.max_bs,), self.fill, dtype=torch.int32)
        self.req_pool_indices = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.num_accept_tokens = torch.full((self.max_bs,), self.T, dtype=torch.int32, device=dev)
        self.captured_q_len: dict[tuple[int, int], int | None] = {}  # (bs, step backend) -> max_seq_len_q at capture
        self.captured: dict[tuple[int, int], Any] = {}  # (bs, step backend) -> the metadata object at capture
        # bs -> the batch the graph of that size was captured with: its in-graph metadata call reads these static
        # buffers at every replay (0.5.15+).
        self.capture_batches: dict[int, UpstreamBatch] = {}
        backend.init_cuda_graph_state(self.max_bs, n)

    def padded_size(self, raw_bs: int) -> int:
        """Smallest captured size >= raw_bs (`bisect_left` over the ladder, as the runners do)."""
        return self.ladder[bisect.bisect_left(self.ladder, raw_bs)]

    def _spec(self, bs: int, capture: bool) -> Any:
        if self.mode == ForwardMode.DRAFT_DECODE:
            return DraftInput(num_tokens_per_req=1)
        if self.mode == ForwardMode.TARGET_VERIFY:
            return VerifyInput(draft_token=self.input_ids[: bs * self.T], positions=self.positions[: bs * self.T],
                               draft_token_num=self.T)
        if self.mode == ForwardMode.DRAFT_EXTEND:
            # The capture input is a synthetic EagleDraftExtendInput: from 0.5.16 it carries the graph's request
            # width (which capture freezes into max_seq_len_q); before, capture inferred it from the token count.
            width = self.T if self.up.facts.draft_extend_capture_width else -1
            return DraftInput(num_tokens_per_req=width, num_accept_tokens=self.num_accept_tokens[:bs])
        return None

    def capture_all(self) -> None:
        """Capture every ladder size, largest first."""
        for bs in reversed(self.ladder):
            self.capture(bs)

    def in_graph(self, bs: int) -> None:
        """What a graph of size `bs` computes inside itself before its kernels run (0.5.15+): the recorded
        `init_forward_metadata_in_graph` over the capture's static buffers. Nothing on earlier releases."""
        if self.up.facts.graph_metadata_in_graph:
            self.backend.init_forward_metadata_in_graph(self.capture_batches[bs])

    def capture(self, bs: int) -> UpstreamBatch:
        """The capture-time metadata of batch size `bs`."""
        n = bs * self.T
        self.seq_lens[:bs].fill_(self.fill)
        self.seq_lens_cpu[:bs].fill_(self.fill)
        self.req_pool_indices.zero_()
        self.out_cache_loc.zero_()
        self.positions.zero_()
        self.input_ids.zero_()
        fb = UpstreamBatch(
            forward_mode=upstream_mode(self.up, self.mode), batch_size=bs, input_ids=self.input_ids[:n],
            positions=self.positions[:n], seq_lens=self.seq_lens[:bs], seq_lens_cpu=self.seq_lens_cpu[:bs],
            seq_lens_sum=bs * self.fill, req_pool_indices=self.req_pool_indices[:bs],
            out_cache_loc=self.out_cache_loc[:n], encoder_lens=None, spec_info=self._spec(bs, True),
            extend_seq_lens=None, extend_seq_lens_cpu=None, extend_prefix_lens_cpu=None, global_num_tokens_cpu=None,
            **_unmodelled())
        self.capture_batches[bs] = fb
        be = self.backend
        if self.up.api == "out_graph":
            be.init_forward_metadata_out_graph(fb, in_capture=True)
        elif self.mode == ForwardMode.DRAFT_DECODE:
            be.init_forward_metadata_capture_cuda_graph(fb)
        else:
            be.init_forward_metadata_capture_cuda_graph(bs, n, fb.req_pool_indices, fb.seq_lens, None,
                                                        fb.forward_mode, fb.spec_info)
        self.in_graph(bs)
        for i, sb in enumerate(step_backends(be)):
            md = sb.forward_metadata
            self.captured_q_len[(bs, i)] = None if md is None else md.max_seq_len_q
            self.captured[(bs, i)] = sb.forward_metadata
        return fb

    def replay_prepare(self, live: UpstreamBatch) -> UpstreamBatch:
        """Copy a live batch into the static buffers with upstream's padding, then the backend's replay prep (and,
        from 0.5.15, the in-graph metadata call `graph.replay()` re-runs)."""
        view = self.replay_prepare_out_graph(live)
        self.in_graph(view.batch_size)
        return view

    def replay_prepare_out_graph(self, live: UpstreamBatch) -> UpstreamBatch:
        """The out-of-graph half of `replay_prepare`: static buffers filled, the backend's replay prep run. On
        releases that compute graph metadata inside the graph (0.5.15+), the metadata the kernels read is not
        there yet: `in_graph(view.batch_size)` computes it."""
        raw_bs, num_tokens = live.batch_size, int(live.input_ids.shape[0])
        bs = self.padded_size(raw_bs)
        n = bs * self.T
        if bs != raw_bs or n != num_tokens:
            self.seq_lens.fill_(self.fill)
            self.out_cache_loc.zero_()
            self.positions.zero_()
            self.req_pool_indices.zero_()
            self.num_accept_tokens.fill_(self.T)
            self.seq_lens_cpu.fill_(self.fill)
        self.input_ids[:num_tokens].copy_(live.input_ids)
        self.positions[:num_tokens].copy_(live.positions)
        self.seq_lens[:raw_bs].copy_(live.seq_lens)
        self.seq_lens_cpu[:raw_bs].copy_(live.seq_lens_cpu)
        self.out_cache_loc[: live.out_cache_loc.shape[0]].copy_(live.out_cache_loc)
        self.req_pool_indices[:raw_bs].copy_(live.req_pool_indices)
        spec = live.spec_info
        if self.mode == ForwardMode.DRAFT_EXTEND and spec is not None and spec.num_accept_tokens is not None:
            self.num_accept_tokens[:raw_bs].copy_(spec.num_accept_tokens)
            if bs != raw_bs:
                spec.num_accept_tokens = self.num_accept_tokens[:bs]
        seq_sum = None if live.seq_lens_sum is None else live.seq_lens_sum + (bs - raw_bs) * self.fill
        be, mode = self.backend, upstream_mode(self.up, self.mode)
        view = UpstreamBatch(
            batch_size=bs, forward_mode=mode, actual_forward_mode=live.forward_mode, input_ids=self.input_ids[:n],
            positions=self.positions[:n], req_pool_indices=self.req_pool_indices[:bs], seq_lens=self.seq_lens[:bs],
            seq_lens_sum=seq_sum, seq_lens_cpu=self.seq_lens_cpu[:bs], encoder_lens=None,
            out_cache_loc=live.out_cache_loc, spec_info=spec, **_unmodelled())
        if self.up.api == "out_graph":
            if self.mode == ForwardMode.TARGET_VERIFY and self.up.build_replay_fb_view is not None:
                if self.up.facts.replay_view_takes_global_tokens:
                    view = self.up.build_replay_fb_view(live, self, bs, raw_bs, n, live.global_num_tokens_cpu,
                                                        self.fill, mode, False)
                else:
                    view = self.up.build_replay_fb_view(live, self, bs, raw_bs, n, self.fill, mode, False)
            be.init_forward_metadata_out_graph(view)
        elif self.mode == ForwardMode.DRAFT_DECODE:
            be.init_forward_metadata_replay_cuda_graph(view, bs)
        else:
            be.init_forward_metadata_replay_cuda_graph(bs, self.req_pool_indices[:bs], self.seq_lens[:bs], seq_sum,
                                                       None, mode, spec, seq_lens_cpu=self.seq_lens_cpu[:bs])
        return view
