"""Reference paged attention == dense causal attention on unpaged KV, for every kernel shape we use."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from specscope.backend.reference_attention import reference_context, reference_decode  # noqa: E402
from specscope.backend.spec_mask import pack_mask, packed_causal_mask, unpack_mask  # noqa: E402


def _paged(seq_lens: list[int], page: int, hkv: int, d: int, gen: torch.Generator):
    """Random dense KV per request, scattered into a shuffled page pool."""
    pages_per = [-(-s // page) for s in seq_lens]
    num_pages = sum(pages_per) + 3
    perm = torch.randperm(num_pages - 1, generator=gen) + 1
    kv = torch.randn(num_pages, 2, hkv, page, d, generator=gen, dtype=torch.float64)
    table = torch.zeros(len(seq_lens), max(pages_per), dtype=torch.int32)
    dense_k, dense_v, used = [], [], 0
    for b, s in enumerate(seq_lens):
        ids = perm[used:used + pages_per[b]]
        used += pages_per[b]
        table[b, : len(ids)] = ids.int()
        slots = (ids[:, None] * page + torch.arange(page)).reshape(-1)[:s]
        dense_k.append(kv[slots // page, 0, :, slots % page])
        dense_v.append(kv[slots // page, 1, :, slots % page])
    return kv, table, dense_k, dense_v


def _dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Bottom-right causal SDPA for one request: q [n, Hq, D], k/v [L, Hkv, D]."""
    n, hq, _ = q.shape
    group = hq // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    L = k.shape[0]
    mask = torch.arange(L)[None, :] <= torch.arange(L - n, L)[:, None]
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                         attn_mask=mask, scale=scale)
    return out.transpose(0, 1)


@pytest.mark.parametrize("page", [16, 32, 64, 128])
@pytest.mark.parametrize("q_len,group", [(1, 1), (4, 4), (8, 8), (2, 4)])
def test_uniform_q_matches_dense(page: int, q_len: int, group: int) -> None:
    gen = torch.Generator().manual_seed(page * 31 + q_len)
    seq_lens = [q_len + 3, 200, 17 + q_len, page + 1]
    hkv, d = 2, 16
    kv, table, dk, dv = _paged(seq_lens, page, hkv, d, gen)
    q = torch.randn(len(seq_lens) * q_len, hkv * group, d, generator=gen, dtype=torch.float64)
    scale = 1 / math.sqrt(d)
    mask = packed_causal_mask(len(seq_lens), q_len, torch.device("cpu")) if q_len > 1 else None
    out = reference_decode(q, kv, table, torch.tensor(seq_lens, dtype=torch.int32), q_len_per_req=q_len,
                           page_size=page, scaling=scale, mask=mask)
    for b in range(len(seq_lens)):
        want = _dense(q[b * q_len:(b + 1) * q_len], dk[b], dv[b], scale)
        torch.testing.assert_close(out[b * q_len:(b + 1) * q_len], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("page", [16, 64])
def test_ragged_context_matches_dense(page: int) -> None:
    gen = torch.Generator().manual_seed(page)
    prefix, new = [0, 37, 100, 5], [30, 4, 13, 1]
    seq_lens = [p + n for p, n in zip(prefix, new, strict=True)]
    kv, table, dk, dv = _paged(seq_lens, page, 1, 32, gen)
    q = torch.randn(sum(new), 4, 32, generator=gen, dtype=torch.float64)
    cu = torch.tensor([0] + list(torch.tensor(new).cumsum(0)), dtype=torch.int32)
    out = reference_context(q, kv, table, torch.tensor(seq_lens, dtype=torch.int32), cu, page_size=page,
                            scaling=0.2)
    for b in range(4):
        sl = slice(int(cu[b]), int(cu[b + 1]))
        torch.testing.assert_close(out[sl], _dense(q[sl], dk[b], dv[b], 0.2), rtol=1e-5, atol=1e-5)


def test_tree_mask_follows_bits() -> None:
    """A non-causal packed mask is honoured: XQA semantics (prefix always visible, draft columns per bit)."""
    gen = torch.Generator().manual_seed(1)
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    seq_lens = [40]
    kv, table, dk, dv = _paged(seq_lens, 16, 1, 16, gen)
    q = torch.randn(4, 2, 16, generator=gen, dtype=torch.float64)
    out = reference_decode(q, kv, table, torch.tensor(seq_lens, dtype=torch.int32), q_len_per_req=4,
                           page_size=16, scaling=0.25, mask=pack_mask(tree[None]))
    L = 40
    vis = torch.ones(4, L, dtype=torch.bool)
    vis[:, L - 4:] = tree
    k, v = dk[0].repeat_interleave(2, 1), dv[0].repeat_interleave(2, 1)
    want = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=vis,
                                          scale=0.25).transpose(0, 1)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("q_len", [1, 2, 7, 31, 32, 33])
def test_mask_pack_roundtrip(q_len: int) -> None:
    allowed = torch.rand(3, q_len, q_len, generator=torch.Generator().manual_seed(q_len)) > 0.5
    packed = pack_mask(allowed)
    assert packed.dtype == torch.uint16 and packed.shape == (3, q_len, ((q_len + 31) // 32) * 2)
    assert torch.equal(unpack_mask(packed, q_len), allowed)


def test_wrong_q_len_regroups_rows_like_trtllm_gen() -> None:
    """q_len_per_req larger than the real T makes the kernel see fewer, wrongly grouped requests."""
    gen = torch.Generator().manual_seed(3)
    kv, table, _, _ = _paged([20, 20], 16, 1, 16, gen)
    q = torch.randn(4, 1, 16, generator=gen, dtype=torch.float64)  # bs 2 x T 2
    right = reference_decode(q, kv, table, torch.tensor([20, 20], dtype=torch.int32), q_len_per_req=2,
                             page_size=16, scaling=0.25, mask=packed_causal_mask(2, 2, torch.device("cpu")))
    wrong = reference_decode(q, kv, table, torch.tensor([20, 20], dtype=torch.int32), q_len_per_req=4,
                             page_size=16, scaling=0.25, mask=packed_causal_mask(2, 4, torch.device("cpu")))
    assert not torch.allclose(right, wrong)
