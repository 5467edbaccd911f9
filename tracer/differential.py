"""The differential attention check, in numpy: recompute recorded attention calls and compare with the kernel.

Steps recorded with `--record-attention N` carry layer 0's query (`attn_q`), the kernel's output (`attn_out`),
the KV pages the live rows touch (`attn_kv` `[U, 2, Hkv, P, D]` with their ids `attn_page_ids`) and the softmax
scale. Two recomputations (float64, bottom-right causal):

- D1, kernel view: exactly the metadata the kernel consumed (page table, cache_seqlens, q_len_per_req or
  cu_seqlens_q). A mismatch means the kernel did not compute what its arguments say.
- D2, ground truth: each query token at position p attends to positions [0, p] of its request through
  `req_to_token`. A mismatch means the output is wrong for the sequence, whatever the metadata said:
  the symptom the metadata invariants explain.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from .attention_call import recorded_call
from .kv_bases import KvFetch
from .schema import ForwardMode, Severity, Step, Violation

REL_TOL = 2e-2  # bf16 kernels land near 3e-3; a wrong KV window or page lands far above

_UNIFORM = (ForwardMode.DECODE, ForwardMode.DRAFT_DECODE, ForwardMode.TARGET_VERIFY)


def _attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, visible: np.ndarray, scale: float) -> np.ndarray:
    """q [n, Hq, D], k/v [L, Hkv, D], visible bool [n, L] -> [n, Hq, D]."""
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = np.einsum("qhd,khd->hqk", q, k) * scale
    s = np.where(visible[None], s, -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    w = np.exp(s)
    w /= w.sum(axis=-1, keepdims=True)
    out: np.ndarray = np.einsum("hqk,khd->qhd", w, v)  # numpy types einsum's result as Any
    return out


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    den = float(np.linalg.norm(b))
    return float(np.linalg.norm(a - b)) / den if den else float(np.linalg.norm(a))


class _Pages:
    def __init__(self, kv: np.ndarray, ids: np.ndarray, page: int) -> None:
        self.kv, self.page = kv.astype(np.float64), page
        self.index = {int(p): i for i, p in enumerate(ids)}

    def gather(self, pages: Iterable[int], length: int) -> tuple[np.ndarray, np.ndarray] | None:
        try:
            sel = self.kv[[self.index[int(p)] for p in pages]]  # [n, 2, Hkv, P, D]
        except KeyError:
            return None
        n, _, hkv, p, d = sel.shape
        kv = sel.transpose(1, 0, 3, 2, 4).reshape(2, n * p, hkv, d)[:, :length]
        return kv[0], kv[1]


def diff_step(step: Step, fetch: KvFetch | None = None) -> Iterator[tuple[str, int, int, float]]:
    """(check id, row, request id, rel. error) for every live row of a sampled step.

    `fetch(i)` reads step i of the same trace (`TraceReader.kv_base`), for a bundle's delta-coded KV pages read out
    of order; without it they resolve from the calls decoded just before (a sequential read)."""
    a = {x.name: x.values for x in step.arrays}
    if "attn_q" not in a:
        return
    call = recorded_call(step, fetch)  # the one recorded call `specscope replay` re-runs (tracer/attention_call.py)
    p = call.page_size
    q = call.q.astype(np.float64)
    out = call.out.astype(np.float64)
    pages = _Pages(call.kv, call.page_ids, p)
    scale = call.scaling
    cs, pt, pos = a["cache_seqlens"], a["page_table"], a["positions"]
    starts = a["req_to_token_page_starts"]
    if step.mode in _UNIFORM:
        ql = call.q_len_per_req  # recorded at the kernel call (attn_call); older traces: from kernel_q_len
        rows = [(b * ql, ql) for b in range(step.batch_size)]
        true_rows = [(b * step.tokens_per_request, step.tokens_per_request) for b in range(step.batch_size)]
    else:
        cu = a["cu_seqlens_q"]
        rows = [(int(cu[b]), int(cu[b + 1] - cu[b])) for b in range(step.batch_size)]
        true_rows = rows
    for b, r in enumerate(step.requests):
        start, n = rows[b]
        length = int(cs[b])
        kv = pages.gather(pt[b, : -(-length // p)], length) if n and length > 0 else None
        if kv is not None and start + n <= q.shape[0] and n <= length:
            vis = np.arange(length)[None, :] <= np.arange(length - n, length)[:, None]
            want = _attend(q[start:start + n], kv[0], kv[1], vis, scale)
            yield "D1", b, r.request_id, _rel(out[start:start + n], want)
        t0, tn = true_rows[b]
        tpos = pos[t0:t0 + tn].astype(np.int64)
        if not tn or tpos.max() // p >= starts.shape[1]:
            continue
        last = int(tpos.max()) + 1
        kv = pages.gather(starts[b, : -(-last // p)] // p, last)
        if kv is None:
            continue
        vis = np.arange(last)[None, :] <= tpos[:, None]
        want = _attend(q[t0:t0 + tn], kv[0], kv[1], vis, scale)
        yield "D2", b, r.request_id, _rel(out[t0:t0 + tn], want)


def differential_check(steps: Iterable[Step], tol: float = REL_TOL, *,
                       fetch: KvFetch | None = None) -> Iterator[Violation]:
    """Violations D1 / D2 for sampled steps whose recomputed attention disagrees with the kernel's output (`fetch`:
    as for `diff_step`)."""
    for step in steps:
        for cid, b, rid, err in diff_step(step, fetch):
            # NaN > tol is False: a non-finite difference is a mismatch, never a pass.
            if not err <= tol:
                what = ("the kernel's output differs from attention over the metadata it was given" if cid == "D1"
                        else "the output differs from attention over the request's own KV (req_to_token, positions)")
                yield Violation(cid, Severity.ERROR, step.index,
                                f"step {step.index} ({step.model} {step.mode.value}) request {rid} row {b}: {what}: "
                                f"rel. error {err:.3g} > {tol:g}" + (" (non-finite: NaN / Inf in the output or the "
                                "recomputation)" if not np.isfinite(err) else ""), rid, array="attn_out", row=b,
                                found=f"rel. error {err:.3g}", expected=f"<= {tol:g}")
