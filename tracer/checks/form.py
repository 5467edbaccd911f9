"""Per-step checks of the facts themselves: dtypes, shapes and row counts (I1-I3), the per-mode formulas and values
of the metadata (I4-I9, I14, I33, I34), and finite attention values (I42)."""

from __future__ import annotations

import numpy as np

from ..schema import ForwardMode
from .context import CONTEXT, PTR_NAMES, UNIFORM, Ctx, cell, q_lens, short, token_row

_ROW_ARRAYS = ("cache_seqlens", "page_table", "seq_lens", "seq_lens_cpu", "req_pool_indices",
               "req_to_token_page_starts")


def check_shapes(c: Ctx) -> bool:
    """I1 and I2; returns False when rows disagree, so the row-wise checks are skipped for this step."""
    s = c.step
    for name in PTR_NAMES:
        a = c.a.get(name)
        if a is not None and a.dtype != "int32":
            c.v("I1", f"{name} is {a.dtype}, kernels need int32", array=name, found=a.dtype, expected="int32")
    ok = True
    for name, ndim in (("cache_seqlens", 1), ("page_table", 2), ("cu_seqlens_k", 1), ("cu_seqlens_q", 1),
                       ("req_to_token_page_starts", 2), ("positions", 1), ("out_cache_loc", 1)):
        a = c.a.get(name)
        if a is not None and a.values.ndim != ndim:
            c.v("I1", f"{name} has shape {tuple(a.values.shape)}, expected {ndim}-D", array=name,
                found=tuple(a.values.shape))
            ok = False
    if not ok:
        return False
    rows: dict[str, int] = {"padded bs": s.padded_batch_size}
    for name in _ROW_ARRAYS:
        vals = c.arr(name)
        if vals is not None:
            rows[name] = int(vals.shape[0])
    cuk = c.arr("cu_seqlens_k")
    if cuk is not None:
        rows["cu_seqlens_k-1"] = int(cuk.shape[0]) - 1
    if len(set(rows.values())) != 1:
        c.v("I2", "row counts disagree: " + ", ".join(f"{k}={v}" for k, v in rows.items()),
            array=next(k for k, v in rows.items() if v != s.padded_batch_size), found=rows,
            expected=s.padded_batch_size)
        ok = False
    if (s.requests and len(s.requests) != s.batch_size) or s.batch_size > s.padded_batch_size:  # captures: none
        c.v("I2", f"{len(s.requests)} request rows for bs {s.batch_size} (padded {s.padded_batch_size})",
            found=len(s.requests), expected=s.batch_size)
        ok = False
    pt, starts = c.arr("page_table"), c.arr("req_to_token_page_starts")
    if pt is not None and starts is not None and pt.shape[1] != starts.shape[1]:
        c.v("I2", f"page_table has {pt.shape[1]} recorded columns, req_to_token_page_starts {starts.shape[1]}",
            array="req_to_token_page_starts", found=starts.shape[1], expected=pt.shape[1])
        ok = False
    pos, loc = c.arr("positions"), c.arr("out_cache_loc")
    if pos is not None and loc is not None and pos.shape[0] != loc.shape[0]:
        c.v("I2", f"{pos.shape[0]} positions but {loc.shape[0]} out_cache_loc entries", array="out_cache_loc",
            found=loc.shape[0], expected=pos.shape[0])
        ok = False
    if pos is not None and ok and sum(q_lens(s)) > pos.shape[0]:
        c.v("I2", f"the live rows have {sum(q_lens(s))} query tokens but {pos.shape[0]} positions were recorded",
            array="positions", found=pos.shape[0], expected=sum(q_lens(s)))
        ok = False
    return ok


def check_query_tokens(c: Ctx) -> None:
    """I3: the query tokens the kernel splits into rows match the rows and their q lengths."""
    s, pos = c.step, c.arr("positions")
    if pos is None:
        return
    n = pos.shape[0]
    if s.mode in UNIFORM:
        q = s.scalars.get("kernel_q_len", 1)
        if n != s.padded_batch_size * q:
            c.v("I3", f"{n} query tokens but rows x q_len_per_req = {s.padded_batch_size} x {q} = "
                      f"{s.padded_batch_size * q}: the kernel regroups tokens into the wrong requests",
                array="positions", found=n, expected=s.padded_batch_size * q)
    else:
        cuq = c.arr("cu_seqlens_q")
        if cuq is not None and cuq.size and (cuq.shape[0] != s.padded_batch_size + 1 or int(cuq[-1]) != n):
            c.v("I3", f"cu_seqlens_q has {cuq.shape[0]} entries ending at {int(cuq[-1])}; expected "
                      f"{s.padded_batch_size + 1} ending at {n} query tokens", array="cu_seqlens_q",
                col=cuq.shape[0] - 1, found=int(cuq[-1]), expected=n)


def check_values(c: Ctx) -> None:
    """I4, I5, I9, I14: cu_seqlens_k, the mode formula, max_seq_len_k and the bounds."""
    s = c.step
    cs, cuk = c.arr("cache_seqlens"), c.arr("cu_seqlens_k")
    if cs is None:
        return
    if cuk is not None and cuk.shape[0] == cs.shape[0] + 1:
        want = np.concatenate([[0], np.cumsum(cs.astype(np.int64))])
        bad = np.nonzero(cuk.astype(np.int64) != want)[0]
        if bad.size:
            j = int(bad[0])
            c.v("I4", f"cu_seqlens_k[{j}] = {int(cuk[j])}, prefix sum of cache_seqlens gives {int(want[j])}",
                array="cu_seqlens_k", col=j, found=int(cuk[j]), expected=int(want[j]),
                related=[cell("cache_seqlens", j - 1, None, int(cs[j - 1]))] if j else [])
    want_rows = c.want_lens()
    for b, r in enumerate(s.requests) if cs[: len(want_rows)].tolist() != want_rows else ():
        e = want_rows[b]
        if int(cs[b]) != e:
            c.v("I5", f"cache_seqlens = {int(cs[b])}, {s.mode.value} formula gives {e} "
                      f"(S = {r.seq_len_before}, T = {s.tokens_per_request})", r.request_id,
                array="cache_seqlens", row=b, found=int(cs[b]), expected=e,
                related=[cell("seq_len_before", b, None, r.seq_len_before)])
    live = cs[: s.batch_size]
    mk = s.scalars.get("max_seq_len_k")
    if mk is not None and live.size and mk < int(live.max()):
        b = int(np.argmax(live))
        c.v("I9", f"max_seq_len_k = {mk} < max(cache_seqlens) = {int(live.max())}: page-table refresh too narrow",
            array="cache_seqlens", row=b, found=mk, expected=f">= {int(live.max())}")
    mctx, npages = s.scalars.get("max_context_len"), s.scalars.get("num_kv_pages")
    if mctx is not None and live.size and int(live.max()) > mctx:
        b = int(np.argmax(live))
        c.v("I14", f"cache_seqlens {int(live.max())} exceeds max_context_len {mctx}", array="cache_seqlens", row=b,
            found=int(live.max()), expected=f"<= {mctx}")
    pt = c.arr("page_table")
    if npages is not None and pt is not None and pt.size:
        outside = np.argwhere((pt >= npages) | (pt < 0))
        if outside.size:
            b, j = (int(x) for x in outside[0])
            c.v("I14", f"page_table[{b}, {j}] = {int(pt[b, j])} is outside the KV pool of {npages} pages "
                       f"({len(outside)} cells)", array="page_table", row=b, col=j, found=int(pt[b, j]),
                expected=f"0..{npages - 1}")


def check_verify_and_extend(c: Ctx) -> None:
    """I6-I8: the q_len_per_req and cu_seqlens_q that verify and draft extend run with."""
    s, T = c.step, c.step.tokens_per_request
    cuq = c.arr("cu_seqlens_q")
    if s.mode == ForwardMode.TARGET_VERIFY:
        q, mq = s.scalars.get("kernel_q_len"), s.scalars.get("max_seq_len_q")
        if q is not None and q != T:
            c.v("I6", f"kernel q_len_per_req = {q} but T = {T} tokens per request (backend K = "
                      f"{s.scalars.get('backend_num_draft_tokens')}; max_seq_len_q = {mq}): tokens regrouped, "
                      f"causal window off by {q - T}",
                array="kernel_q_len", found=q, expected=T,
                related=[cell("max_seq_len_q", value=mq)] if mq is not None else [])
        elif mq is not None and mq != T:
            c.v("I6", f"max_seq_len_q = {mq} but T = {T} (the kernel ran q_len_per_req = {q})", array="max_seq_len_q",
                found=mq, expected=T, related=[cell("kernel_q_len", value=q)] if q is not None else [])
        if cuq is not None and s.batch_size and cuq.shape[0] > 1 and int(cuq[1]) != T:
            c.v("I7", f"cu_seqlens_q stride {int(cuq[1])} != T = {T} (not read by the decode kernel)",
                array="cu_seqlens_q", col=1, found=int(cuq[1]), expected=T)
    if s.mode == ForwardMode.DRAFT_EXTEND and cuq is not None:
        want = np.arange(0, (s.batch_size + 1) * T, T)
        got = cuq[: s.batch_size + 1].astype(np.int64)
        if got.shape != want.shape or not np.array_equal(got, want):
            n = min(got.shape[0], want.shape[0])
            diff = np.nonzero(got[:n] != want[:n])[0]
            j = int(diff[0]) if diff.size else n  # the first wrong entry, or where the shorter one ends
            c.v("I8", f"cu_seqlens_q[:bs+1] = {short(got)}, expected stride {T}: {short(want)}",
                array="cu_seqlens_q", col=j, found=got, expected=want)
        mq = s.scalars.get("kernel_q_len")
        if mq is not None and mq != T:
            c.v("I8", f"max_seq_len_q = {mq}, expected T = {T}", array="kernel_q_len", found=mq, expected=T)


def check_context_boundaries(c: Ctx) -> None:
    """I33: every boundary of cu_seqlens_q for the context kernel, not only the last."""
    s, cuq = c.step, c.arr("cu_seqlens_q")
    if s.mode not in CONTEXT or cuq is None or not cuq.size:
        return
    if int(cuq[0]) != 0:
        c.v("I33", f"cu_seqlens_q[0] = {int(cuq[0])}, the context kernel needs 0", array="cu_seqlens_q", col=0,
            found=int(cuq[0]), expected=0)
        return
    for b, r in enumerate(s.requests):
        if b + 1 >= cuq.shape[0]:
            return  # too short: I3 says so
        n = int(cuq[b + 1]) - int(cuq[b])
        if n != r.num_q_tokens:
            c.v("I33", f"cu_seqlens_q[{b + 1}] - cu_seqlens_q[{b}] = {n} but row {b} has {r.num_q_tokens} query "
                       f"tokens: the kernel reads the wrong tokens for every later row", r.request_id,
                array="cu_seqlens_q", row=b, col=b + 1, found=int(cuq[b + 1]), expected=int(cuq[b]) + r.num_q_tokens)
            return


def check_mirror(c: Ctx) -> None:
    """I34: the host mirror against the device seq_lens."""
    host, dev = c.arr("seq_lens_cpu"), c.arr("seq_lens")
    if host is None or dev is None or host.shape != dev.shape:
        return
    bad = np.nonzero(host.astype(np.int64) != dev.astype(np.int64))[0]
    if bad.size:
        b = int(bad[0])
        rid = c.step.requests[b].request_id if b < len(c.step.requests) else None
        c.v("I34", f"seq_lens_cpu[{b}] = {int(host[b])} but the device seq_lens[{b}] = {int(dev[b])} "
                   f"({bad.size} rows): the refresh width and the kernels' lengths come from different values", rid,
            array="seq_lens_cpu", row=b, found=int(host[b]), expected=int(dev[b]),
            related=[cell("seq_lens", b, None, int(dev[b]))])


def check_finite(c: Ctx) -> None:
    """I42: the recorded attention inputs and outputs of live rows hold no NaN / Inf."""
    s = c.step
    if not s.requests:
        return
    ntok = sum(q_lens(s))
    ids = c.arr("attn_page_ids")
    for name in ("attn_q", "attn_out", "attn_kv", "attn_scaling"):
        vals = c.arr(name)
        if vals is None or vals.dtype.kind != "f":
            continue
        if name in ("attn_q", "attn_out"):
            vals = vals[:ntok]  # padded rows' tokens may hold anything
        elif name == "attn_kv" and ids is not None and ids.shape[0] == vals.shape[0]:
            vals = vals[ids != 0]  # page 0 is where padded rows write
        fin = np.isfinite(vals)
        if not fin.all():
            bad = np.argwhere(~fin)[0]
            k = int(bad[0])
            row, col = (token_row(s, k) if name in ("attn_q", "attn_out") else (None, k))
            what = f"token {col} of row {row}" if row is not None else f"entry {k}"
            c.v("I42", f"{name} holds a non-finite value ({vals[tuple(bad)]}) at {what} ({int((~fin).sum())} "
                       "values): the kernel consumed or produced NaN / Inf", array=name, row=row, col=col,
                found=str(vals[tuple(bad)]), expected="finite")
