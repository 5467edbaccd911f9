"""Per-step relations within one live row: its page-table row against req_to_token (I10, I11), its query tokens'
positions and KV slots (I12, I13), distinct pages and no page 0 (I36, I37), and the indices and lengths the
kernels use against the row's request (I39)."""

from __future__ import annotations

import numpy as np

from ..schema import ForwardMode, Step
from .context import LOC, R2T, UNIFORM, Ctx, cell, first_dup, q_lens, short, token_row


def check_pages(c: Ctx) -> None:
    """I10 / I11: each page a live row reads is req_to_token's page, and page-aligned."""
    s, p = c.step, c.step.page_size
    cs, pt, starts = c.arr("cache_seqlens"), c.arr("page_table"), c.arr("req_to_token_page_starts")
    if cs is None or pt is None or starts is None:
        return
    got = c.reads()
    if got is not None and starts.shape == pt.shape and pt.ndim == 2:
        live, n_read, mask = got
        if (not np.any(-(-cs[:live].astype(np.int64) // p) > pt.shape[1])
                and np.array_equal(pt[:live][mask], starts[:live][mask] // p) and not np.any(starts[:live][mask] % p)):
            return  # every read page agrees and is aligned: the common case, without a Python loop
    for b, r in enumerate(s.requests):
        n = -(-int(cs[b]) // p)
        if n > pt.shape[1]:
            c.v("I10", f"reads {n} pages but only {pt.shape[1]} page-table columns were recorded as live",
                r.request_id, array="page_table", row=b, col=pt.shape[1], found=pt.shape[1], expected=n)
            continue
        want = starts[b, :n] // p
        bad = np.nonzero(pt[b, :n] != want)[0]
        if bad.size:
            j = int(bad[0])
            c.v("I10", f"page_table[{b}, {j}] = {int(pt[b, j])} but req_to_token gives page {int(want[j])} "
                       f"({bad.size} of {n} pages differ)", r.request_id, array="page_table", row=b, col=j,
                found=int(pt[b, j]), expected=int(want[j]), related=[cell(R2T, b, j, int(starts[b, j]))])
        unaligned = np.nonzero(starts[b, :n] % p)[0]
        if unaligned.size:
            j = int(unaligned[0])
            c.v("I11", f"req_to_token[slot, {j * p}] = {int(starts[b, j])} is not page-aligned (P = {p})",
                r.request_id, array="req_to_token_page_starts", row=b, col=j, found=int(starts[b, j]),
                expected=f"a multiple of {p}")


def check_tokens(c: Ctx) -> None:
    """I13 / I12, vectorized for the common clean step; any suspect step is judged by the exact per-row walk."""
    p = c.step.page_size
    cs, pt, pos, loc = c.arr("cache_seqlens"), c.arr("page_table"), c.arr("positions"), c.arr("out_cache_loc")
    if cs is None or pt is None or pos is None or loc is None:
        return
    rows, t, q = c.token_rows()
    n = rows.shape[0]
    if not q.size:
        return
    if n <= pos.shape[0] and n <= loc.shape[0] and pos.ndim == 1 and loc.ndim == 1 and pt.ndim == 2:
        want_pos = cs[: q.shape[0]].astype(np.int64)[rows] - q[rows] + t
        if np.array_equal(pos[:n], want_pos) and (not n or (want_pos.min() >= 0
                                                             and want_pos.max() // p < pt.shape[1])):
            want_loc = pt[rows, want_pos // p].astype(np.int64) * p + want_pos % p
            if np.array_equal(loc[:n], want_loc):
                return
    _check_tokens_rows(c)


def _check_tokens_rows(c: Ctx) -> None:
    s, p = c.step, c.step.page_size
    cs, pt, pos, loc = c.arr("cache_seqlens"), c.arr("page_table"), c.arr("positions"), c.arr("out_cache_loc")
    assert cs is not None and pt is not None and pos is not None and loc is not None
    start = 0
    for b, (r, n) in enumerate(zip(s.requests, q_lens(s), strict=False)):
        want_pos = np.arange(int(cs[b]) - n, int(cs[b]))
        got_pos = pos[start:start + n].astype(np.int64)
        if got_pos.shape == want_pos.shape and not np.array_equal(got_pos, want_pos):
            t = int(np.nonzero(got_pos != want_pos)[0][0])
            c.v("I13", f"positions {short(got_pos)} but cache_seqlens {int(cs[b])} - q {n} + t gives "
                       f"{short(want_pos)}", r.request_id, array="positions", row=b, col=t, found=int(got_pos[t]),
                expected=int(want_pos[t]), related=[cell("cache_seqlens", b, None, int(cs[b]))])
        pages = want_pos // p
        if want_pos.size and pages.max() < pt.shape[1] and want_pos.min() >= 0:
            want_loc = pt[b, pages].astype(np.int64) * p + want_pos % p
            got = loc[start:start + n].astype(np.int64)
            if got.shape == want_loc.shape and not np.array_equal(got, want_loc):
                t = int(np.nonzero(got != want_loc)[0][0])
                c.v("I12", f"query token {t} writes KV slot {int(got[t])} but the kernel reads position "
                           f"{int(want_pos[t])} from slot {int(want_loc[t])}", r.request_id, array="out_cache_loc",
                    row=b, col=t, found=int(got[t]), expected=int(want_loc[t]),
                    related=[cell("page_table", b, int(pages[t]), int(pt[b, pages[t]])),
                             cell("positions", b, t, int(got_pos[t]) if t < got_pos.shape[0] else None)])
        start += n


def check_row_pages(c: Ctx) -> None:
    """I36 (a live row's logical pages are distinct physical pages) and I37 (no live row touches page 0)."""
    got = c.reads()
    if got is None:
        return
    live, n, mask = got
    s, p = c.step, c.step.page_size
    pt, starts = c.arr("page_table"), c.arr(R2T)
    # req_to_token is where the pages come from; the page table the kernel read is tied to it cell by cell (I10), so
    # it is judged here only where req_to_token was not recorded.
    if starts is not None and starts.shape[1] == pt.shape[1]:  # type: ignore[union-attr]
        name, pages = R2T, starts[:live].astype(np.int64) // p
    else:
        name, pages = "page_table", pt[:live].astype(np.int64)  # type: ignore[index]
    # One sort of (page, row) keys finds a page repeated within a row without a Python loop.
    keyed = np.sort((pages * live + np.arange(live)[:, None])[mask])
    dup = keyed[1:][keyed[1:] == keyed[:-1]]
    scale = p if name == R2T else 1
    if dup.size:
        b = int(dup[0]) % live
        pair = first_dup(pages[b, : n[b]])
        assert pair is not None
        j0, j = pair
        c.v("I36", f"{name}: logical pages {j0} and {j} of this row both map to physical page {int(pages[b, j])}: "
                   "two positions share one KV slot", s.requests[b].request_id, array=name, row=b, col=j,
            found=int(pages[b, j]) * scale, expected=f"a page other than logical page {j0}'s",
            related=[cell(name, b, j0, int(pages[b, j0]) * scale)])
    zero = np.argwhere((pages == 0) & mask)
    if zero.size:
        b, j = (int(x) for x in zero[0])
        c.v("I37", f"{name}[{b}, {j}] maps logical page {j} of a live row to the reserved page 0 (the padding "
                   "page every padded row reads and writes)", s.requests[b].request_id, array=name, row=b, col=j,
            found=0, expected="a page > 0")
    loc = c.arr(LOC)
    if loc is not None and loc.ndim == 1:
        ntok = min(sum(q_lens(s)), loc.shape[0])
        z = np.nonzero(loc[:ntok] // p == 0)[0]
        if z.size:
            k = int(z[0])
            b, t = token_row(s, k)
            c.v("I37", f"query token {t} of a live row writes KV slot {int(loc[k])}, in the reserved page 0",
                s.requests[b].request_id if b < live else None, array=LOC, row=b, col=t, found=int(loc[k]),
                expected=f">= {p}")


def _seq_lens_offset(step: Step) -> int:
    """cache_seqlens - seq_lens by mode: draft step i attends S + i + 1 from seq_lens S; verify S + T from S."""
    if step.mode == ForwardMode.DRAFT_DECODE:
        return (step.step_id or 0) + 1
    return step.tokens_per_request if step.mode == ForwardMode.TARGET_VERIFY else 0


def check_identity(c: Ctx) -> None:
    """I39: the per-row indices and lengths the kernels use are the request rows' own."""
    s = c.step
    live = len(s.requests)
    if not live:
        return
    rpi = c.arr("req_pool_indices")
    if rpi is not None and rpi.ndim == 1:
        slots = [r.slot for r in s.requests]
        want = np.array(slots, dtype=np.int64)
        bad = np.nonzero(rpi[:live].astype(np.int64) != want)[0] if rpi[:live].tolist() != slots else np.zeros(0, int)
        if bad.size:
            b = int(bad[0])
            c.v("I39", f"req_pool_indices[{b}] = {int(rpi[b])} but request row {b} is in slot {int(want[b])}: the "
                       "kernels read another request's req_to_token row", s.requests[b].request_id,
                array="req_pool_indices", row=b, found=int(rpi[b]), expected=int(want[b]),
                related=[cell("slot", b, None, int(want[b]))])
    seq = c.arr("seq_lens")
    if seq is not None and seq.ndim == 1:
        off = _seq_lens_offset(s)
        lens = [x - off for x in c.want_lens()]
        want = np.array(lens, dtype=np.int64)
        bad = np.nonzero(seq[:live].astype(np.int64) != want)[0] if seq[:live].tolist() != lens else np.zeros(0, int)
        if bad.size:
            b = int(bad[0])
            r = s.requests[b]
            c.v("I39", f"seq_lens[{b}] = {int(seq[b])} but request row {b} gives {int(want[b])} for {s.mode.value} "
                       f"(S = {r.seq_len_before}, after = {r.seq_len_after})", r.request_id, array="seq_lens", row=b,
                found=int(seq[b]), expected=int(want[b]), related=[cell("seq_len_before", b, None, r.seq_len_before)])
    if s.mode in UNIFORM:
        for b, r in enumerate(s.requests):
            if r.num_q_tokens != s.tokens_per_request:
                c.v("I39", f"request row {b} has {r.num_q_tokens} query tokens but the {s.mode.value} runs T = "
                           f"{s.tokens_per_request} per row", r.request_id, array="num_q_tokens", row=b,
                    found=r.num_q_tokens, expected=s.tokens_per_request,
                    related=[cell("tokens_per_request", value=s.tokens_per_request)])
                break
