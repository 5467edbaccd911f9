"""CUDA-graph runners: static input buffers, capture over a ladder of batch sizes, padded replay.

On a GPU the forward is captured into a real `torch.cuda.CUDAGraph`. On the CPU the same structure runs
with the graph emulated: capture binds the static buffers and metadata views and runs the forward once;
replay refreshes the buffers in place and re-runs the forward over exactly those buffers, with the scalars
frozen at capture. So every capture/replay bug of the metadata path reproduces without a GPU.
"""

from __future__ import annotations

import bisect
import gc
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..tracer.schema import ForwardMode
from .forward_batch import ForwardBatch
from .trtllm_mha_backend import TRTLLMHABackend

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE  # what graph_pool_handle() returns; torch names it only privately


def capture_ladder(max_bs: int) -> list[int]:
    """Batch sizes to capture: 1, 2, 4, 8, then steps of 8, up to and including `max_bs`."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_bs]
    sizes += list(range(16, max_bs, 8))
    return sorted(set(sizes + [max_bs]))


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph | None
    logits: torch.Tensor | None  # static output buffer (GPU); None on the CPU
    ring_len: int = 0  # values each replay writes into its snapshot-ring row (tracing; on the CPU: set by replays)


class GraphRunner:
    """Captures one forward kind (mode, model, draft step) for every ladder size and replays padded batches."""

    def __init__(
        self, *, name: str, mode: ForwardMode,
        forward: Callable[[torch.Tensor, torch.Tensor, ForwardBatch], torch.Tensor],
        backend: TRTLLMHABackend, template: ForwardBatch, max_bs: int, tokens_per_req: int,
        device: torch.device, pad_seq_len_from_live: bool = False, ladder: list[int] | None = None,
        stamps: Any = None, ring_write: Callable[[ForwardBatch], int] | None = None,
    ) -> None:
        self.name = name
        self.mode = mode
        self.forward = forward
        self.backend = backend
        self.template = template
        self.ladder = sorted(set(ladder)) if ladder else capture_ladder(max_bs)
        self.tokens_per_req = tokens_per_req
        self.device = device
        self.use_cuda_graph = device.type == "cuda"
        self.pad_seq_len_from_live = pad_seq_len_from_live  # fault `padded-row-seqlen`
        # When tracing: writes the recorder's snapshot into its snapshot ring's current row (device ops only, so
        # the graph computes it on every replay) and returns its length (ModelRunner.write_snapshot_row), which
        # `ring_len` gives the replay's record.
        self.ring_write = ring_write
        # tracer.stamps.StampRing of the compute stream: when tracing, each replay stamps its first and last node
        # itself (the recorder numbers the two stamps, `Recorder.graph_span`).
        self.stamps = stamps if ring_write is not None else None
        n = max_bs * tokens_per_req
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.out_cache_loc = torch.zeros(n, dtype=torch.int64, device=device)
        self.seq_lens = torch.zeros(max_bs, dtype=torch.int32, device=device)
        self.seq_lens_cpu = torch.zeros(max_bs, dtype=torch.int32)
        self.req_pool_indices = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.captured: dict[int, _Captured] = {}
        self.mempool: _POOL_HANDLE | None = None  # one graph memory pool for every size, made at the first capture
        # Views of the static buffers, made once per size: slicing a tensor costs the host ~2.5 µs, and a replay
        # would otherwise slice about twelve of them. The views alias the buffers, so reusing them is exact.
        self._batches: dict[int, ForwardBatch] = {}
        self._views: dict[tuple[str, int, int], tuple[torch.Tensor, ...]] = {}

    def padded_size(self, raw_bs: int) -> int:
        """Smallest captured batch size >= raw_bs."""
        i = bisect.bisect_left(self.ladder, raw_bs)
        if i == len(self.ladder):
            raise ValueError(f"{self.name}: batch size {raw_bs} exceeds the largest captured size {self.ladder[-1]}")
        return self.ladder[i]

    def _static_batch(self, bs: int) -> ForwardBatch:
        fb = self._batches.get(bs)
        if fb is None:
            fb = self._batches[bs] = self._make_static_batch(bs)
        return fb

    def _rows(self, lo: int, hi: int) -> tuple[torch.Tensor, ...]:
        """Rows [lo, hi) of seq_lens, seq_lens_cpu, req_pool_indices and tokens [lo, hi) * T of out_cache_loc."""
        key = ("rows", lo, hi)
        v = self._views.get(key)
        if v is None:
            k = self.tokens_per_req
            v = self._views[key] = (self.seq_lens[lo:hi], self.seq_lens_cpu[lo:hi], self.req_pool_indices[lo:hi],
                                    self.out_cache_loc[lo * k:hi * k])
        return v

    def _tokens(self, lo: int, hi: int) -> tuple[torch.Tensor, ...]:
        """Tokens [lo, hi) of input_ids and positions."""
        key = ("tokens", lo, hi)
        v = self._views.get(key)
        if v is None:
            v = self._views[key] = (self.input_ids[lo:hi], self.positions[lo:hi])
        return v

    def _make_static_batch(self, bs: int) -> ForwardBatch:
        t = self.template
        n = bs * self.tokens_per_req
        return ForwardBatch(
            forward_mode=self.mode, batch_size=bs, input_ids=self.input_ids[:n], positions=self.positions[:n],
            seq_lens=self.seq_lens[:bs], seq_lens_cpu=self.seq_lens_cpu[:bs],
            req_pool_indices=self.req_pool_indices[:bs], out_cache_loc=self.out_cache_loc[:n],
            req_to_token_pool=t.req_to_token_pool, token_to_kv_pool=t.token_to_kv_pool, attn_backend=self.backend,
            extend_seq_lens_cpu=[self.tokens_per_req] * bs if self.mode == ForwardMode.DRAFT_EXTEND else None,
            spec_step_id=t.spec_step_id, num_tokens_per_req=self.tokens_per_req)

    def capture_one(self, bs: int) -> ForwardBatch:
        """Capture batch size `bs` with the fill values a capture uses (seq_len fill, slot 0, KV slot 0)."""
        return self.capture_forward(self.prepare_capture(bs))

    def prepare_capture(self, bs: int) -> ForwardBatch:
        """Fill the static inputs for a capture of `bs` and build + apply its metadata."""
        fill = self.backend.get_cuda_graph_seq_len_fill_value()
        self.seq_lens[:bs].fill_(fill)
        self.seq_lens_cpu[:bs].fill_(fill)
        self.req_pool_indices[:bs].zero_()
        self.out_cache_loc.zero_()
        self.input_ids.zero_()
        self.positions.zero_()
        fb = self._static_batch(bs)
        self.backend.init_forward_metadata_capture_cuda_graph(bs, bs * self.tokens_per_req, fb)
        return fb

    def capture_forward(self, fb: ForwardBatch) -> ForwardBatch:
        """Run (CPU) or capture (GPU) the forward over the prepared static batch."""
        bs = fb.batch_size
        if not self.use_cuda_graph:
            self.forward(fb.input_ids, fb.positions, fb)
            self.captured[bs] = _Captured(None, None)
            return fb
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up outside the graph (JIT loads, allocator)
                self.forward(fb.input_ids, fb.positions, fb)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        if self.mempool is None:
            self.mempool = torch.cuda.graph_pool_handle()
        # No garbage collection while capturing (torch.cuda.graph collects just before): a collection inside would
        # free pinned buffers and events of objects no longer referenced (another engine's, in one process), and a
        # free or an event call on their streams invalidates a global-mode capture (SGLang freezes GC likewise).
        gc_was_on = gc.isenabled()
        gc.disable()
        try:
            with torch.cuda.graph(graph, pool=self.mempool):
                capturing = torch.cuda.current_stream(self.device).cuda_stream
                if self.stamps is not None:
                    self.stamps.launch(capturing)  # the replay's start: its first node
                logits = self.forward(fb.input_ids, fb.positions, fb)
                ring_len = self._snapshot(fb)  # into the ring row the device index names
                if self.stamps is not None:
                    self.stamps.launch(capturing)  # and its end: the last node
        finally:
            if gc_was_on:
                gc.enable()
        self.captured[bs] = _Captured(graph, logits, ring_len)
        return fb

    def _snapshot(self, fb: ForwardBatch) -> int:
        """The replay's snapshot (device ops only: captured), written into the snapshot ring's current row: its
        length; 0 when not tracing."""
        return self.ring_write(fb) if self.ring_write is not None else 0

    def replay_prepare(self, live: ForwardBatch) -> ForwardBatch:
        """Copy the live batch into the static buffers, pad, and refresh metadata (the plan-stream half)."""
        raw_bs = live.batch_size
        bs = self.padded_size(raw_bs)
        fill = self.backend.get_cuda_graph_seq_len_fill_value()
        if self.pad_seq_len_from_live and bs > raw_bs and int(live.seq_lens_cpu.max()) != fill:
            fill = int(live.seq_lens_cpu.max())
            self.backend.fired.append("padded-row-seqlen")  # accounting only: this replay's padded rows changed
        seq_lens, seq_lens_cpu, rpi, out_loc = self._rows(0, raw_bs)
        seq_lens.copy_(live.seq_lens)
        seq_lens_cpu.copy_(live.seq_lens_cpu)
        rpi.copy_(live.req_pool_indices)
        out_loc.copy_(live.out_cache_loc)
        if bs > raw_bs:  # padded rows (an empty slice would still cost a dispatch per call)
            seq_lens, seq_lens_cpu, rpi, out_loc = self._rows(raw_bs, bs)
            seq_lens.fill_(fill)
            seq_lens_cpu.fill_(fill)
            rpi.zero_()
            out_loc.zero_()
        fb = self._static_batch(bs)
        self.backend.init_forward_metadata_replay_cuda_graph(bs, fb)
        return fb

    def copy_draft_dependent_inputs(self, live: ForwardBatch, bs: int) -> None:
        """input_ids and positions: re-copied on the compute stream after the draft (CGR L1172-1184)."""
        n_raw, n = live.num_tokens, bs * self.tokens_per_req
        input_ids, positions = self._tokens(0, n_raw)
        input_ids.copy_(live.input_ids)
        positions.copy_(live.positions)
        if n > n_raw:
            input_ids, positions = self._tokens(n_raw, n)
            input_ids.zero_()
            positions.zero_()

    def ring_len(self, bs: int) -> int:
        """The number of values a replay of captured size `bs` writes into its snapshot-ring row (0 when not tracing;
        on the CPU known once that size has been replayed)."""
        return self.captured[bs].ring_len

    def replay(self, fb: ForwardBatch, raw_num_tokens: int) -> torch.Tensor:
        """Run the captured forward over the static buffers; returns the logits of the live tokens (its snapshot,
        when tracing, is in a ring row: `ring_len` values)."""
        cap = self.captured[fb.batch_size]
        if cap.graph is not None:
            cap.graph.replay()  # its snapshot, when tracing, is in a ring row
            assert cap.logits is not None  # a captured graph keeps its static logits buffer
            return cap.logits[:raw_num_tokens]
        if self.stamps is not None:
            self.stamps.launch()  # the emulated graph stamps where the captured one does
        try:
            logits = self.forward(fb.input_ids, fb.positions, fb)[:raw_num_tokens]
            cap.ring_len = self._snapshot(fb)  # the emulated graph writes the ring as the captured one does
        except Exception:
            if self.stamps is not None:  # a kernel refused its arguments: keep the ring's numbering in step
                self.stamps.launch()
                self.stamps.claim(2)
            raise
        if self.stamps is not None:
            self.stamps.launch()
        return logits
