"""Our re-implementation of SGLang's `TRTLLMHAAttnBackend`: metadata per forward mode, CUDA-graph state with a
build step (bind views at capture) and an apply step (refresh them before every replay), and the kernel calls.

Metadata follows `reference/sglang-trtllm-mha.md` §3.2 (sglang 0.5.13). The kernels are pluggable: the
reference kernels on the CPU, flashinfer's XQA / FMHAv2 / trtllm-gen on GPUs (`flashinfer_kernels.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from ..tracer.schema import ForwardMode
from .attention_backend import AttentionBackend
from .spec_mask import packed_causal_mask

if TYPE_CHECKING:
    from .attention_layer import AttentionLayer
    from .forward_batch import ForwardBatch
    from .memory import KVPool, ReqToTokenPool


class AttentionKernels(Protocol):
    """The two kernel entry points the backend calls (see `reference_attention.ReferenceKernels`)."""

    name: str

    def decode(self, q: torch.Tensor, kv_cache: torch.Tensor, page_table: torch.Tensor,
               cache_seqlens: torch.Tensor, *, q_len_per_req: int, page_size: int, scaling: float,
               mask: torch.Tensor | None, max_seq_len: int) -> torch.Tensor: ...

    def context(self, q: torch.Tensor, kv_cache: torch.Tensor, page_table: torch.Tensor,
                cache_seqlens: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, *,
                max_q_len: int, max_kv_len: int, batch_size: int, page_size: int,
                scaling: float) -> torch.Tensor: ...


@dataclass
class TRTLLMMHAMetadata:
    """What the kernels consume (`TRTLLMMHAMetadata`, TMB L47-64). SGLang's fields default to None; here a
    metadata object is made only once its tensors exist, so the kernels never see a missing one."""

    cache_seqlens_int32: torch.Tensor  # int32 [rows]: KV length incl. this forward's tokens
    cu_seqlens_q: torch.Tensor  # int32 [rows+1]
    cu_seqlens_k: torch.Tensor  # int32 [rows+1]
    page_table: torch.Tensor  # int32 [rows, W]: physical page of logical page j
    max_seq_len_q: int = 1  # tokens per request; frozen into a graph at capture
    max_seq_len_k: int = 0  # host max(cache_seqlens); sizes the page-table refresh only
    # Graph bookkeeping (not in SGLang's dataclass; we record it so checks can compare capture and replay).
    captured_max_seq_len_q: int | None = None  # the value the graph froze; None for eager metadata
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def kernel_q_len(self) -> int:
        """`q_len_per_req` the kernel runs with: the captured value inside a graph, else the live one."""
        return self.max_seq_len_q if self.captured_max_seq_len_q is None else self.captured_max_seq_len_q


# Fault `wild-page-id` (GPU only): a page id far outside any KV pool; the kernel faults on it (illegal address).
WILD_PAGE_ID = (1 << 31) - 1

_GRAPH_KINDS = (ForwardMode.DECODE, ForwardMode.DRAFT_DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND)


class TRTLLMHABackend(AttentionBackend):
    """TRTLLM MHA attention over a paged KV cache (one instance per model / draft step)."""

    def __init__(
        self, *, req_to_token_pool: ReqToTokenPool, kv_pool: KVPool, page_size: int, max_context_len: int,
        num_draft_tokens: int, kernels: AttentionKernels, device: torch.device, speculative_step_id: int = 0,
        faults: frozenset[str] = frozenset(),
    ) -> None:
        self.req_to_token = req_to_token_pool.req_to_token
        self.kv_pool = kv_pool
        self.page_size = page_size
        self.max_context_len = max_context_len
        # Cached once at construction, like SGLang's `self.speculative_num_draft_tokens` (TMB L125-127).
        self.speculative_num_draft_tokens = num_draft_tokens
        self.speculative_step_id = speculative_step_id
        self.kernels = kernels
        self.device = device
        self.faults = faults
        self._metadata: TRTLLMMHAMetadata | None = None  # the forward's metadata, once one was prepared
        self.fired: list[str] = []  # faults that changed the metadata since `take_fired` (accounting only)
        self.calling: str | None = None  # the kernel entry point being called (named in a CallError if it raises)
        self.graph_metadata: dict[tuple[ForwardMode, int], TRTLLMMHAMetadata] = {}
        self._buffers: dict[ForwardMode, dict[str, torch.Tensor]] = {}
        self._masks: dict[int, torch.Tensor] = {}
        self._max_bs = 0
        # Attention probe (differential check): layer 0's q and output of the latest forward.
        self.probe_enabled = False
        self._probe_last: tuple[torch.Tensor, torch.Tensor] | None = None  # (q, output) of an eager forward
        self._probe_static: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def forward_metadata(self) -> TRTLLMMHAMetadata:
        """The metadata of the forward last prepared (eager, graph capture or replay prep)."""
        md = self._metadata
        if md is None:
            raise RuntimeError(f"{type(self).__name__} has no forward metadata yet: init_forward_metadata (or a "
                               "CUDA-graph capture or replay prep) must run before the forward")
        return md

    # ---- eager ---------------------------------------------------------------------------------------
    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        """Eager metadata per forward mode (TMB L649-768)."""
        bs, mode, dev = fb.batch_size, fb.forward_mode, self.device
        seq_lens = fb.seq_lens[:bs]
        s_max = int(fb.seq_lens_cpu[:bs].max()) if bs else 0
        max_seq_len_q = 1
        if mode == ForwardMode.DECODE:
            cache_seqlens = seq_lens.to(torch.int32)
            max_seq_len_k = s_max
            cu_seqlens_q = torch.arange(0, bs + 1, dtype=torch.int32, device=dev)
        elif mode == ForwardMode.DRAFT_DECODE:
            off = self.speculative_step_id + 1
            cache_seqlens = (seq_lens + off).to(torch.int32)
            max_seq_len_k = s_max + off
            cu_seqlens_q = torch.arange(0, bs + 1, dtype=torch.int32, device=dev)
        elif mode == ForwardMode.TARGET_VERIFY:
            t = fb.num_tokens // bs
            cache_seqlens = (seq_lens + t).to(torch.int32)
            max_seq_len_q = t
            max_seq_len_k = s_max + t
            cu_seqlens_q = torch.arange(0, bs * t + 1, t, dtype=torch.int32, device=dev)
        elif mode in (ForwardMode.DRAFT_EXTEND, ForwardMode.EXTEND):
            ext = fb.extend_seq_lens_cpu or []
            cache_seqlens = seq_lens.to(torch.int32)
            max_seq_len_k = s_max
            max_seq_len_q = max(ext) if ext else 1
            if ext and min(ext) == max(ext):  # draft extend (T per row): built on the device, no host copy
                cu_seqlens_q = torch.arange(0, bs * ext[0] + 1, ext[0], dtype=torch.int32, device=dev)
            else:
                cu_q = torch.zeros(bs + 1, dtype=torch.int32)
                cu_q[1:] = torch.cumsum(torch.tensor(ext, dtype=torch.int32), 0)
                cu_seqlens_q = cu_q.pin_memory().to(dev, non_blocking=True) if dev.type == "cuda" else cu_q
        else:
            raise ValueError(f"unsupported forward mode {mode}")
        cu_seqlens_k = _prefix_sum(cache_seqlens)
        width = -(-max_seq_len_k // self.page_size)
        strided = torch.arange(0, width * self.page_size, self.page_size, device=dev)
        rpi = fb.req_pool_indices[:bs]
        page_table = (self.req_to_token[rpi[:, None], strided[None, :]] // self.page_size).to(torch.int32)
        md = TRTLLMMHAMetadata(cache_seqlens_int32=cache_seqlens, cu_seqlens_q=cu_seqlens_q,
                               cu_seqlens_k=cu_seqlens_k, page_table=page_table, max_seq_len_q=max_seq_len_q,
                               max_seq_len_k=max_seq_len_k)
        self._wild_page(md, mode, bs)
        self._metadata = md

    def take_fired(self) -> list[str]:
        """The faults that changed metadata since the last call (for the step being prepared)."""
        out, self.fired = self.fired, []
        return out

    def _fire(self, fault: str) -> None:
        if fault not in self.fired:
            self.fired.append(fault)

    def _wild_page(self, md: TRTLLMMHAMetadata, mode: ForwardMode, bs: int) -> None:
        # Fault `wild-page-id`: the verify kernel is handed a page id no pool has (no argument check looks).
        if "wild-page-id" in self.faults and mode == ForwardMode.TARGET_VERIFY and bs:
            md.page_table[0, 0] = WILD_PAGE_ID
            self._fire("wild-page-id")

    # ---- CUDA graphs ---------------------------------------------------------------------------------
    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """Static buffers per graph kind (TMB L235-334)."""
        dev, k = self.device, self.speculative_num_draft_tokens
        max_pages = -(-self.max_context_len // self.page_size)
        self._max_bs = max_bs
        for mode in _GRAPH_KINDS:
            bufs = {
                "cache_seqlens": torch.zeros(max_bs, dtype=torch.int32, device=dev),
                "cu_seqlens_k": torch.zeros(max_bs + 1, dtype=torch.int32, device=dev),
                "page_table": torch.zeros(max_bs, max_pages, dtype=torch.int32, device=dev),
            }
            if mode == ForwardMode.TARGET_VERIFY:
                # Static, stride K, never rewritten (TMB L290-296); the decode kernel does not read it.
                bufs["cu_seqlens_q"] = torch.arange(0, max_bs * k + 1, k, dtype=torch.int32, device=dev)
            elif mode == ForwardMode.DRAFT_EXTEND:
                bufs["cu_seqlens_q"] = torch.zeros(max_bs + 1, dtype=torch.int32, device=dev)
            else:
                bufs["cu_seqlens_q"] = torch.arange(0, max_bs + 1, dtype=torch.int32, device=dev)
            self._buffers[mode] = bufs
        self._strided = torch.arange(0, max_pages * self.page_size, self.page_size, device=dev)

    def _build_cuda_graph_metadata(self, bs: int, num_tokens: int, mode: ForwardMode) -> TRTLLMMHAMetadata:
        """Bind `[:bs]` views of the static buffers (TMB L336-432); these addresses are what the graph holds."""
        bufs = self._buffers[mode]
        md = TRTLLMMHAMetadata(
            cache_seqlens_int32=bufs["cache_seqlens"][:bs],
            cu_seqlens_q=bufs["cu_seqlens_q"][: bs + 1],
            cu_seqlens_k=bufs["cu_seqlens_k"][: bs + 1],
            page_table=bufs["page_table"][:bs],
        )
        if mode in (ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND):
            md.max_seq_len_q = num_tokens // bs  # from the captured request shape (post-#27495)
        self.graph_metadata[(mode, bs)] = md
        return md

    def _apply_cuda_graph_metadata(
        self, md: TRTLLMMHAMetadata, bs: int, fb: ForwardBatch, *, in_capture: bool,
    ) -> None:
        """Refresh the bound views in place (TMB L434-555). Runs at capture and before every replay."""
        mode = fb.forward_mode
        seq_lens = fb.seq_lens[:bs]
        s_max = int(fb.seq_lens_cpu[:bs].max())
        if mode == ForwardMode.DECODE:
            md.cache_seqlens_int32.copy_(seq_lens)
            md.max_seq_len_k = s_max
        elif mode == ForwardMode.DRAFT_DECODE:
            off = self.speculative_step_id + 1
            if in_capture and "zero-cache-seqlens-at-capture" in self.faults:
                self._fire("zero-cache-seqlens-at-capture")
            else:
                torch.add(seq_lens, off, out=md.cache_seqlens_int32)
            md.max_seq_len_k = s_max + off
        elif mode == ForwardMode.TARGET_VERIFY:
            if "max-seq-len-q-override" in self.faults:
                md.max_seq_len_q = self.speculative_num_draft_tokens  # the line PR #27495 removed
                if md.max_seq_len_q != fb.num_tokens // bs:
                    self._fire("max-seq-len-q-override")  # only bites when the runner's T differs from K
            torch.add(seq_lens, md.max_seq_len_q, out=md.cache_seqlens_int32)
            md.max_seq_len_k = s_max + md.max_seq_len_q
        elif mode == ForwardMode.DRAFT_EXTEND:
            md.cache_seqlens_int32.copy_(seq_lens)
            k = md.max_seq_len_q
            torch.arange(k, bs * k + 1, k, out=md.cu_seqlens_q[1:])
            md.max_seq_len_k = s_max
        # Written in place through out= (one kernel each instead of a temporary and a copy): fewer launches per
        # replay, the same values.
        torch.cumsum(md.cache_seqlens_int32, 0, dtype=torch.int32, out=md.cu_seqlens_k[1:])
        n_pages = -(-md.max_seq_len_k // self.page_size)
        if in_capture or "stale-page-table" not in self.faults:
            rpi = fb.req_pool_indices[:bs]
            torch.floor_divide(self.req_to_token[rpi[:, None], self._strided[None, :n_pages]], self.page_size,
                               out=md.page_table[:, :n_pages])
        elif n_pages:
            self._fire("stale-page-table")  # the refresh was skipped: the kernel reads what the buffer held
        if not in_capture:
            self._wild_page(md, mode, bs)  # at a replay, so the run gets going before the kernel faults

    def init_forward_metadata_capture_cuda_graph(self, bs: int, num_tokens: int, fb: ForwardBatch) -> None:
        """Capture: build + apply, then freeze the scalars the graph bakes in."""
        md = self._build_cuda_graph_metadata(bs, num_tokens, fb.forward_mode)
        self._apply_cuda_graph_metadata(md, bs, fb, in_capture=True)
        md.captured_max_seq_len_q = md.max_seq_len_q
        if fb.forward_mode == ForwardMode.DRAFT_EXTEND and "draft-extend-capture-q-len" in self.faults:
            md.captured_max_seq_len_q = 1  # v1 took max_seq_len_q from the accept counts: 1 at capture (G5)
            self._fire("draft-extend-capture-q-len")
        self._metadata = md

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        """Replay prep: refresh the views bound at capture."""
        md = self.graph_metadata[(fb.forward_mode, bs)]
        self._apply_cuda_graph_metadata(md, bs, fb, in_capture=False)
        self._metadata = md

    def enable_probe(self, max_tokens: int, num_q_heads: int, head_dim: int, dtype: torch.dtype) -> None:
        """Keep layer 0's q and output of each forward; graphs copy them into static buffers on replay."""
        self.probe_enabled = True
        self._probe_static = (torch.zeros(max_tokens, num_q_heads, head_dim, dtype=dtype, device=self.device),
                              torch.zeros(max_tokens, num_q_heads * head_dim, dtype=dtype, device=self.device))

    def probe_result(self, num_tokens: int, replayed_graph: bool) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Layer 0's (q `[n, Hq, D]`, output `[n, Hq*D]`) of the latest forward, if probing."""
        if not self.probe_enabled:
            return None
        if replayed_graph and self._probe_static is not None:
            return self._probe_static[0][:num_tokens], self._probe_static[1][:num_tokens]
        if self._probe_last is None:
            return None
        q, out = self._probe_last
        return q[:num_tokens], out[:num_tokens]

    def _probe(self, layer: AttentionLayer, q: torch.Tensor, out: torch.Tensor) -> None:
        if not self.probe_enabled or layer.layer_id != 0:
            return
        if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            assert self._probe_static is not None  # enable_probe made the static buffers with probe_enabled
            n = q.shape[0]
            self._probe_static[0][:n].copy_(q)
            self._probe_static[1][:n].copy_(out)
        else:
            self._probe_last = (q, out)

    def spec_mask(self, rows: int, q_len: int) -> torch.Tensor:
        """The packed causal mask XQA needs for verify, built once per T (like `_xqa_spec_dec_mask`)."""
        m = self._masks.get(q_len)
        if m is None or m.shape[0] < rows:
            m = packed_causal_mask(max(rows, self._max_bs, 1), q_len, self.device)
            self._masks[q_len] = m
        return m[:rows]

    # ---- kernels -------------------------------------------------------------------------------------
    def forward_decode(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: AttentionLayer, fb: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        """Decode / draft decode: q_len_per_req = 1."""
        if save_kv_cache:
            self.kv_pool.set_kv(layer.layer_id, fb.out_cache_loc, k, v)
        md = self.forward_metadata
        self.calling = f"kernel:{getattr(self.kernels, 'decode_entry', 'decode')}"
        out = self.kernels.decode(
            q, self.kv_pool.kv_buffer[layer.layer_id], md.page_table,
            md.cache_seqlens_int32, q_len_per_req=1, page_size=self.page_size, scaling=layer.scaling,
            mask=None, max_seq_len=self.max_context_len)
        self.calling = None
        out = out.reshape(q.shape[0], -1)
        self._probe(layer, q, out)
        return out

    def forward_extend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: AttentionLayer, fb: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        """Target verify through the decode kernel with q_len_per_req = T; extend through the context kernel."""
        if save_kv_cache:
            self.kv_pool.set_kv(layer.layer_id, fb.out_cache_loc, k, v)
        md = self.forward_metadata
        kv_cache = self.kv_pool.kv_buffer[layer.layer_id]
        if fb.forward_mode == ForwardMode.TARGET_VERIFY:
            t = md.kernel_q_len
            rows = q.shape[0] // t
            self.calling = f"kernel:{getattr(self.kernels, 'decode_entry', 'decode')}"
            out = self.kernels.decode(
                q, kv_cache, md.page_table, md.cache_seqlens_int32, q_len_per_req=t,
                page_size=self.page_size, scaling=layer.scaling, mask=self.spec_mask(rows, t),
                max_seq_len=self.max_context_len)
        else:
            self.calling = f"kernel:{getattr(self.kernels, 'context_entry', 'context')}"
            out = self.kernels.context(
                q, kv_cache, md.page_table, md.cache_seqlens_int32, md.cu_seqlens_q, md.cu_seqlens_k,
                max_q_len=md.kernel_q_len, max_kv_len=self.max_context_len,
                batch_size=md.cu_seqlens_q.shape[0] - 1, page_size=self.page_size, scaling=layer.scaling)
        self.calling = None
        out = out.reshape(q.shape[0], -1)
        self._probe(layer, q, out)
        return out


class MissingFixupHookBackend(TRTLLMHABackend):
    """Fault `missing-fixup-hook`: the backend as it was before PR #25925, inheriting the raising base hook."""

    def update_verify_buffers_to_fill_after_draft(self, spec_info: Any, cuda_graph_bs: int | None) -> None:
        """The pre-#25925 behaviour: SGLang's base class raised here."""
        raise NotImplementedError(
            f"{type(self).__name__} does not implement update_verify_buffers_to_fill_after_draft")


def _prefix_sum(x: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(x.shape[0] + 1, dtype=torch.int32, device=x.device)
    out[1:] = torch.cumsum(x, 0, dtype=torch.int32)
    return out
