"""Every forward mode's flashinfer kernel output vs the reference backend, on a real GPU (bf16, rel. err <= 1e-2).

A covering set, not the cross product (each XQA configuration is its own ~10 s kernel build): every page
size 16/32/64/128, every T from 2 to 8, every GQA ratio 1/4/8 at least once, ragged sequence lengths, and
padded CUDA-graph batches.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # pragma: no cover - collected on CPU hosts only with -m gpu
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
flashinfer = pytest.importorskip("flashinfer")

from specscope.backend.attention_layer import AttentionLayer  # noqa: E402
from specscope.backend.flashinfer_kernels import FlashinferKernels, KernelArgumentError  # noqa: E402
from specscope.backend.forward_batch import ForwardBatch  # noqa: E402
from specscope.backend.graph_runner import GraphRunner, capture_ladder  # noqa: E402
from specscope.backend.memory import KVPool, PageAllocator, ReqToTokenPool, RequestKV  # noqa: E402
from specscope.backend.reference_attention import ReferenceKernels  # noqa: E402
from specscope.backend.trtllm_mha_backend import TRTLLMHABackend  # noqa: E402
from specscope.tracer.schema import ForwardMode  # noqa: E402

DEV = torch.device("cuda")
HKV, D = 2, 128
ARCH_MAJOR = torch.cuda.get_device_capability()[0]
_KERNELS: dict[str, FlashinferKernels] = {}


def kernels(prefill: str = "fmha_v2") -> FlashinferKernels:
    if prefill not in _KERNELS:
        _KERNELS[prefill] = FlashinferKernels(DEV, prefill)
    return _KERNELS[prefill]


class World:
    """Requests with ragged lengths on a shuffled page pool, KV filled with random values."""

    def __init__(self, page: int, seq_lens: list[int], extra: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.page = page
        max_ctx = -(-(max(seq_lens) + extra + page) // page) * page
        self.r2t = ReqToTokenPool(len(seq_lens) + 1, max_ctx, DEV)
        num_pages = sum(-(-(s + extra) // page) for s in seq_lens) + 8
        self.alloc = PageAllocator(num_pages, page)
        self.alloc._free = [int(x) for x in (torch.randperm(num_pages - 1, generator=gen) + 1)]
        self.kv = KVPool(1, num_pages, page, HKV, D, torch.bfloat16, DEV)
        self.kv.kv_buffer[0].normal_(generator=torch.Generator(DEV).manual_seed(seed))
        self.slots = []
        for s in seq_lens:
            r = RequestKV(self.r2t.alloc())
            r.ensure(s + extra, self.alloc, self.r2t)
            self.slots.append(r.slot)
        self.seq_lens = seq_lens

    def backend(self, kern, k: int = 4, step: int = 0) -> TRTLLMHABackend:
        return TRTLLMHABackend(req_to_token_pool=self.r2t, kv_pool=self.kv, page_size=self.page,
                               max_context_len=self.r2t.max_context_len, num_draft_tokens=k, kernels=kern,
                               device=DEV, speculative_step_id=step)

    def batch(self, mode: ForwardMode, backend, seq_lens: list[int], q_lens: list[int]) -> ForwardBatch:
        n = sum(q_lens)
        rpi = torch.tensor(self.slots[: len(seq_lens)], device=DEV)
        pos = torch.cat([torch.arange(s + (q if mode != ForwardMode.EXTEND else 0) - q,
                                      s + (q if mode != ForwardMode.EXTEND else 0)) for s, q in
                         zip(seq_lens, q_lens, strict=True)]).to(DEV)
        row = torch.repeat_interleave(rpi, torch.tensor(q_lens, device=DEV))
        uniform = mode in (ForwardMode.DECODE, ForwardMode.DRAFT_DECODE, ForwardMode.TARGET_VERIFY)
        sl = torch.tensor(seq_lens, dtype=torch.int32)
        return ForwardBatch(mode, len(seq_lens), torch.zeros(n, dtype=torch.int64, device=DEV), pos, sl.to(DEV), sl,
                            rpi, self.r2t.req_to_token[row, pos].long(), self.r2t, self.kv, backend,
                            extend_seq_lens_cpu=None if uniform else q_lens)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _run_mode(world: World, mode: ForwardMode, group: int, q_len: int, kern, step: int = 0) -> float:
    """Same metadata, two kernel sets; returns the relative error of the GPU kernels vs the reference."""
    layer = AttentionLayer(0, HKV * group, HKV, D, D ** -0.5)
    if mode == ForwardMode.DECODE:
        s, q_lens = [x + 1 for x in world.seq_lens], [1] * len(world.seq_lens)
    elif mode == ForwardMode.DRAFT_DECODE:
        s, q_lens = world.seq_lens, [1] * len(world.seq_lens)
    elif mode == ForwardMode.TARGET_VERIFY:
        s, q_lens = world.seq_lens, [q_len] * len(world.seq_lens)
    elif mode == ForwardMode.DRAFT_EXTEND:
        s, q_lens = [x + q_len for x in world.seq_lens], [q_len] * len(world.seq_lens)
    else:
        s, q_lens = world.seq_lens, [min(x, q_len) for x in world.seq_lens]
    outs = []
    for kn in (kern, ReferenceKernels()):
        be = world.backend(kn, step=step)
        fb = world.batch(mode, be, s, q_lens)
        be.init_forward_metadata(fb)
        torch.manual_seed(0)
        q = torch.randn(fb.num_tokens, layer.num_q_heads, D, dtype=torch.bfloat16, device=DEV)
        dummy = torch.zeros(fb.num_tokens, HKV, D, dtype=torch.bfloat16, device=DEV)
        outs.append(be.forward(q, dummy, dummy, layer, fb, save_kv_cache=False))
    torch.cuda.synchronize()
    assert torch.isfinite(outs[0]).all()
    return _rel(outs[0], outs[1])


SEQ = [37, 300, 1, 129, 64, 511]

DECODE_CASES = [(64, 4), (16, 1), (32, 8), (128, 4)]  # (page, GQA)
VERIFY_CASES = [(64, 4, 4), (16, 2, 1), (32, 3, 8), (128, 5, 4), (64, 6, 1), (16, 7, 8), (32, 8, 4)]  # page, T, GQA


@pytest.mark.parametrize("page,group", DECODE_CASES)
@pytest.mark.parametrize("mode", [ForwardMode.DECODE, ForwardMode.DRAFT_DECODE])
def test_decode_kernels(page: int, group: int, mode: ForwardMode) -> None:
    world = World(page, SEQ, 16, seed=page + group)
    assert _run_mode(world, mode, group, 1, kernels(), step=2) <= 1e-2


@pytest.mark.parametrize("page,t,group", VERIFY_CASES)
def test_verify_kernels(page: int, t: int, group: int) -> None:
    world = World(page, SEQ, 16, seed=page * t + group)
    assert _run_mode(world, ForwardMode.TARGET_VERIFY, group, t, kernels()) <= 1e-2


@pytest.mark.parametrize("prefill", ["fmha_v2", "flashinfer"])
@pytest.mark.parametrize("page,group", [(64, 4), (16, 1), (128, 8), (32, 4)])
@pytest.mark.parametrize("mode", [ForwardMode.EXTEND, ForwardMode.DRAFT_EXTEND])
def test_context_kernels(prefill: str, page: int, group: int, mode: ForwardMode) -> None:
    if ARCH_MAJOR == 10:
        pytest.skip("SM90/SM120 extend kernels")
    world = World(page, SEQ, 16, seed=page + group)
    assert _run_mode(world, mode, group, 5 if mode == ForwardMode.DRAFT_EXTEND else 300, kernels(prefill)) <= 1e-2


@pytest.mark.blackwell
def test_trtllm_gen_context_on_blackwell() -> None:  # pragma: no cover - no SM100 available to the project
    if ARCH_MAJOR != 10:
        pytest.skip("needs SM100/SM103")
    world = World(64, SEQ, 16, seed=1)
    assert _run_mode(world, ForwardMode.EXTEND, 4, 300, kernels()) <= 1e-2


@pytest.mark.parametrize("mode,t", [(ForwardMode.TARGET_VERIFY, 4), (ForwardMode.DRAFT_DECODE, 1),
                                     (ForwardMode.DECODE, 1)])
def test_padded_graph_replay_matches_eager(mode: ForwardMode, t: int) -> None:
    """Capture bs 1/2/4/8 in real CUDA graphs; replay 3 and 5 live rows (padded) and compare to eager."""
    world = World(64, [37, 300, 129, 64, 511], 16, seed=5)
    layer = AttentionLayer(0, HKV * 4, HKV, D, D ** -0.5)
    be = world.backend(kernels(), k=t, step=1)
    be.init_cuda_graph_state(8, 8 * t)
    q_static = torch.randn(8 * t, layer.num_q_heads, D, dtype=torch.bfloat16, device=DEV)
    dummy = torch.zeros(8 * t, HKV, D, dtype=torch.bfloat16, device=DEV)

    def fwd(ids: torch.Tensor, pos: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        n = ids.shape[0]
        return be.forward(q_static[:n], dummy[:n], dummy[:n], layer, fb, save_kv_cache=False).float()

    template = world.batch(mode, be, [1], [t])
    runner = GraphRunner(name="g", mode=mode, forward=fwd, backend=be, template=template, max_bs=8,
                         tokens_per_req=t, device=DEV)
    for bs in capture_ladder(8):
        runner.capture_one(bs)
    for raw in (3, 5):
        s = world.seq_lens[:raw] if mode != ForwardMode.DECODE else [x + 1 for x in world.seq_lens[:raw]]
        live = world.batch(mode, be, s, [t] * raw)
        fb = runner.replay_prepare(live)
        runner.copy_draft_dependent_inputs(live, fb.batch_size)
        got = runner.replay(fb, raw * t).clone()
        eager_be = world.backend(kernels(), k=t, step=1)
        live.attn_backend = eager_be
        eager_be.init_forward_metadata(live)
        want = eager_be.forward(q_static[: raw * t], dummy[: raw * t], dummy[: raw * t], layer, live,
                                save_kv_cache=False).float()
        torch.cuda.synchronize()
        assert fb.batch_size == runner.padded_size(raw) > raw
        assert _rel(got, want) <= 5e-3, f"graph replay differs from eager at raw bs {raw}"


def test_argument_checks_before_launch() -> None:
    world = World(64, [37, 40], 16, seed=1)
    be = world.backend(kernels())
    fb = world.batch(ForwardMode.TARGET_VERIFY, be, world.seq_lens, [4, 4])
    be.init_forward_metadata(fb)
    q = torch.randn(8, 8, D, dtype=torch.bfloat16, device=DEV)
    kv = world.kv.kv_buffer[0]
    md = be.forward_metadata
    with pytest.raises(KernelArgumentError, match="mask"):
        kernels().decode(q, kv, md.page_table, md.cache_seqlens_int32, q_len_per_req=4, page_size=64,
                         scaling=0.1, mask=None, max_seq_len=1024)
    with pytest.raises(KernelArgumentError, match="dtype"):
        kernels().decode(q.float(), kv, md.page_table, md.cache_seqlens_int32, q_len_per_req=4, page_size=64,
                         scaling=0.1, mask=be.spec_mask(2, 4), max_seq_len=1024)
    with pytest.raises(KernelArgumentError, match="rows"):
        kernels().decode(q, kv, md.page_table, md.cache_seqlens_int32, q_len_per_req=1, page_size=64,
                         scaling=0.1, mask=None, max_seq_len=1024)
