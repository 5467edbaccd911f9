"""TRTLLM MHA metadata for every forward mode, against hand-computed values (eager and padded graph batches)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from specscope.backend.forward_batch import ForwardBatch  # noqa: E402
from specscope.backend.graph_runner import GraphRunner, capture_ladder  # noqa: E402
from specscope.backend.memory import KVPool, ReqToTokenPool  # noqa: E402
from specscope.backend.reference_attention import ReferenceKernels  # noqa: E402
from specscope.backend.trtllm_mha_backend import TRTLLMHABackend  # noqa: E402
from specscope.tracer.schema import ForwardMode  # noqa: E402

P = 16
CPU = torch.device("cpu")


def _memory() -> tuple[ReqToTokenPool, KVPool]:
    r2t = ReqToTokenPool(num_slots=4, max_context_len=128, device=CPU)
    # Request A (slot 1) owns pages 5, 2; request B (slot 2) owns page 7.
    for slot, pages in ((1, [5, 2]), (2, [7])):
        for j, page in enumerate(pages):
            r2t.req_to_token[slot, j * P:(j + 1) * P] = torch.arange(page * P, (page + 1) * P)
    return r2t, KVPool(1, 16, P, 1, 16, torch.float32, CPU)


def _backend(r2t: ReqToTokenPool, kv: KVPool, *, step: int = 0, k: int = 4, faults: frozenset = frozenset()):
    return TRTLLMHABackend(req_to_token_pool=r2t, kv_pool=kv, page_size=P, max_context_len=128, num_draft_tokens=k,
                           kernels=ReferenceKernels(), device=CPU, speculative_step_id=step, faults=faults)


def _fb(mode: ForwardMode, r2t, kv, backend, seq_lens: list[int], num_tokens: int, ext: list[int] | None = None,
        rpi: list[int] = (1, 2)) -> ForwardBatch:
    z = torch.zeros(num_tokens, dtype=torch.int64)
    return ForwardBatch(mode, len(seq_lens), z, z, torch.tensor(seq_lens, dtype=torch.int32),
                        torch.tensor(seq_lens, dtype=torch.int32), torch.tensor(list(rpi)), z, r2t, kv, backend,
                        extend_seq_lens_cpu=ext)


def _l(t: torch.Tensor) -> list:
    return t.tolist()


S = [20, 9]


def test_decode_eager() -> None:
    r2t, kv = _memory()
    be = _backend(r2t, kv)
    be.init_forward_metadata(_fb(ForwardMode.DECODE, r2t, kv, be, [s + 1 for s in S], 2))
    md = be.forward_metadata
    assert _l(md.cache_seqlens_int32) == [21, 10]
    assert md.cache_seqlens_int32.dtype == torch.int32
    assert _l(md.cu_seqlens_q) == [0, 1, 2]
    assert _l(md.cu_seqlens_k) == [0, 21, 31]
    assert md.max_seq_len_q == 1 and md.max_seq_len_k == 21
    assert _l(md.page_table) == [[5, 2], [7, 0]]


def test_draft_decode_step_i_eager() -> None:
    r2t, kv = _memory()
    be = _backend(r2t, kv, step=2)
    be.init_forward_metadata(_fb(ForwardMode.DRAFT_DECODE, r2t, kv, be, S, 2))
    md = be.forward_metadata
    assert _l(md.cache_seqlens_int32) == [23, 12]  # S + i + 1
    assert md.max_seq_len_k == 23
    assert _l(md.cu_seqlens_k) == [0, 23, 35]
    assert _l(md.page_table) == [[5, 2], [7, 0]]


def test_target_verify_eager() -> None:
    r2t, kv = _memory()
    be = _backend(r2t, kv, k=4)
    be.init_forward_metadata(_fb(ForwardMode.TARGET_VERIFY, r2t, kv, be, S, 8))
    md = be.forward_metadata
    assert _l(md.cache_seqlens_int32) == [24, 13]  # S + T
    assert md.max_seq_len_q == 4 and md.max_seq_len_k == 24
    assert _l(md.cu_seqlens_q) == [0, 4, 8]
    assert _l(md.cu_seqlens_k) == [0, 24, 37]


def test_draft_extend_and_extend_eager() -> None:
    r2t, kv = _memory()
    be = _backend(r2t, kv)
    be.init_forward_metadata(_fb(ForwardMode.DRAFT_EXTEND, r2t, kv, be, [s + 4 for s in S], 8, ext=[4, 4]))
    md = be.forward_metadata
    assert _l(md.cache_seqlens_int32) == [24, 13]
    assert _l(md.cu_seqlens_q) == [0, 4, 8] and md.max_seq_len_q == 4
    be.init_forward_metadata(_fb(ForwardMode.EXTEND, r2t, kv, be, S, 29, ext=S))
    md = be.forward_metadata
    assert _l(md.cache_seqlens_int32) == [20, 9]
    assert _l(md.cu_seqlens_q) == [0, 20, 29] and md.max_seq_len_q == 20
    assert _l(md.cu_seqlens_k) == [0, 20, 29]
    assert _l(md.page_table) == [[5, 2], [7, 0]]


def _runner(be: TRTLLMHABackend, r2t, kv, mode: ForwardMode, tpr: int, max_bs: int = 4) -> GraphRunner:
    be.init_cuda_graph_state(max_bs, max_bs * tpr)
    template = _fb(mode, r2t, kv, be, [1], 1, rpi=[0])

    def fwd(ids: torch.Tensor, pos: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        return torch.zeros(ids.shape[0], 1)

    r = GraphRunner(name="t", mode=mode, forward=fwd, backend=be, template=template, max_bs=max_bs,
                    tokens_per_req=tpr, device=CPU)
    for bs in capture_ladder(max_bs):
        r.capture_one(bs)
    return r


def test_capture_ladder() -> None:
    assert capture_ladder(1) == [1]
    assert capture_ladder(4) == [1, 2, 4]
    assert capture_ladder(6) == [1, 2, 4, 6]
    assert capture_ladder(33) == [1, 2, 4, 8, 16, 24, 32, 33]


def test_verify_graph_padded_replay() -> None:
    """3 live rows replay the bs=4 graph: the padded row gets seq_len 1, slot 0, page 0."""
    r2t, kv = _memory()
    for j, page in enumerate([3]):
        r2t.req_to_token[3, j * P:(j + 1) * P] = torch.arange(page * P, (page + 1) * P)
    be = _backend(r2t, kv, k=5)  # backend K = 5, runner T = 4: stride-K static cu_seqlens_q
    runner = _runner(be, r2t, kv, ForwardMode.TARGET_VERIFY, 4)
    capture_md = be.graph_metadata[(ForwardMode.TARGET_VERIFY, 4)]
    ptr = capture_md.cache_seqlens_int32.data_ptr()
    assert _l(capture_md.cache_seqlens_int32) == [5, 5, 5, 5]  # fill 1 + T at capture
    live = _fb(ForwardMode.TARGET_VERIFY, r2t, kv, be, [20, 9, 3], 12, rpi=[1, 2, 3])
    fb = runner.replay_prepare(live)
    md = be.forward_metadata
    assert fb.batch_size == 4 and md is capture_md
    assert md.cache_seqlens_int32.data_ptr() == ptr  # refreshed in place, never rebound
    assert _l(md.cache_seqlens_int32) == [24, 13, 7, 5]
    assert md.max_seq_len_q == 4 and md.kernel_q_len == 4
    assert _l(md.cu_seqlens_q) == [0, 5, 10, 15, 20]  # static stride K, never rewritten (TMB L290-296)
    assert _l(md.cu_seqlens_k) == [0, 24, 37, 44, 49]
    assert _l(md.page_table[:, :2]) == [[5, 2], [7, 0], [3, 0], [0, 0]]
    assert _l(fb.seq_lens) == [20, 9, 3, 1] and _l(fb.req_pool_indices) == [1, 2, 3, 0]


def test_override_fault_freezes_k_at_capture() -> None:
    """PR #27495: with the override, T=4 runners capture q_len_per_req = K = 5 and S + K seqlens."""
    r2t, kv = _memory()
    be = _backend(r2t, kv, k=5, faults=frozenset({"max-seq-len-q-override"}))
    runner = _runner(be, r2t, kv, ForwardMode.TARGET_VERIFY, 4)
    runner.replay_prepare(_fb(ForwardMode.TARGET_VERIFY, r2t, kv, be, S, 8))
    md = be.forward_metadata
    assert md.kernel_q_len == 5 and _l(md.cache_seqlens_int32) == [25, 14]


def test_draft_decode_graph_and_capture_fault() -> None:
    r2t, kv = _memory()
    be = _backend(r2t, kv, step=1)
    runner = _runner(be, r2t, kv, ForwardMode.DRAFT_DECODE, 1)
    assert _l(be.graph_metadata[(ForwardMode.DRAFT_DECODE, 2)].cache_seqlens_int32) == [3, 3]  # 1 + i + 1
    runner.replay_prepare(_fb(ForwardMode.DRAFT_DECODE, r2t, kv, be, S, 2))
    assert _l(be.forward_metadata.cache_seqlens_int32) == [22, 11]
    bad = _backend(r2t, kv, step=1, faults=frozenset({"zero-cache-seqlens-at-capture"}))
    _runner(bad, r2t, kv, ForwardMode.DRAFT_DECODE, 1)
    assert _l(bad.graph_metadata[(ForwardMode.DRAFT_DECODE, 2)].cache_seqlens_int32) == [0, 0]  # G1


def test_stale_page_table_fault_skips_refresh() -> None:
    r2t, kv = _memory()
    be = _backend(r2t, kv, faults=frozenset({"stale-page-table"}))
    runner = _runner(be, r2t, kv, ForwardMode.DECODE, 1)
    assert be.take_fired() == []  # captures always refresh
    runner.replay_prepare(_fb(ForwardMode.DECODE, r2t, kv, be, [21, 10], 2))
    md = be.forward_metadata
    assert _l(md.page_table[:, :2]) == [[0, 0], [0, 0]]  # left over from the capture, not req_to_token's pages
    assert be.take_fired() == ["stale-page-table"]


def test_padded_row_seqlen_fault() -> None:
    r2t, kv = _memory()
    be = _backend(r2t, kv)
    be.init_cuda_graph_state(4, 4)
    runner = GraphRunner(name="t", mode=ForwardMode.DECODE, forward=lambda i, p, f: torch.zeros(i.shape[0], 1),
                         backend=be, template=_fb(ForwardMode.DECODE, r2t, kv, be, [1], 1, rpi=[0]), max_bs=4,
                         tokens_per_req=1, device=CPU, pad_seq_len_from_live=True)
    for bs in capture_ladder(4):
        runner.capture_one(bs)
    fb = runner.replay_prepare(_fb(ForwardMode.DECODE, r2t, kv, be, [21, 10, 5], 3, rpi=[1, 2, 3]))
    assert _l(fb.seq_lens) == [21, 10, 5, 21]  # the padded row reads 21 positions through page 0


@pytest.mark.parametrize("mode,q_len", [(ForwardMode.TARGET_VERIFY, 4), (ForwardMode.DRAFT_DECODE, 1),
                                        (ForwardMode.EXTEND, 0)])
def test_trtllm_backend_matches_the_token_level_oracle(mode: ForwardMode, q_len: int) -> None:
    """TRTLLM metadata + paged reference kernels == ReferenceAttnBackend (req_to_token and positions only)."""
    from specscope.backend.attention_layer import AttentionLayer
    from specscope.backend.reference_backend import ReferenceAttnBackend

    r2t, kv = _memory()
    kv.kv_buffer[0].normal_(generator=torch.Generator().manual_seed(0))
    layer = AttentionLayer(0, 4, 1, 16, 0.25)
    if mode == ForwardMode.EXTEND:
        lens, seq, pos = S, S, [p for s in S for p in range(s)]
    elif mode == ForwardMode.DRAFT_DECODE:
        lens, seq, pos = [1, 1], S, [s + 2 for s in S]  # draft step 2: position S + 2
    else:
        lens, seq, pos = [q_len] * 2, S, [s + t for s in S for t in range(q_len)]
    outs = []
    for be in (_backend(r2t, kv, step=2), ReferenceAttnBackend(r2t, kv)):
        fb = _fb(mode, r2t, kv, be, seq, sum(lens), ext=lens if mode == ForwardMode.EXTEND else None)
        fb.positions = torch.tensor(pos)
        be.init_forward_metadata(fb)
        q = torch.randn(sum(lens), 4, 16, generator=torch.Generator().manual_seed(1))
        outs.append(be.forward(q, q[:, :1], q[:, :1], layer, fb, save_kv_cache=False))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
