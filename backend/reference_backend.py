"""The reference attention backend: attends over `req_to_token` token by token, using only positions.

It computes no TRTLLM metadata at all (query token at position p sees KV positions [0, p] of its request),
so it is an independent oracle for the TRTLLM backend's metadata as well as for its kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..tracer.schema import ForwardMode
from .attention_backend import AttentionBackend

if TYPE_CHECKING:
    from .attention_layer import AttentionLayer
    from .forward_batch import ForwardBatch
    from .memory import KVPool, ReqToTokenPool


class ReferenceAttnBackend(AttentionBackend):
    """Dense causal attention per request, gathered through req_to_token; fp32 softmax."""

    def __init__(self, req_to_token_pool: ReqToTokenPool, kv_pool: KVPool) -> None:
        self.req_to_token = req_to_token_pool.req_to_token
        self.kv_pool = kv_pool
        self._rows: list[tuple[int, int, int]] = []

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        """Group query tokens into rows: (first token, token count, request slot)."""
        bs = fb.batch_size
        if fb.forward_mode in (ForwardMode.EXTEND, ForwardMode.DRAFT_EXTEND):
            lens = list(fb.extend_seq_lens_cpu or [])
        else:
            lens = [fb.num_tokens // bs] * bs
        slots = fb.req_pool_indices[:bs].tolist()
        starts = [sum(lens[:i]) for i in range(bs)]
        self._rows = list(zip(starts, lens, slots, strict=True))

    def _attend(self, q: torch.Tensor, layer: AttentionLayer, fb: ForwardBatch) -> torch.Tensor:
        out = torch.zeros(q.shape[0], layer.num_q_heads, layer.head_dim, dtype=q.dtype, device=q.device)
        kv_cache, page = self.kv_pool.kv_buffer[layer.layer_id], self.kv_pool.page_size
        group = layer.num_q_heads // layer.num_kv_heads
        positions = fb.positions.tolist()
        for start, n, slot in self._rows:
            pos = positions[start:start + n]
            kv_len = max(pos) + 1
            slots = self.req_to_token[slot, :kv_len].long()
            k = kv_cache[slots // page, 0, :, slots % page].float().repeat_interleave(group, dim=1)
            v = kv_cache[slots // page, 1, :, slots % page].float().repeat_interleave(group, dim=1)
            scores = torch.einsum("qhd,khd->hqk", q[start:start + n].float(), k) * layer.scaling
            visible = torch.arange(kv_len, device=q.device)[None, :] <= torch.tensor(pos, device=q.device)[:, None]
            scores = scores.masked_fill(~visible[None], float("-inf"))
            out[start:start + n] = torch.einsum("hqk,khd->qhd", torch.softmax(scores, -1), v).to(q.dtype)
        return out.reshape(q.shape[0], -1)

    def forward_decode(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: AttentionLayer, fb: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        """Write KV, then attend."""
        if save_kv_cache:
            self.kv_pool.set_kv(layer.layer_id, fb.out_cache_loc, k, v)
        return self._attend(q, layer, fb)

    forward_extend = forward_decode
