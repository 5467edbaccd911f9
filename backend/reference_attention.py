"""Pure-torch paged attention with the kernels' semantics: the CPU path and the oracle for every GPU call.

Both entry points read KV only through `page_table` and `cache_seqlens`, exactly as the TRT-LLM kernels do,
and align the causal mask bottom-right: query token t of a row with q tokens sees KV `[0, L - q + t]`.
Softmax runs in float32.
"""

from __future__ import annotations

import torch

from .spec_mask import unpack_mask


def gather_kv(kv_cache: torch.Tensor, pages: torch.Tensor, kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V `[kv_len, Hkv, D]` of one row from the paged cache `[num_pages, 2, Hkv, P, D]`."""
    sel = kv_cache[pages.long()]  # [n, 2, Hkv, P, D]
    n, _, hkv, p, d = sel.shape
    kv = sel.permute(1, 0, 3, 2, 4).reshape(2, n * p, hkv, d)[:, :kv_len]
    return kv[0], kv[1]


def _row_attention(
    q: torch.Tensor, kv_cache: torch.Tensor, pages: torch.Tensor, kv_len: int,
    scaling: float, draft_visible: torch.Tensor | None,
) -> torch.Tensor:
    """q `[ql, Hq, D]` of one row against its paged KV; returns float32 `[ql, Hq, D]`."""
    ql, hq, d = q.shape
    k, v = gather_kv(kv_cache, pages, kv_len)
    group = hq // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)  # [L, Hq, D]
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scaling
    pos_q = torch.arange(kv_len - ql, kv_len, device=q.device)[:, None]
    pos_k = torch.arange(kv_len, device=q.device)[None, :]
    visible = pos_k <= pos_q
    if draft_visible is not None:
        # XQA semantics: the prefix is always visible, the last T columns follow the packed mask.
        visible = pos_k < kv_len - ql
        visible = visible.expand(ql, kv_len).clone()
        visible[:, kv_len - ql:] = draft_visible
    scores = scores.masked_fill(~visible[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v)


def reference_decode(
    q: torch.Tensor, kv_cache: torch.Tensor, page_table: torch.Tensor,
    cache_seqlens: torch.Tensor, *, q_len_per_req: int, page_size: int, scaling: float,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Uniform-q paged attention (decode, draft decode, target verify).

    q `[num_tokens, Hq, D]`; kv_cache `[num_pages, 2, Hkv, P, D]`; page_table int32 `[rows, W]`;
    cache_seqlens int32 `[rows]`; mask uint16 `[rows, T, 2*words]` or None (causal). Like trtllm-gen, the
    batch is `num_tokens // q_len_per_req` rows, so a wrong `q_len_per_req` regroups tokens silently.
    Returns `[num_tokens, Hq, D]` in q's dtype; tokens no row covers stay zero.
    """
    out = torch.zeros_like(q)
    batch = q.shape[0] // q_len_per_req
    rows = min(batch, page_table.shape[0], cache_seqlens.shape[0])
    lens = cache_seqlens[:rows].tolist()
    vis = unpack_mask(mask[:rows], q_len_per_req) if mask is not None and q_len_per_req > 1 else None
    for b in range(rows):
        n_pages = -(-lens[b] // page_size)
        sl = slice(b * q_len_per_req, (b + 1) * q_len_per_req)
        out[sl] = _row_attention(q[sl], kv_cache, page_table[b, :n_pages], lens[b], scaling,
                                 None if vis is None else vis[b]).to(q.dtype)
    return out


def reference_context(
    q: torch.Tensor, kv_cache: torch.Tensor, page_table: torch.Tensor,
    cache_seqlens: torch.Tensor, cu_seqlens_q: torch.Tensor, *, page_size: int, scaling: float,
) -> torch.Tensor:
    """Ragged-q paged attention (extend, draft extend): row b owns q rows `cu_seqlens_q[b]:cu_seqlens_q[b+1]`.

    Like the context kernel, the batch is `cu_seqlens_q.numel() - 1` rows. Returns `[num_tokens, Hq, D]`.
    """
    out = torch.zeros_like(q)
    cu = cu_seqlens_q.tolist()
    lens = cache_seqlens.tolist()
    for b in range(len(cu) - 1):
        if cu[b + 1] <= cu[b]:
            continue
        n_pages = -(-lens[b] // page_size)
        sl = slice(cu[b], cu[b + 1])
        out[sl] = _row_attention(q[sl], kv_cache, page_table[b, :n_pages], lens[b], scaling,
                                 None).to(q.dtype)
    return out


class ReferenceKernels:
    """The kernel set used on the CPU: same arguments as the TRT-LLM kernels, torch underneath."""

    name = "reference"

    def decode(
        self, q: torch.Tensor, kv_cache: torch.Tensor, page_table: torch.Tensor,
        cache_seqlens: torch.Tensor, *, q_len_per_req: int, page_size: int, scaling: float,
        mask: torch.Tensor | None, max_seq_len: int,
    ) -> torch.Tensor:
        """See `reference_decode`."""
        return reference_decode(q, kv_cache, page_table, cache_seqlens, q_len_per_req=q_len_per_req,
                                page_size=page_size, scaling=scaling, mask=mask)

    def context(
        self, q: torch.Tensor, kv_cache: torch.Tensor, page_table: torch.Tensor,
        cache_seqlens: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, *,
        max_q_len: int, max_kv_len: int, batch_size: int, page_size: int, scaling: float,
    ) -> torch.Tensor:
        """See `reference_context`."""
        return reference_context(q, kv_cache, page_table, cache_seqlens, cu_seqlens_q,
                                 page_size=page_size, scaling=scaling)
