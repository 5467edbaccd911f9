"""A recorded EAGLE run through upstream's own backend: the driver behind the seed-bug tests and docs/sglang.md.

One iteration is what SGLang's spec-v2 worker asks of the attention backends (topk = 1): the draft multi-step
wrapper prepares draft decode steps 0..N-2, the target backend prepares TARGET_VERIFY with T tokens per request
(a graph runner built for T, the backend caching K = `speculative_num_draft_tokens`), the plan-stream fix-up hook
runs when `plan_stream` is on (`EAGLEWorkerV2.verify`: `update_verify_buffers_to_fill_after_draft`, only then),
and the draft-extend backend prepares DRAFT_EXTEND_V2 over the T verified positions. Requests are prefilled with
an eager EXTEND, batch sizes change between iterations (padded replays), and committed lengths grow by random
accept lengths. Graphs are captured (metadata half, `UpstreamGraphRunner`) for draft decode and verify, and for
draft extend when the release has a DRAFT_EXTEND_V2 graph path (0.5.13+). Every release 0.5.12 ... 0.5.23 drives;
what differs between them comes from `sglang_versions.facts_for` (`up.facts`). From 0.5.15 a graph's metadata is
computed inside the graph (`init_forward_metadata_in_graph`): the runners run it where the graph would, and the
recorder keeps those replays as steps whose metadata is not recorded (the values live inside the graph).

    python -m specscope.integrations.sglang_drive --sglang .sglang-0.5.12 --K 4 --T 2 -o old.db
    specscope check old.db
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from typing import Any

import torch

from ..backend.memory import KVPool, PageAllocator, ReqToTokenPool, RequestKV
from ..tracer.schema import ForwardMode
from . import sglang as ss
from .sglang_driver import UpstreamGraphRunner, specscope_batch, upstream_batch
from .sglang_loader import UpstreamSglang, load_upstream
from .sglang_package import SglangNotFound
from .sglang_parity_compare import snapshot
from .sglang_stand_ins import make_model_runner


def drive(up: UpstreamSglang, trace: str | os.PathLike[str] | None, *, K: int = 4, T: int | None = None,
          page_size: int = 16, iterations: int = 6, batch_sizes: tuple[int, ...] = (3, 4, 2, 4, 1, 3),
          ladder: tuple[int, ...] = (1, 2, 4), plan_stream: bool = False, backend_cls: type | None = None,
          context_len: int = 512, seed: int = 0, device: str = "cpu", overwrite: bool = True,
          draft_extend_graph: bool | None = None) -> list[Any]:
    """Run the iterations through `up`'s backends, recorded into `trace` (None: not recorded). Returns the
    metadata objects each prep produced, in order (to compare instrumented and plain runs).

    `backend_cls` replaces the target backend class (e.g. a subclass without the fix-up hook)."""
    T = K if T is None else T
    num_steps = max(K - 1, 2)  # speculative_num_steps N (K = N + 1 in SGLang with topk = 1)
    dev = torch.device(device)
    rng = random.Random(seed)
    max_bs = max(ladder)
    r2t = ReqToTokenPool(max_bs * 2, context_len, dev)
    alloc = PageAllocator(max_bs * 2 * (-(-context_len // page_size)) + 2, page_size)
    kv = KVPool(1, 2, page_size, 1, 8, torch.float32, dev)
    tracer = None
    if trace is not None:
        tracer = ss.SglangTracer(trace, overwrite=overwrite, sglang_version=up.version,
                                 config=dict(K=K, T=T, page_size=page_size, plan_stream=plan_stream,
                                             ladder=list(ladder), driver="specscope.integrations.sglang_drive"),
                                 command=f"sglang_drive sglang={up.version} K={K} T={T} P={page_size}")
        ss.instrument(up.module, tracer)
        if backend_cls is not None:
            ss.instrument_class(backend_cls)
    out: list[Any] = []

    def keep(md: Any) -> None:
        out.append(snapshot(md, kernel_q_len=getattr(md, "max_seq_len_q", None), reuses=None))

    try:
        def mr(draft: bool) -> Any:
            return make_model_runner(req_to_token=r2t.req_to_token, page_size=page_size, context_len=context_len,
                                     num_draft_tokens=K, is_draft_worker=draft, device=dev)

        target = (backend_cls or up.backend_cls)(mr(False))
        draft = up.multi_step_cls(mr(True), 1, num_steps)
        draft_ext = up.backend_cls(mr(True))
        de_graph = up.facts.has_draft_extend_v2_graph if draft_extend_graph is None else draft_extend_graph
        runners = {ForwardMode.DRAFT_DECODE: UpstreamGraphRunner(up, draft, ForwardMode.DRAFT_DECODE,
                                                                 tokens_per_req=1, ladder=list(ladder), device=dev),
                   ForwardMode.TARGET_VERIFY: UpstreamGraphRunner(up, target, ForwardMode.TARGET_VERIFY,
                                                                  tokens_per_req=T, ladder=list(ladder), device=dev)}
        if de_graph:
            runners[ForwardMode.DRAFT_EXTEND] = UpstreamGraphRunner(up, draft_ext, ForwardMode.DRAFT_EXTEND,
                                                                    tokens_per_req=T, ladder=list(ladder), device=dev)
        for r in runners.values():
            r.capture_all()
        reqs: dict[int, tuple[RequestKV, int]] = {}  # slot -> (pages, committed length S)
        for it in range(iterations):
            bs = min(batch_sizes[it % len(batch_sizes)], max_bs)
            # Finish surplus requests, admit new ones (prefilled with an eager EXTEND of the target).
            while len(reqs) > bs:
                slot = rng.choice(sorted(reqs))
                kvr, _ = reqs.pop(slot)
                kvr.release(alloc)
                r2t.free(slot)
            new: list[tuple[int, int]] = []  # (req slot, S) of the requests admitted now (already in reqs)
            while len(reqs) < bs:
                slot = r2t.alloc()
                kvr = RequestKV(slot)
                s = rng.randint(8, context_len // 2)
                kvr.ensure(s, alloc, r2t)
                reqs[slot] = (kvr, s)
                new.append((slot, s))
            if new:
                fb = specscope_batch(r2t, kv, None, ForwardMode.EXTEND, new, T=1)
                target.init_forward_metadata(upstream_batch(up, fb))
                keep(target.forward_metadata)
            rows = [(slot, s) for slot, (_, s) in sorted(reqs.items())]
            for kvr, s in reqs.values():
                kvr.ensure(s + max(T, num_steps) + 1, alloc, r2t)
            # Draft decode: all N-1 step backends in one replay prep of the draft graph.
            live = upstream_batch(up, specscope_batch(r2t, kv, None, ForwardMode.DRAFT_DECODE, rows, T=1, step=0),
                                  num_steps=num_steps)
            with ss.live_batch(live):
                runners[ForwardMode.DRAFT_DECODE].replay_prepare(live)
            for b in draft.attn_backends:
                keep(b.forward_metadata)
            # Target verify (prepared on the plan stream when it is on), then the fix-up hook.
            live = upstream_batch(up, specscope_batch(r2t, kv, None, ForwardMode.TARGET_VERIFY, rows, T=T))
            with ss.live_batch(live):
                view = runners[ForwardMode.TARGET_VERIFY].replay_prepare(live)
            keep(target.forward_metadata)
            if plan_stream:
                target.update_verify_buffers_to_fill_after_draft(live.spec_info, view.batch_size)
            acc = [rng.randint(1, T) for _ in rows]
            # Draft extend over the T verified positions.
            live = upstream_batch(up, specscope_batch(r2t, kv, None, ForwardMode.DRAFT_EXTEND, rows, T=T),
                                  accept_lens=acc)
            with ss.live_batch(live):
                if de_graph:
                    runners[ForwardMode.DRAFT_EXTEND].replay_prepare(live)
                else:
                    draft_ext.init_forward_metadata(live)
            keep(draft_ext.forward_metadata)
            for (slot, s), a in zip(rows, acc, strict=True):
                kvr, _ = reqs[slot]
                reqs[slot] = (kvr, s + a)
                kvr.shrink(s + a, alloc, r2t)
    finally:
        if tracer is not None:
            tracer.close()
    return out


def without_fixup_hook(up: UpstreamSglang) -> type:
    """The backend class without `update_verify_buffers_to_fill_after_draft` of its own (PR #25925 undone): the
    class itself when it lacks the method (0.5.12), else a subclass that resolves the hook to the base class's
    raising default, as every backend did before that PR."""
    cls = up.backend_cls
    if not up.has_fixup_hook:
        return cls
    base_hook = up.base_module.AttentionBackend.update_verify_buffers_to_fill_after_draft
    return type(f"{cls.__name__}WithoutFixupHook", (cls,), {
        "update_verify_buffers_to_fill_after_draft": base_hook,
        "__doc__": "TRTLLMHAAttnBackend as before PR #25925: the fix-up hook is the base class's."})


def main(argv: list[str] | None = None) -> int:
    """Record one drive into a trace."""
    ap = argparse.ArgumentParser(prog="python -m specscope.integrations.sglang_drive", description=main.__doc__)
    ap.add_argument("--sglang", help="folder holding an unpacked sglang wheel (default: the installed one)")
    ap.add_argument("--K", type=int, default=4, help="speculative_num_draft_tokens the backend caches")
    ap.add_argument("--T", type=int, default=None, help="tokens per request of the verify graph runner (default K)")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--plan-stream", action="store_true", help="call the fix-up hook as the plan stream does")
    ap.add_argument("--no-fixup-hook", action="store_true", help="use the backend class without the fix-up hook")
    ap.add_argument("--kernels", action="store_true", help="import the real flashinfer (GPU hosts)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("-o", "--output", required=True, help="trace file to write (replaced if it exists)")
    a = ap.parse_args(argv)
    if a.K < 2 or (a.T is not None and a.T < 1) or a.page_size < 1 or a.iterations < 1:
        print("specscope: error: --K must be at least 2, --T, --page-size and --iterations at least 1",
              file=sys.stderr)
        return 2
    try:
        up = load_upstream(a.sglang, kernels=a.kernels)
    except SglangNotFound as e:
        print(f"specscope: error: {e}", file=sys.stderr)
        return 2
    cls = without_fixup_hook(up) if a.no_fixup_hook else None
    try:
        drive(up, a.output, K=a.K, T=a.T, page_size=a.page_size, iterations=a.iterations, plan_stream=a.plan_stream,
              backend_cls=cls, device=a.device)
    except NotImplementedError as e:
        print(f"specscope: the drive stopped where SGLang would: NotImplementedError: {e} (recorded in {a.output})",
              file=sys.stderr)
        return 1
    print(a.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
