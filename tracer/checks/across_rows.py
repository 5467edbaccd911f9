"""Per-step relations across the rows of a step: ownership of pages, KV slots and request slots (I29, I30, I38),
the padded rows' fill contract (I18) and the rows a capture records (I17)."""

from __future__ import annotations

import numpy as np

from ..schema import ForwardMode, Step
from .context import LOC, R2T, UNIFORM, Ctx, cell, first_dup, pages_read, q_lens, short, token_row


def _owned(c: Ctx, starts: np.ndarray) -> list[set[int]]:
    """Per live row, the physical pages its req_to_token row maps the positions it reads to (page 0 excluded)."""
    p = c.step.page_size
    out = []
    for b in range(c.step.batch_size):
        pages = {int(x) for x in starts[b, : pages_read(c, b)] // p}
        pages.discard(0)
        out.append(pages)
    return out


def check_ownership(c: Ctx) -> None:
    """I29 / I30, vectorized for the common clean step; any suspect step is judged by the exact per-row walk."""
    p = c.step.page_size
    starts, loc = c.arr(R2T), c.arr(LOC)
    got = c.reads() if starts is not None else None
    if got is None or starts is None or starts.shape[1] != got[2].shape[1]:
        return _check_ownership_rows(c)
    live, _, mask = got
    pages = starts[:live].astype(np.int64) // p
    row_of = np.broadcast_to(np.arange(live)[:, None], pages.shape)
    keep = mask & (pages != 0)
    pairs = np.unique(pages[keep] * live + row_of[keep])  # one (page, row) pair per page a row owns
    upages, urows = pairs // live, pairs % live
    if upages.size and np.any(upages[1:] == upages[:-1]):
        return _check_ownership_rows(c)  # I29
    if loc is None:
        return None
    rows, _, q = c.token_rows()
    if rows.shape[0] > loc.shape[0]:
        return _check_ownership_rows(c)
    tok = loc[: rows.shape[0]].astype(np.int64) // p
    if upages.size and tok.size:
        k = np.clip(np.searchsorted(upages, tok), 0, upages.size - 1)
        if np.any((upages[k] == tok) & (urows[k] != rows)):
            return _check_ownership_rows(c)  # I30
    return None


def _check_ownership_rows(c: Ctx) -> None:
    """I29 (a page owned by two live requests) and I30 (a KV write into a page another live request owns)."""
    s, p = c.step, c.step.page_size
    starts = c.arr("req_to_token_page_starts")
    if starts is None or c.arr("cache_seqlens") is None or c.arr("page_table") is None:
        return
    owned = _owned(c, starts)
    owner: dict[int, int] = {}
    for b, pages in enumerate(owned):
        for pg in sorted(pages):
            a = owner.setdefault(pg, b)
            if a != b:
                j = int(np.nonzero(starts[b] // p == pg)[0][0])
                c.v("I29", f"physical page {pg} is owned by request {s.requests[a].request_id} (row {a}) and by "
                           f"this request (row {b}, logical page {j}): one of them reads the other's KV",
                    s.requests[b].request_id, array="req_to_token_page_starts", row=b, col=j, found=pg,
                    expected=f"a page no other live row owns (row {a} owns {pg})",
                    related=[cell(R2T, a, int(np.nonzero(starts[a] // p == pg)[0][0]), pg * p)])
                break
    loc = c.arr("out_cache_loc")
    if loc is None:
        return
    start = 0
    for b, n in enumerate(q_lens(s)):
        for t in range(n):
            if start + t >= loc.shape[0]:
                break
            pg = int(loc[start + t]) // p
            other = next((a for a, pages in enumerate(owned) if a != b and pg in pages), None)
            if other is not None:
                c.v("I30", f"query token {t} writes KV slot {int(loc[start + t])}, in page {pg} that request "
                           f"{s.requests[other].request_id} (row {other}) owns: it overwrites that request's KV",
                    s.requests[b].request_id, array="out_cache_loc", row=b, col=t, found=int(loc[start + t]),
                    expected=f"a slot outside page {pg}",
                    related=[cell(R2T, other, int(np.nonzero(starts[other] // p == pg)[0][0]), pg * p)])
                break
        start += n


def check_row_ownership(c: Ctx) -> None:
    """I38: no KV write slot, request-pool slot or request id used by two live rows (tokens) of one step."""
    s = c.step
    live = len(s.requests)
    if not live:
        return  # a capture has no request rows: its rows are all dummies
    loc = c.arr(LOC)
    if loc is not None and loc.ndim == 1:
        ntok = min(sum(q_lens(s)), loc.shape[0])
        w = np.sort(loc[:ntok])
        if np.any(w[1:] == w[:-1]):
            w = loc[:ntok]
            pair = first_dup(w)
            assert pair is not None
            (b0, t0), (b, t) = token_row(s, pair[0]), token_row(s, pair[1])
            c.v("I38", f"query token {t} of row {b} writes KV slot {int(w[pair[1]])}, which token {t0} of row {b0} "
                       "also writes: one of the two KV entries is lost", s.requests[b].request_id, array=LOC, row=b,
                col=t, found=int(w[pair[1]]), expected="a slot no other token writes",
                related=[cell(LOC, b0, t0, int(w[pair[0]]))])
    rpi = c.arr("req_pool_indices")
    for name, vals in (("req_pool_indices", None if rpi is None else rpi[:live].tolist()),
                       ("slot", [r.slot for r in s.requests]),
                       ("request_id", [r.request_id for r in s.requests])):
        if vals is not None and len(set(vals)) != len(vals):
            pair = first_dup(np.array(vals))
            assert pair is not None
            b0, b = pair
            c.v("I38", f"{name} {int(vals[b])} is used by live rows {b0} and {b}: they read and write one "
                       "req_to_token row", s.requests[b].request_id, array=name, row=b, found=int(vals[b]),
                expected=f"a {name} no other live row has", related=[cell(name, b0, None, int(vals[b0]))])


def _padded_formula(step: Step, fill: int) -> int:
    """cache_seqlens of a padded row: its seq_lens is the fill value (S for draft decode / verify, the full length
    for decode / draft extend, which already count this forward's tokens)."""
    T, i = step.tokens_per_request, step.step_id or 0
    return {ForwardMode.DRAFT_DECODE: fill + i + 1, ForwardMode.TARGET_VERIFY: fill + T}.get(step.mode, fill)


def check_padding(c: Ctx) -> None:
    """I18: padded rows hold the fill value, slot 0, page 0 and the live rows' query span."""
    s = c.step
    if s.padded_batch_size <= s.batch_size:
        return
    fill = s.scalars.get("seq_len_fill_value", 1)
    lo, hi = s.batch_size, s.padded_batch_size
    seq, rpi, cs, pt = c.arr("seq_lens"), c.arr("req_pool_indices"), c.arr("cache_seqlens"), c.arr("page_table")

    def first(name: str, vals: np.ndarray | None, want: int, what: str) -> None:
        if vals is None:
            return
        bad = np.nonzero(vals[lo:hi] != want)[0]
        if bad.size:
            b = lo + int(bad[0])
            c.v("I18", f"padded row {b} has {name} {int(vals[b])}, {what} {want}", array=name, row=b,
                found=int(vals[b]), expected=want, related=rel)

    rel = [cell("seq_len_fill_value", value=fill)] if "seq_len_fill_value" in s.scalars else []
    first("seq_lens", seq, fill, "the fill value is")
    first("seq_lens_cpu", c.arr("seq_lens_cpu"), fill, "the fill value is")
    cuq = c.arr("cu_seqlens_q")
    if cuq is not None and lo >= 1 and cuq.shape[0] >= hi + 1 and (s.mode in UNIFORM
                                                                  or s.mode == ForwardMode.DRAFT_EXTEND):
        # Every kernel layout: the padded rows' query spans continue the live rows' stride (the kernel splits the
        # padded tokens by it), whatever that stride is (a verify graph's buffer may keep stride K, I7).
        stride = int(cuq[1]) - int(cuq[0])
        spans = np.diff(cuq[lo: hi + 1].astype(np.int64))
        bad = np.nonzero(spans != stride)[0]
        if bad.size:
            b = lo + int(bad[0])
            c.v("I18", f"padded row {b} spans cu_seqlens_q[{b}:{b + 2}] = {int(cuq[b])}..{int(cuq[b + 1])}, "
                       f"{int(spans[bad[0]])} query tokens where the live rows have {stride}", array="cu_seqlens_q",
                row=b, col=b + 1, found=int(cuq[b + 1]), expected=int(cuq[b]) + stride,
                related=[cell("cu_seqlens_q", 0, 1, int(cuq[1]))])
    first("req_pool_indices", rpi, 0, "padded rows use request slot")
    first("cache_seqlens", cs, _padded_formula(s, fill), f"the {s.mode.value} formula over the fill value gives")
    if cs is not None and pt is not None:
        for b in range(lo, hi):
            n = min(max(-(-int(cs[b]) // s.page_size), 0), pt.shape[1])
            bad = np.nonzero(pt[b, :n] != 0)[0]
            if bad.size:
                j = int(bad[0])
                c.v("I18", f"padded row {b} reads page {int(pt[b, j])} at logical page {j}: padded rows must stay "
                           "in the reserved page 0", array="page_table", row=b, col=j, found=int(pt[b, j]), expected=0)
                break
    loc = c.arr("out_cache_loc")
    if loc is not None:
        # Draft extend (spec v2) runs T tokens per row like verify; only ragged extend has one row per token.
        t = s.tokens_per_request if s.mode in UNIFORM or s.mode == ForwardMode.DRAFT_EXTEND else 1
        bad = np.nonzero(loc[lo * t: hi * t] != 0)[0]
        if bad.size:
            k = lo * t + int(bad[0])
            c.v("I18", f"padded row {k // t} writes KV slot {int(loc[k])}, outside the reserved slot 0",
                array="out_cache_loc", row=k // t, col=k % t, found=int(loc[k]), expected=0)


def check_capture(c: Ctx) -> None:
    """I17: every row of a capture has KV to attend to and points at reserved page 0."""
    cs = c.arr("cache_seqlens")
    if cs is not None and cs.size and int(cs.min()) <= 0:
        b = int(np.argmin(cs))
        c.v("I17", f"captured with cache_seqlens {short(cs)}: rows with 0 KV give NaN (softmax over nothing)",
            array="cache_seqlens", row=b, found=int(cs[b]), expected="> 0")
    pt = c.arr("page_table")
    if pt is not None and pt.size and pt.shape[1] and np.any(pt[:, :1] != 0):
        b = int(np.nonzero(pt[:, 0] != 0)[0][0])
        c.v("I17", "capture rows must point at reserved page 0", array="page_table", row=b, col=0,
            found=int(pt[b, 0]), expected=0)
