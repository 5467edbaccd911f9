"""Verify attention at bs=64, ~4k context, T=4, 32 query / 8 KV heads, head_dim 128, bf16, page 64:
our backend's call vs the bare flashinfer call vs a device-to-device copy of the same bytes.

Targets: KV read bandwidth >= 0.85 of copy bandwidth (copy counts bytes read + written); our call <= 1 %
over the bare call. Timed with CUDA events (median of 5 x 200 calls), eager and as CUDA-graph replays.

    python benchmarks/verify_bandwidth.py --out benchmarks/results/verify_bandwidth.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path


def parse_args() -> argparse.Namespace:
    """The command line (parsed before torch and flashinfer load, so `--help` works on any host)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/verify_bandwidth.json")
    ap.add_argument("--bs", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=4096)
    return ap.parse_args()


ARGS = parse_args() if __name__ == "__main__" else None

import torch  # noqa: E402
from flashinfer.decode import trtllm_batch_decode_with_kv_cache  # noqa: E402
from specscope.backend.attention_layer import AttentionLayer  # noqa: E402
from specscope.backend.flashinfer_kernels import FlashinferKernels  # noqa: E402
from specscope.backend.forward_batch import ForwardBatch  # noqa: E402
from specscope.backend.memory import KVPool, PageAllocator, ReqToTokenPool, RequestKV  # noqa: E402
from specscope.backend.trtllm_mha_backend import TRTLLMHABackend  # noqa: E402
from specscope.tracer.schema import ForwardMode  # noqa: E402

DEV = torch.device("cuda")


def timed(fn: Callable[[], object], n: int = 200, reps: int = 5) -> float:
    """Median seconds per call."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    res = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(n):
            fn()
        b.record()
        torch.cuda.synchronize()
        res.append(a.elapsed_time(b) / 1e3 / n)
    return statistics.median(res)


def graphed(fn: Callable[[], object]) -> Callable[[], object]:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def main() -> None:
    args = ARGS or parse_args()
    bs, T, hq, hkv, d, page = args.bs, 4, 32, 8, 128, 64
    gen = torch.Generator().manual_seed(0)
    seq = torch.randint(int(args.ctx * 0.85), int(args.ctx * 1.15), (bs,), generator=gen).tolist()
    max_ctx = -(-(max(seq) + T + page) // page) * page
    r2t = ReqToTokenPool(bs, max_ctx, DEV)
    num_pages = sum(-(-(s + T) // page) for s in seq) + 8
    alloc = PageAllocator(num_pages, page)
    alloc._free = [int(x) for x in torch.randperm(num_pages - 1, generator=gen) + 1]  # scattered pages
    kv = KVPool(1, num_pages, page, hkv, d, torch.bfloat16, DEV)
    kv.kv_buffer[0].normal_()
    slots = []
    for s in seq:
        r = RequestKV(r2t.alloc())
        r.ensure(s + T, alloc, r2t)
        slots.append(r.slot)
    kernels = FlashinferKernels(DEV)
    be = TRTLLMHABackend(req_to_token_pool=r2t, kv_pool=kv, page_size=page, max_context_len=max_ctx,
                         num_draft_tokens=T, kernels=kernels, device=DEV)
    rpi = torch.tensor(slots, device=DEV)
    pos = torch.cat([torch.arange(s, s + T) for s in seq]).to(DEV)
    sl = torch.tensor(seq, dtype=torch.int32)
    z = torch.zeros(bs * T, dtype=torch.int64, device=DEV)
    fb = ForwardBatch(ForwardMode.TARGET_VERIFY, bs, z, pos, sl.to(DEV), sl, rpi, z, r2t, kv, be)
    be.init_forward_metadata(fb)
    md = be.forward_metadata
    layer = AttentionLayer(0, hq, hkv, d, d ** -0.5)
    q = torch.randn(bs * T, hq, d, dtype=torch.bfloat16, device=DEV)
    mask = be.spec_mask(bs, T)
    cache = kv.kv_buffer[0]

    def ours() -> torch.Tensor:
        return be.forward_extend(q, q, q, layer, fb, save_kv_cache=False)

    def bare() -> torch.Tensor:
        return trtllm_batch_decode_with_kv_cache(q, cache, kernels.workspace, md.page_table, md.cache_seqlens_int32,
                                                 max_ctx, bmm1_scale=layer.scaling, bmm2_scale=1.0, kv_layout="HND",
                                                 backend="xqa", q_len_per_req=T, mask=mask)

    torch.testing.assert_close(ours().view(bs * T, hq, d), bare())
    kv_bytes = int(sum(s + T for s in seq)) * hkv * d * 2 * 2
    src = torch.empty(kv_bytes // 2, dtype=torch.bfloat16, device=DEV).normal_()
    dst = torch.empty_like(src)

    def copy() -> None:
        dst.copy_(src)

    t = {"ours_eager": timed(ours), "bare_eager": timed(bare), "copy": timed(copy),
         "ours_graph": timed(graphed(ours)), "bare_graph": timed(graphed(bare))}
    copy_bw = 2 * kv_bytes / t["copy"]
    rows = {k: dict(us=v * 1e6, kv_read_GBps=kv_bytes / v / 1e9) for k, v in t.items() if k != "copy"}
    out = dict(
        benchmark="verify_bandwidth", gpu=torch.cuda.get_device_name(), torch=torch.__version__,
        cuda=torch.version.cuda,
        date=time.strftime("%Y-%m-%d %H:%M:%S %Z"), command="python benchmarks/verify_bandwidth.py " +
        " ".join(os.sys.argv[1:]), shape=dict(bs=bs, T=T, q_heads=hq, kv_heads=hkv, head_dim=d, page_size=page,
                                               mean_ctx=sum(seq) / bs, dtype="bfloat16"),
        kv_bytes=kv_bytes, copy_us=t["copy"] * 1e6, copy_GBps_read_plus_write=copy_bw / 1e9, calls=rows,
        ours_vs_copy_bw=(kv_bytes / t["ours_graph"]) / copy_bw, bare_vs_copy_bw=(kv_bytes / t["bare_graph"]) / copy_bw,
        ours_over_bare_eager=t["ours_eager"] / t["bare_eager"] - 1,
        ours_over_bare_graph=t["ours_graph"] / t["bare_graph"] - 1,
        targets=dict(bw_vs_copy=0.85, over_bare=0.01))
    import flashinfer

    out["flashinfer"] = flashinfer.__version__
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(json.dumps({k: out[k] for k in ("copy_GBps_read_plus_write", "ours_vs_copy_bw", "bare_vs_copy_bw",
                                          "ours_over_bare_eager", "ours_over_bare_graph")}, indent=1))
    for k, v in rows.items():
        print(f"{k:12s} {v['us']:9.1f} us  {v['kv_read_GBps']:8.0f} GB/s KV read")


if __name__ == "__main__":
    main()
