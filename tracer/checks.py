"""The invariant catalogue (`reference/sglang-trtllm-mha.md` §7) checked over recorded steps. Torch-free.

Every invariant judges recorded facts only: the values the kernels consumed (metadata snapshots, request rows),
the times the device recorded (spans), the wait edges the engine enqueued, and the calls that raised. None
reads a flag the engine writes about itself or a fault switch, so the same catalogue checks a trace recorded
from a backend we did not write. This is the only module that knows check ids.

A violation names the step, the request and the values that disagree; where it is about one cell it also
names the array, row (batch row), column (logical page, or the token within the row for per-token arrays),
the value found and the value expected, so a viewer can highlight it. `Checker.feed` walks steps in order
and keeps the state some invariants need (capture/replay, page-table buffers, committed lengths, acceptance).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, overload

import numpy as np

from .differential import differential_check
from .schema import ForwardMode, GraphPhase, RequestState, RunInfo, Severity, Step, StreamSpan, Violation

if TYPE_CHECKING:
    from .reader import TraceReader

E, W = Severity.ERROR, Severity.WARNING


@dataclass(frozen=True)
class Invariant:
    """One catalogue entry: what it asserts, where it comes from, and the recorded facts it reads."""

    check_id: str
    severity: Severity
    description: str
    upstream: str  # the bug or rule it comes from
    reads: str  # the recorded facts (arrays, request fields, scalars, spans, waits, errors) it judges


_MD = "cache_seqlens, page_table"
CATALOGUE: tuple[Invariant, ...] = (
    Invariant("I1", E, "metadata tensors are int32; cache_seqlens 1-D, page_table 2-D", "§7 shapes",
              "dtype and shape of cache_seqlens, cu_seqlens_q/k, page_table"),
    Invariant("I2", E, "rows agree: cache_seqlens, page_table, cu_seqlens_k-1, seq_lens, seq_lens_cpu, "
              "req_pool_indices, req_to_token rows == padded bs; positions and out_cache_loc have one length "
              "(a step whose arrays disagree is reported and its row-wise checks skipped)", "§7 shapes",
              "lengths of every metadata array, the step's bs / padded bs, its request rows"),
    Invariant("I3", E, "query tokens == rows x q_len_per_req (uniform q) or cu_seqlens_q[-1] (context kernel)",
              "G6", "positions length, scalar kernel_q_len, cu_seqlens_q"),
    Invariant("I4", E, "cu_seqlens_k == [0, cumsum(cache_seqlens)]", "§7 values", "cu_seqlens_k, cache_seqlens"),
    Invariant("I5", E, "cache_seqlens follows its mode's formula (decode S+1, draft step i S+i+1, verify S+T, "
              "draft extend S+T, extend prefix+extend)", "§3.2", "cache_seqlens, request seq_len_before/after, T"),
    Invariant("I6", E, "target verify: the q_len_per_req the kernel runs with == T, the tokens per request",
              "PR #27495 (G4)", "scalars kernel_q_len, max_seq_len_q; T"),
    Invariant("I7", W, "target verify: cu_seqlens_q has stride T (the graph buffer keeps stride K)", "§6.2",
              "cu_seqlens_q, T"),
    Invariant("I8", E, "draft extend: cu_seqlens_q == arange(0, (bs+1)T, T) and max_seq_len_q == T", "G5, G6",
              "cu_seqlens_q, scalar kernel_q_len, T"),
    Invariant("I9", E, "max_seq_len_k >= max(cache_seqlens) of the live rows", "§6.3",
              "scalar max_seq_len_k, cache_seqlens"),
    Invariant("I10", E, "page_table[b, j] == req_to_token[rpi[b], j*P] // P for every page a live row reads",
              "G3", f"{_MD}, req_to_token_page_starts"),
    Invariant("I11", E, "req_to_token page starts are page-aligned slots", "§7 page contiguity",
              "req_to_token_page_starts, cache_seqlens"),
    Invariant("I12", E, "out_cache_loc of each query token == the slot of its position (KV written where read)",
              "§3.3", f"out_cache_loc, {_MD}"),
    Invariant("I13", E, "positions of row b == cache_seqlens[b] - q_b + t (bottom-right causal alignment)",
              "§3.3", "positions, cache_seqlens, request num_q_tokens"),
    Invariant("I14", E, "bounds: cache_seqlens <= max_context_len, page ids < pages in the KV pool", "§7 bounds",
              f"{_MD}, scalars max_context_len, num_kv_pages"),
    Invariant("I15", E, "replay passes the kernels the same metadata addresses the graph captured", "G2, G3",
              "data_ptr of cache_seqlens, cu_seqlens_q/k, page_table at capture and replay"),
    Invariant("I16", E, "replay's max_seq_len_q == the value frozen at capture", "G4, G5",
              "scalar max_seq_len_q at replay, captured_max_seq_len_q / max_seq_len_q at capture"),
    Invariant("I17", E, "capture: every row has cache_seqlens > 0 and points at reserved page 0", "PR #26521 (G1)",
              "cache_seqlens, page_table of capture steps"),
    Invariant("I18", E, "padded rows: seq_lens == fill value, slot 0, KV slot 0, cache_seqlens == the mode "
              "formula over the fill value, and every page they read is page 0", "§6.1",
              "seq_lens, req_pool_indices, out_cache_loc, cache_seqlens, page_table of rows [bs, padded bs); "
              "scalar seq_len_fill_value"),
    Invariant("I19", E, "replay: no page-table cell the kernels read is left over from an earlier batch (it "
              "differs from req_to_token and still holds what the graph's buffer held before)", "G3",
              "page_table and its data_ptr over capture/replay steps, req_to_token_page_starts, cache_seqlens"),
    Invariant("I21", E, "plan-stream metadata work starts after the producers of seq_lens and req_to_token end, "
              "and a wait edge orders it after them", "PR #28034 (G10)",
              "spans producers / metadata (stream, start_ns, end_ns), wait edges"),
    Invariant("I22", E, "a verify / draft-extend launch starts after the plan-stream metadata it consumes ends, "
              "and a wait edge orders it after that work", "§5.1",
              "spans metadata / forward (stream, start_ns, end_ns), wait edges"),
    Invariant("I28", E, "update_verify_buffers_to_fill_after_draft did not raise (plan stream on)",
              "PR #25925 (G9)", "call errors of that hook"),
    Invariant("K1", E, "every call made for the step succeeded (kernel argument checks, kernel launches, "
              "CUDA errors)", "G11, §8 preconditions", "call errors (call, type, message, fatal)"),
    Invariant("I29", E, "no physical page is owned by two live requests of one step (page 0, the reserved "
              "padding page, excluded)", "allocator / radix-cache bugs", "req_to_token_page_starts, cache_seqlens"),
    Invariant("I30", E, "no KV write slot (out_cache_loc) lies in a page another live request owns", "§3.3",
              "out_cache_loc, req_to_token_page_starts, cache_seqlens"),
    Invariant("I31", E, "acceptance: 1 <= accept length <= T, seq_len_after == before + accept length, accepted "
              "tokens == a prefix of the drafts + one token (greedy: that token is not the next draft)",
              "§4.2 accept", "request draft_tokens, accepted_tokens, accept_length, seq_len_before/after; "
              "run config temperature"),
    Invariant("I32", E, "a request's seq_len_before in a later iteration == the length its last verify (decode, "
              "extend) committed", "§4.3 commit", "request seq_len_before/after across steps, iteration"),
    Invariant("I33", E, "context kernels: cu_seqlens_q[0] == 0 and every boundary cu_seqlens_q[b+1] - "
              "cu_seqlens_q[b] == row b's query tokens", "G6", "cu_seqlens_q, request num_q_tokens"),
    Invariant("I34", E, "the host mirror seq_lens_cpu == the device seq_lens the kernels' metadata came from",
              "§7 I9 (stale CPU mirror)", "seq_lens_cpu, seq_lens"),
    Invariant("I35", W, "acceptance collapse: a stretch of verifies where every row accepts only the bonus token, "
              "or every draft token is the same token", "§6.4 symptoms",
              "request accept_length, draft_tokens over consecutive verify steps"),
    Invariant("D1", E, "sampled attention: kernel output == float64 attention over the metadata it consumed",
              "differential (--record-attention)", f"attn_q, attn_out, attn_kv, attn_page_ids, {_MD}"),
    Invariant("D2", E, "sampled attention: output == attention over the request's own KV (req_to_token, positions)",
              "differential (--record-attention)", "attn_q, attn_out, attn_kv, req_to_token_page_starts, positions"),
)
BY_ID = {i.check_id: i for i in CATALOGUE}

COLLAPSE_VERIFIES = 16  # I35: consecutive verify steps that make a stretch

_UNIFORM = (ForwardMode.DECODE, ForwardMode.DRAFT_DECODE, ForwardMode.TARGET_VERIFY)
_CONTEXT = (ForwardMode.EXTEND, ForwardMode.DRAFT_EXTEND)
_PTR_NAMES = ("cache_seqlens", "cu_seqlens_q", "cu_seqlens_k", "page_table")
_ROW_ARRAYS = ("cache_seqlens", "page_table", "seq_lens", "seq_lens_cpu", "req_pool_indices",
               "req_to_token_page_starts")
HOOK = "update_verify_buffers_to_fill_after_draft"


def _short(x: object) -> str:
    if isinstance(x, np.ndarray):
        x = x.tolist()
    if isinstance(x, list) and len(x) > 8:
        return "[" + ", ".join(map(str, x[:8])) + ", ...]"
    return str(x)


class _Ctx:
    """Per-step view with helpers to emit violations."""

    def __init__(self, step: Step) -> None:
        self.step = step
        self.out: list[Violation] = []
        self.a = {a.name: a for a in step.arrays}

    def v(self, check_id: str, msg: str, request_id: int | None = None, *, array: str | None = None,
          row: int | None = None, col: int | None = None, found: object = None, expected: object = None) -> None:
        s = self.step
        where = f"step {s.index} ({s.model} {s.mode.value}"
        where += f" #{s.step_id}" if s.step_id is not None else ""
        where += f", {s.graph.value}, bs {s.batch_size}/{s.padded_batch_size})"
        who = f" request {request_id}" if request_id is not None else ""
        self.out.append(Violation(
            check_id, BY_ID[check_id].severity, s.index, f"{where}{who}: {msg}", request_id, array=array, row=row,
            col=col, found=None if found is None else _short(found),
            expected=None if expected is None else _short(expected)))

    def arr(self, name: str) -> np.ndarray | None:
        a = self.a.get(name)
        return None if a is None else a.values


def _formula(step: Step, s: int, after: int) -> int:
    T, i = step.tokens_per_request, step.step_id or 0
    f: dict[ForwardMode, Callable[[int, int], int]] = {
        ForwardMode.DECODE: lambda s, after: s + 1,
        ForwardMode.DRAFT_DECODE: lambda s, after: s + i + 1,
        ForwardMode.TARGET_VERIFY: lambda s, after: s + T,
        ForwardMode.DRAFT_EXTEND: lambda s, after: s + T,
        ForwardMode.EXTEND: lambda s, after: after,
    }
    return f[step.mode](s, after)


def _padded_formula(step: Step, fill: int) -> int:
    """cache_seqlens of a padded row: its seq_lens is the fill value (S for draft decode / verify, the full length
    for decode / draft extend, which already count this forward's tokens)."""
    T, i = step.tokens_per_request, step.step_id or 0
    return {ForwardMode.DRAFT_DECODE: fill + i + 1, ForwardMode.TARGET_VERIFY: fill + T}.get(step.mode, fill)


def _q_lens(step: Step) -> list[int]:
    if step.mode in _UNIFORM:
        return [step.tokens_per_request] * step.batch_size
    return [r.num_q_tokens for r in step.requests]


# ---- shapes -------------------------------------------------------------------------------------------------

def _check_shapes(c: _Ctx) -> bool:
    """I1 and I2; returns False when rows disagree, so the row-wise checks are skipped for this step."""
    s = c.step
    for name in _PTR_NAMES:
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
    if pos is not None and ok and sum(_q_lens(s)) > pos.shape[0]:
        c.v("I2", f"the live rows have {sum(_q_lens(s))} query tokens but {pos.shape[0]} positions were recorded",
            array="positions", found=pos.shape[0], expected=sum(_q_lens(s)))
        ok = False
    return ok


def _check_query_tokens(c: _Ctx) -> None:
    s, pos = c.step, c.arr("positions")
    if pos is None:
        return
    n = pos.shape[0]
    if s.mode in _UNIFORM:
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


# ---- values -------------------------------------------------------------------------------------------------

def _check_values(c: _Ctx) -> None:
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
                array="cu_seqlens_k", col=j, found=int(cuk[j]), expected=int(want[j]))
    for b, r in enumerate(s.requests):
        e = _formula(s, r.seq_len_before, r.seq_len_after)
        if int(cs[b]) != e:
            c.v("I5", f"cache_seqlens = {int(cs[b])}, {s.mode.value} formula gives {e} "
                      f"(S = {r.seq_len_before}, T = {s.tokens_per_request})", r.request_id,
                array="cache_seqlens", row=b, found=int(cs[b]), expected=e)
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


def _check_verify_and_extend(c: _Ctx) -> None:
    s, T = c.step, c.step.tokens_per_request
    cuq = c.arr("cu_seqlens_q")
    if s.mode == ForwardMode.TARGET_VERIFY:
        q, mq = s.scalars.get("kernel_q_len"), s.scalars.get("max_seq_len_q")
        if q is not None and q != T:
            c.v("I6", f"kernel q_len_per_req = {q} but T = {T} tokens per request (backend K = "
                      f"{s.scalars.get('backend_num_draft_tokens')}): tokens regrouped, causal window off by {q - T}",
                array="kernel_q_len", found=q, expected=T)
        elif mq is not None and mq != T:
            c.v("I6", f"max_seq_len_q = {mq} but T = {T}", array="max_seq_len_q", found=mq, expected=T)
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
            c.v("I8", f"cu_seqlens_q[:bs+1] = {_short(got)}, expected stride {T}: {_short(want)}",
                array="cu_seqlens_q", col=j, found=got, expected=want)
        mq = s.scalars.get("kernel_q_len")
        if mq is not None and mq != T:
            c.v("I8", f"max_seq_len_q = {mq}, expected T = {T}", array="kernel_q_len", found=mq, expected=T)


def _check_context_boundaries(c: _Ctx) -> None:
    """I33: every boundary of cu_seqlens_q for the context kernel, not only the last."""
    s, cuq = c.step, c.arr("cu_seqlens_q")
    if s.mode not in _CONTEXT or cuq is None or not cuq.size:
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


def _check_mirror(c: _Ctx) -> None:
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
            array="seq_lens_cpu", row=b, found=int(host[b]), expected=int(dev[b]))


# ---- pages and tokens ---------------------------------------------------------------------------------------

def _reads(c: _Ctx, b: int) -> int:
    """Logical pages live row b reads (its cache_seqlens), clipped to the recorded columns."""
    cs, pt = c.arr("cache_seqlens"), c.arr("page_table")
    if cs is None:
        # Reported as I2 by `_guard`: the TypeError (and message) indexing the missing array would raise.
        raise TypeError("'NoneType' object is not subscriptable")
    assert pt is not None, "callers check the page table is recorded"
    return min(max(-(-int(cs[b]) // c.step.page_size), 0), pt.shape[1])


def _check_pages(c: _Ctx) -> None:
    s, p = c.step, c.step.page_size
    cs, pt, starts = c.arr("cache_seqlens"), c.arr("page_table"), c.arr("req_to_token_page_starts")
    if cs is None or pt is None or starts is None:
        return
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
                found=int(pt[b, j]), expected=int(want[j]))
        unaligned = np.nonzero(starts[b, :n] % p)[0]
        if unaligned.size:
            j = int(unaligned[0])
            c.v("I11", f"req_to_token[slot, {j * p}] = {int(starts[b, j])} is not page-aligned (P = {p})",
                r.request_id, array="req_to_token_page_starts", row=b, col=j, found=int(starts[b, j]),
                expected=f"a multiple of {p}")


def _owned(c: _Ctx, starts: np.ndarray) -> list[set[int]]:
    """Per live row, the physical pages its req_to_token row maps the positions it reads to (page 0 excluded)."""
    p = c.step.page_size
    out = []
    for b in range(c.step.batch_size):
        pages = {int(x) for x in starts[b, : _reads(c, b)] // p}
        pages.discard(0)
        out.append(pages)
    return out


def _check_ownership(c: _Ctx) -> None:
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
                    expected=f"a page no other live row owns (row {a} owns {pg})")
                break
    loc = c.arr("out_cache_loc")
    if loc is None:
        return
    start = 0
    for b, n in enumerate(_q_lens(s)):
        for t in range(n):
            if start + t >= loc.shape[0]:
                break
            pg = int(loc[start + t]) // p
            other = next((a for a, pages in enumerate(owned) if a != b and pg in pages), None)
            if other is not None:
                c.v("I30", f"query token {t} writes KV slot {int(loc[start + t])}, in page {pg} that request "
                           f"{s.requests[other].request_id} (row {other}) owns: it overwrites that request's KV",
                    s.requests[b].request_id, array="out_cache_loc", row=b, col=t, found=int(loc[start + t]),
                    expected=f"a slot outside page {pg}")
                break
        start += n


def _check_tokens(c: _Ctx) -> None:
    s, p = c.step, c.step.page_size
    cs, pt, pos, loc = c.arr("cache_seqlens"), c.arr("page_table"), c.arr("positions"), c.arr("out_cache_loc")
    if cs is None or pt is None or pos is None or loc is None:
        return
    start = 0
    for b, (r, n) in enumerate(zip(s.requests, _q_lens(s), strict=False)):
        want_pos = np.arange(int(cs[b]) - n, int(cs[b]))
        got_pos = pos[start:start + n].astype(np.int64)
        if got_pos.shape == want_pos.shape and not np.array_equal(got_pos, want_pos):
            t = int(np.nonzero(got_pos != want_pos)[0][0])
            c.v("I13", f"positions {_short(got_pos)} but cache_seqlens {int(cs[b])} - q {n} + t gives "
                       f"{_short(want_pos)}", r.request_id, array="positions", row=b, col=t, found=int(got_pos[t]),
                expected=int(want_pos[t]))
        pages = want_pos // p
        if want_pos.size and pages.max() < pt.shape[1] and want_pos.min() >= 0:
            want_loc = pt[b, pages].astype(np.int64) * p + want_pos % p
            got = loc[start:start + n].astype(np.int64)
            if got.shape == want_loc.shape and not np.array_equal(got, want_loc):
                t = int(np.nonzero(got != want_loc)[0][0])
                c.v("I12", f"query token {t} writes KV slot {int(got[t])} but the kernel reads position "
                           f"{int(want_pos[t])} from slot {int(want_loc[t])}", r.request_id, array="out_cache_loc",
                    row=b, col=t, found=int(got[t]), expected=int(want_loc[t]))
        start += n


def _check_padding(c: _Ctx) -> None:
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
                found=int(vals[b]), expected=want)

    first("seq_lens", seq, fill, "the fill value is")
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
        t = s.tokens_per_request if s.mode in _UNIFORM or s.mode == ForwardMode.DRAFT_EXTEND else 1
        bad = np.nonzero(loc[lo * t: hi * t] != 0)[0]
        if bad.size:
            k = lo * t + int(bad[0])
            c.v("I18", f"padded row {k // t} writes KV slot {int(loc[k])}, outside the reserved slot 0",
                array="out_cache_loc", row=k // t, col=k % t, found=int(loc[k]), expected=0)


def _check_capture(c: _Ctx) -> None:
    cs = c.arr("cache_seqlens")
    if cs is not None and cs.size and int(cs.min()) <= 0:
        b = int(np.argmin(cs))
        c.v("I17", f"captured with cache_seqlens {_short(cs)}: rows with 0 KV give NaN (softmax over nothing)",
            array="cache_seqlens", row=b, found=int(cs[b]), expected="> 0")
    pt = c.arr("page_table")
    if pt is not None and pt.size and pt.shape[1] and np.any(pt[:, :1] != 0):
        b = int(np.nonzero(pt[:, 0] != 0)[0][0])
        c.v("I17", "capture rows must point at reserved page 0", array="page_table", row=b, col=0,
            found=int(pt[b, 0]), expected=0)


# ---- streams and calls --------------------------------------------------------------------------------------

def _us(ns: int) -> str:
    return f"{ns / 1000:.1f} us"


def _ordering(c: _Ctx, check_id: str, later: StreamSpan, earlier: StreamSpan, what: str, waits_recorded: bool) -> None:
    """`later` must start after `earlier` ends and be ordered after it by a recorded wait edge (when the trace
    records wait edges at all: schema 1 did not)."""
    if later.stream == earlier.stream:
        return  # one stream runs in order
    edge = not waits_recorded or any(
        (w.stream, w.on_stream, w.on_span) == (later.stream, earlier.stream, earlier.name) for w in c.step.waits)
    early = later.start_ns < earlier.end_ns
    if not early and edge:
        return
    gap = f"{later.stream} '{later.name}' started {_us(earlier.end_ns - later.start_ns)} before {earlier.stream} " \
          f"'{earlier.name}' ended" if early else f"{later.stream} '{later.name}' started after {earlier.stream} " \
          f"'{earlier.name}' ended only by chance"
    why = "no wait edge orders it after them" if not edge else "although a wait edge was recorded"
    c.v(check_id, f"{what}: {gap}; {why}", array=f"span:{later.stream}:{later.name}",
        found=later.start_ns, expected=f">= {earlier.end_ns} with a wait on {earlier.stream} '{earlier.name}'")


def _check_streams(c: _Ctx, waits_recorded: bool = True) -> None:
    spans = c.step.spans
    prods = [sp for sp in spans if sp.name == "producers"]
    metas = [sp for sp in spans if sp.name == "metadata"]
    fwds = [sp for sp in spans if sp.name == "forward"]
    before = len(c.out)
    for m in metas:
        for p in prods:
            if len(c.out) == before:
                _ordering(c, "I21", m, p, "metadata work is not ordered after the producers of seq_lens and "
                                          "req_to_token", waits_recorded)
    before = len(c.out)
    for f in fwds:
        for m in metas:
            if len(c.out) == before:
                _ordering(c, "I22", f, m, "the launch is not ordered after the metadata it consumes", waits_recorded)


def _check_errors(c: _Ctx) -> None:
    for e in c.step.errors:
        text = f"{e.call} raised {e.error_type}: {e.message}"
        if e.call == HOOK:
            c.v("I28", f"{text} (the backend lacks the plan-stream fix-up hook)", array=f"call:{e.call}",
                found=e.error_type, expected="no error")
        else:
            end = " (fatal: the device context is gone and the run ended here)" if e.fatal else ""
            c.v("K1", text + end, array=f"call:{e.call}", found=e.error_type, expected="no error")


# ---- state across steps -------------------------------------------------------------------------------------

class _GraphState:
    """What each capture froze, keyed by (model, mode, step_id, bs)."""

    def __init__(self) -> None:
        self.captured: dict[tuple[str, str, int | None, int], Step] = {}

    def check(self, c: _Ctx) -> None:
        s = c.step
        key = (s.model, s.mode.value, s.step_id, s.padded_batch_size)
        if s.graph == GraphPhase.CAPTURE:
            self.captured[key] = s
            return
        if s.graph != GraphPhase.REPLAY:
            return
        cap = self.captured.get(key)
        if cap is None:
            return
        capa = {a.name: a for a in cap.arrays}
        for name in _PTR_NAMES:
            a, b = c.a.get(name), capa.get(name)
            if a is not None and b is not None and a.data_ptr != b.data_ptr:
                c.v("I15", f"{name} at 0x{a.data_ptr:x}, but the graph captured 0x{b.data_ptr:x} "
                           f"(step {cap.index}): the kernels read the captured address", array=name,
                    found=f"0x{a.data_ptr:x}", expected=f"0x{b.data_ptr:x}")
        frozen = cap.scalars.get("captured_max_seq_len_q", cap.scalars.get("max_seq_len_q"))
        now = s.scalars.get("max_seq_len_q")
        if frozen is not None and now is not None and now != frozen:
            c.v("I16", f"max_seq_len_q = {now} at replay prep, the graph froze {frozen} at capture",
                array="max_seq_len_q", found=now, expected=frozen)


class _PageBuffers:
    """I19: the last recorded contents of each graph page-table buffer, keyed by (model, data_ptr)."""

    def __init__(self) -> None:
        self.held: dict[tuple[str, int], tuple[np.ndarray, int]] = {}  # values (-1 unknown), step they are from

    def check(self, c: _Ctx, row_checks: bool) -> None:
        s, pt_a = c.step, c.a.get("page_table")
        if s.graph not in (GraphPhase.CAPTURE, GraphPhase.REPLAY) or pt_a is None or pt_a.values.ndim != 2:
            return
        key, pt = (s.model, pt_a.data_ptr), pt_a.values.astype(np.int64)
        prev = self.held.get(key)
        starts = c.arr("req_to_token_page_starts")
        if prev is not None and row_checks and s.graph == GraphPhase.REPLAY and starts is not None:
            held, since = prev
            for b, r in enumerate(s.requests):
                n = min(_reads(c, b), held.shape[1] if b < held.shape[0] else 0)
                if not n:
                    continue
                want = starts[b, :n] // s.page_size
                stale = np.nonzero((pt[b, :n] != want) & (held[b, :n] == pt[b, :n]))[0]
                if stale.size:
                    j = int(stale[0])
                    c.v("I19", f"page_table[{b}, {j}] = {int(pt[b, j])} is what the graph's buffer held at step "
                               f"{since}, but req_to_token gives page {int(want[j])} ({stale.size} stale cells in "
                               "this row): replay prep did not refresh it", r.request_id, array="page_table", row=b,
                        col=j, found=int(pt[b, j]), expected=int(want[j]))
        rows = max(pt.shape[0], prev[0].shape[0] if prev else 0)
        cols = max(pt.shape[1], prev[0].shape[1] if prev else 0)
        new = np.full((rows, cols), -1, dtype=np.int64)
        if prev is not None:
            new[: prev[0].shape[0], : prev[0].shape[1]] = prev[0]
        new[: pt.shape[0], : pt.shape[1]] = pt
        self.held[key] = (new, s.index)


class _Acceptance:
    """I31 per verify row, I32 across iterations, I35 over stretches of verifies."""

    def __init__(self, greedy: bool | None) -> None:
        self.greedy = greedy
        self.committed: dict[int, tuple[int, int, int]] = {}  # request id -> (iteration, seq_len, step)
        self.stretch_bonus: list[int] = []  # consecutive verify steps where every row accepted only the bonus
        self.stretch_token: list[int] = []  # ... where every draft token was one token
        self.token: int | None = None

    def gap(self) -> None:
        """Steps are missing before the next one: forget what needs the step before it."""
        self.committed.clear()
        self.stretch_bonus, self.stretch_token, self.token = [], [], None

    def check(self, c: _Ctx) -> None:
        s = c.step
        if s.iteration < 0:
            return
        for b, r in enumerate(s.requests):
            last = self.committed.get(r.request_id)
            if last is not None and s.iteration > last[0] and r.seq_len_before != last[1]:
                c.v("I32", f"seq_len_before = {r.seq_len_before}, but step {last[2]} (iteration {last[0]}) committed "
                           f"{last[1]}", r.request_id, array="seq_len_before", row=b, found=r.seq_len_before,
                    expected=last[1])
        # A recorder that could not see acceptance (SGLang's backend never learns it) says so; there is then no
        # recorded value to judge, which is not the same as a recorded accept length of 0.
        if s.mode == ForwardMode.TARGET_VERIFY and s.scalars.get("acceptance_recorded", 1) != 0:
            for b, r in enumerate(s.requests):
                self._row(c, b, r)
            self._collapse(c)
        if s.mode in (ForwardMode.TARGET_VERIFY, ForwardMode.DECODE, ForwardMode.EXTEND):
            for r in s.requests:
                self.committed[r.request_id] = (s.iteration, r.seq_len_after, s.index)

    def _row(self, c: _Ctx, b: int, r: RequestState) -> None:
        T, n = c.step.tokens_per_request, r.accept_length
        rid = r.request_id
        if not 1 <= n <= T:
            c.v("I31", f"accept length {n} outside 1..T = {T}", rid, array="accept_length", row=b, found=n,
                expected=f"1..{T}")
            return
        if r.seq_len_after != r.seq_len_before + n:
            c.v("I31", f"seq_len_after = {r.seq_len_after} but seq_len_before {r.seq_len_before} + accept length "
                       f"{n} = {r.seq_len_before + n}", rid, array="seq_len_after", row=b,
                found=r.seq_len_after, expected=r.seq_len_before + n)
            return
        acc, drafts = list(r.accepted_tokens), list(r.draft_tokens)
        if not acc:
            return  # a recorder that keeps lengths only
        if len(acc) != n:
            c.v("I31", f"{len(acc)} accepted tokens recorded for accept length {n}", rid, array="accepted_tokens",
                row=b, found=len(acc), expected=n)
            return
        if drafts and acc[:-1] != drafts[: n - 1]:
            t = next(i for i, (x, y) in enumerate(zip(acc[:-1], drafts, strict=False)) if x != y) \
                if any(x != y for x, y in zip(acc[:-1], drafts, strict=False)) else len(drafts)
            c.v("I31", f"accepted tokens {_short(acc)} are not the drafts {_short(drafts)} up to the last one",
                rid, array="accepted_tokens", row=b, col=t, found=acc[t] if t < len(acc) else None,
                expected=drafts[t] if t < len(drafts) else None)
            return
        if self.greedy and drafts and n - 1 < len(drafts) and acc[-1] == drafts[n - 1]:
            c.v("I31", f"greedy acceptance stopped at draft {n - 1} although the target's token {acc[-1]} equals it",
                rid, array="accepted_tokens", row=b, col=n - 1, found=acc[-1], expected=f"!= {drafts[n - 1]}")

    def _collapse(self, c: _Ctx) -> None:
        s = c.step
        if not s.requests or s.tokens_per_request < 2:
            return
        if all(r.accept_length == 1 for r in s.requests):
            self.stretch_bonus.append(s.index)
        else:
            self.stretch_bonus = []
        toks = {t for r in s.requests for t in r.draft_tokens}
        if len(toks) == 1 and (self.token is None or toks == {self.token}):
            self.token = next(iter(toks))
            self.stretch_token.append(s.index)
        else:
            self.token = next(iter(toks)) if len(toks) == 1 else None
            self.stretch_token = [s.index] if self.token is not None else []
        if len(self.stretch_bonus) == COLLAPSE_VERIFIES:
            c.v("I35", f"{COLLAPSE_VERIFIES} verifies in a row (steps {self.stretch_bonus[0]}..{s.index}) where every "
                       "row accepted only the bonus token: the draft is useless or the verify attends wrongly",
                array="accept_length", found=1, expected="> 1 somewhere")
        if len(self.stretch_token) == COLLAPSE_VERIFIES:
            c.v("I35", f"{COLLAPSE_VERIFIES} verifies in a row (steps {self.stretch_token[0]}..{s.index}) where every "
                       f"draft token is token {self.token}: the draft collapsed", array="draft_tokens",
                found=self.token, expected="varied drafts")


class Checker:
    """The streaming checker: feed steps in index order; it keeps the state between them (capture/replay,
    page-table buffers, committed lengths, acceptance stretches).

    A live viewer (or the checker process beside a run's writer) calls `feed` as each step is committed and
    can break on the violations it returns; `check_steps` is a loop over it. Pass the trace's `run` so the
    greedy-only part of I31 knows the sampling temperature (without it that part is skipped). A schema-1 trace
    records no wait edges: `Checker.for_trace(reader)` passes both, and I21/I22 then judge timestamps only.
    """

    def __init__(self, run: RunInfo | None = None, *, waits_recorded: bool = True) -> None:
        temp = None if run is None else run.config.get("temperature")
        self._waits_recorded = waits_recorded
        self._graphs = _GraphState()
        self._pages = _PageBuffers()
        self._accept = _Acceptance(None if temp is None else float(temp) <= 0)
        self._last: int | None = None  # index of the step fed last

    @classmethod
    def for_trace(cls, reader: TraceReader) -> Checker:
        """A checker for the steps of `reader`'s trace: its run settings and whether it recorded wait edges."""
        return cls(reader.run, waits_recorded=reader.waits_recorded())

    def feed(self, step: Step) -> list[Violation]:
        """Every violation of `step` (a step whose arrays cannot be checked is an I2 violation, never a crash).

        Steps whose indexes skip (a bundle keeps the original run's numbers, with the captures it adds before its
        range) leave a gap: what the steps in it committed is unknown, so the relations between consecutive steps
        (I32's committed lengths, I35's stretches) start afresh after it. Captures stay (I15 / I16 compare a replay
        with its capture wherever it is), and so do the graph buffers (I19 fires only on a page the step's own
        req_to_token contradicts)."""
        if self._last is not None and step.index > self._last + 1:
            self._accept.gap()
        self._last = step.index
        c = _Ctx(step)
        rows_ok = True
        if step.arrays:
            rows_ok = _guard(c, _check_shapes, default=False)
            _guard(c, _check_query_tokens)
            if rows_ok:
                for f in (_check_values, _check_verify_and_extend, _check_context_boundaries, _check_mirror,
                          _check_pages, _check_ownership, _check_tokens, _check_padding):
                    _guard(c, f)
                if step.graph == GraphPhase.CAPTURE:
                    _guard(c, _check_capture)
            _guard(c, self._graphs.check)
            _guard(c, lambda c: self._pages.check(c, rows_ok))
            if rows_ok and step.array("attn_q") is not None:
                _guard(c, lambda c: c.out.extend(differential_check([step])))
        _guard(c, lambda c: _check_streams(c, self._waits_recorded))
        _guard(c, _check_errors)
        _guard(c, self._accept.check)
        return c.out


_T = TypeVar("_T")


@overload
def _guard(c: _Ctx, f: Callable[[_Ctx], _T], default: _T) -> _T: ...
@overload
def _guard(c: _Ctx, f: Callable[[_Ctx], None]) -> None: ...
def _guard(c: _Ctx, f: Callable[[_Ctx], Any], default: Any = None) -> Any:
    """Run one check; arrays too inconsistent for it are reported as I2 instead of crashing the checker."""
    try:
        return f(c)
    except (IndexError, ValueError, KeyError, TypeError) as e:
        name = getattr(f, "__name__", "a check").lstrip("_")
        c.v("I2", f"the recorded arrays are inconsistent; {name} could not run ({type(e).__name__}: {e})")
        return default


def check_steps(steps: Iterable[Step], run: RunInfo | None = None, *,
                waits_recorded: bool = True) -> Iterator[Violation]:
    """Every violation, in step order (a loop over `Checker.feed`)."""
    checker = Checker(run, waits_recorded=waits_recorded)
    for step in steps:
        yield from checker.feed(step)
