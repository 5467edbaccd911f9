"""The invariant catalogue (`reference/sglang-trtllm-mha.md` §7) checked over recorded steps. Torch-free.

Each invariant has an id, a severity and a one-line description; a violation names the step, the request
and the values that disagree. `check_steps` walks steps in order because some invariants compare a replay
with its capture.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from .differential import differential_check
from .schema import ForwardMode, GraphPhase, Severity, Step, Violation

E, W = Severity.ERROR, Severity.WARNING


@dataclass(frozen=True)
class Invariant:
    """One catalogue entry."""

    check_id: str
    severity: Severity
    description: str
    upstream: str  # the bug or rule it comes from


CATALOGUE: tuple[Invariant, ...] = (
    Invariant("I1", E, "metadata tensors are int32; cache_seqlens 1-D, page_table 2-D", "§7 shapes"),
    Invariant("I2", E, "rows agree: len(cache_seqlens) == page_table rows == len(cu_seqlens_k)-1 == padded bs",
              "§7 shapes"),
    Invariant("I3", E, "query tokens == rows x q_len_per_req (uniform q) or cu_seqlens_q[-1] (context kernel)",
              "G6"),
    Invariant("I4", E, "cu_seqlens_k == [0, cumsum(cache_seqlens)]", "§7 values"),
    Invariant("I5", E, "cache_seqlens follows its mode's formula (decode S+1, draft step i S+i+1, verify S+T, "
              "draft extend S+T, extend prefix+extend)", "§3.2"),
    Invariant("I6", E, "target verify: the q_len_per_req the kernel runs with == T, the tokens per request",
              "PR #27495 (G4)"),
    Invariant("I7", W, "target verify: cu_seqlens_q has stride T (the graph buffer keeps stride K)", "§6.2"),
    Invariant("I8", E, "draft extend: cu_seqlens_q == arange(0, (bs+1)T, T) and max_seq_len_q == T", "G5, G6"),
    Invariant("I9", E, "max_seq_len_k >= max(cache_seqlens) of the live rows", "§6.3"),
    Invariant("I10", E, "page_table[b, j] == req_to_token[rpi[b], j*P] // P for every page a live row reads",
              "G3"),
    Invariant("I11", E, "req_to_token page starts are page-aligned slots", "§7 page contiguity"),
    Invariant("I12", E, "out_cache_loc of each query token == the slot of its position (KV written where read)",
              "§3.3"),
    Invariant("I13", E, "positions of row b == cache_seqlens[b] - q_b + t (bottom-right causal alignment)",
              "§3.3"),
    Invariant("I14", E, "bounds: cache_seqlens <= max_context_len, page ids < pages in the KV pool", "§7 bounds"),
    Invariant("I15", E, "replay passes the kernels the same metadata addresses the graph captured", "G2, G3"),
    Invariant("I16", E, "replay's max_seq_len_q == the value frozen at capture", "G4, G5"),
    Invariant("I17", E, "capture: every row has cache_seqlens > 0 and padded rows point at page 0", "PR #26521 (G1)"),
    Invariant("I18", E, "padded rows: seq_lens == fill value, slot 0, KV slot 0, and they stay inside page 0",
              "§6.1"),
    Invariant("I19", E, "replay prep refreshed every page-table column the kernels will read this step", "G3"),
    Invariant("I21", E, "plan-stream metadata is ordered after the producers of seq_lens and req_to_token",
              "PR #28034 (G10)"),
    Invariant("I22", E, "the compute stream waited on the plan stream before verify / draft extend", "§5.1"),
    Invariant("I28", E, "the backend implements update_verify_buffers_to_fill_after_draft (plan stream on)",
              "PR #25925 (G9)"),
    Invariant("K1", E, "the kernel accepted its arguments (argument checks before launch, kernel errors)",
              "G11, §8 preconditions"),
    Invariant("D1", E, "sampled attention: kernel output == float64 attention over the metadata it consumed",
              "differential (--record-attention)"),
    Invariant("D2", E, "sampled attention: output == attention over the request's own KV (req_to_token, positions)",
              "differential (--record-attention)"),
)
BY_ID = {i.check_id: i for i in CATALOGUE}

_UNIFORM = (ForwardMode.DECODE, ForwardMode.DRAFT_DECODE, ForwardMode.TARGET_VERIFY)
_PTR_NAMES = ("cache_seqlens", "cu_seqlens_q", "cu_seqlens_k", "page_table")


class _Ctx:
    """Per-step view with helpers to emit violations."""

    def __init__(self, step: Step) -> None:
        self.step = step
        self.out: list[Violation] = []
        self.a = {a.name: a for a in step.arrays}

    def v(self, check_id: str, msg: str, request_id: int | None = None) -> None:
        s = self.step
        where = f"step {s.index} ({s.model} {s.mode.value}"
        where += f" #{s.step_id}" if s.step_id is not None else ""
        where += f", {s.graph.value}, bs {s.batch_size}/{s.padded_batch_size})"
        who = f" request {request_id}" if request_id is not None else ""
        self.out.append(Violation(check_id, BY_ID[check_id].severity, s.index, f"{where}{who}: {msg}", request_id))

    def arr(self, name: str) -> np.ndarray | None:
        a = self.a.get(name)
        return None if a is None else a.values


def _expected_seqlens(step: Step) -> list[int] | None:
    T, i = step.tokens_per_request, step.step_id or 0
    f: dict[ForwardMode, Callable[[int, int], int]] = {
        ForwardMode.DECODE: lambda s, after: s + 1,
        ForwardMode.DRAFT_DECODE: lambda s, after: s + i + 1,
        ForwardMode.TARGET_VERIFY: lambda s, after: s + T,
        ForwardMode.DRAFT_EXTEND: lambda s, after: s + T,
        ForwardMode.EXTEND: lambda s, after: after,
    }
    return [f[step.mode](r.seq_len_before, r.seq_len_after) for r in step.requests]


def _check_shapes(c: _Ctx) -> None:
    s = c.step
    for name in _PTR_NAMES:
        a = c.a.get(name)
        if a is not None and a.dtype != "int32":
            c.v("I1", f"{name} is {a.dtype}, kernels need int32")
    cs, pt, cuk = c.a.get("cache_seqlens"), c.a.get("page_table"), c.a.get("cu_seqlens_k")
    if cs is not None and len(cs.shape) != 1:
        c.v("I1", f"cache_seqlens has shape {cs.shape}, expected 1-D")
    if pt is not None and len(pt.shape) != 2:
        c.v("I1", f"page_table has shape {pt.shape}, expected 2-D")
    if cs is None or pt is None or cuk is None:
        return
    rows = {"cache_seqlens": cs.shape[0], "page_table": pt.shape[0], "cu_seqlens_k-1": cuk.shape[0] - 1,
            "padded bs": s.padded_batch_size}
    if len(set(rows.values())) != 1:
        c.v("I2", "row counts disagree: " + ", ".join(f"{k}={v}" for k, v in rows.items()))


def _check_query_tokens(c: _Ctx) -> None:
    s, pos = c.step, c.arr("positions")
    if pos is None:
        return
    n = pos.shape[0]
    if s.mode in _UNIFORM:
        q = s.scalars.get("kernel_q_len", 1)
        if n != s.padded_batch_size * q:
            c.v("I3", f"{n} query tokens but rows x q_len_per_req = {s.padded_batch_size} x {q} = "
                      f"{s.padded_batch_size * q}: the kernel regroups tokens into the wrong requests")
    else:
        cuq = c.arr("cu_seqlens_q")
        if cuq is not None and (cuq.shape[0] != s.padded_batch_size + 1 or int(cuq[-1]) != n):
            c.v("I3", f"cu_seqlens_q has {cuq.shape[0]} entries ending at {int(cuq[-1])}; expected "
                      f"{s.padded_batch_size + 1} ending at {n} query tokens")


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
            c.v("I4", f"cu_seqlens_k[{j}] = {int(cuk[j])}, prefix sum of cache_seqlens gives {int(want[j])}")
    exp = _expected_seqlens(s)
    for b, (r, e) in enumerate(zip(s.requests, exp or [], strict=False)):
        if b < cs.shape[0] and int(cs[b]) != e:
            c.v("I5", f"cache_seqlens = {int(cs[b])}, {s.mode.value} formula gives {e} "
                      f"(S = {r.seq_len_before}, T = {s.tokens_per_request})", r.request_id)
    live = cs[: s.batch_size]
    mk = s.scalars.get("max_seq_len_k")
    if mk is not None and live.size and mk < int(live.max()):
        c.v("I9", f"max_seq_len_k = {mk} < max(cache_seqlens) = {int(live.max())}: page-table refresh too narrow")
    mctx, npages = s.scalars.get("max_context_len"), s.scalars.get("num_kv_pages")
    if mctx is not None and live.size and int(live.max()) > mctx:
        c.v("I14", f"cache_seqlens {int(live.max())} exceeds max_context_len {mctx}")
    pt = c.arr("page_table")
    if npages is not None and pt is not None and pt.size and (int(pt.max()) >= npages or int(pt.min()) < 0):
        c.v("I14", f"page id {int(pt.max())} outside the KV pool of {npages} pages")


def _check_verify_and_extend(c: _Ctx) -> None:
    s, T = c.step, c.step.tokens_per_request
    cuq = c.arr("cu_seqlens_q")
    if s.mode == ForwardMode.TARGET_VERIFY:
        q, mq = s.scalars.get("kernel_q_len"), s.scalars.get("max_seq_len_q")
        if q is not None and q != T:
            c.v("I6", f"kernel q_len_per_req = {q} but T = {T} tokens per request (backend K = "
                      f"{s.scalars.get('backend_num_draft_tokens')}): tokens regrouped, causal window off by {q - T}")
        elif mq is not None and mq != T:
            c.v("I6", f"max_seq_len_q = {mq} but T = {T}")
        if cuq is not None and s.batch_size and int(cuq[1]) != T:
            c.v("I7", f"cu_seqlens_q stride {int(cuq[1])} != T = {T} (not read by the decode kernel)")
    if s.mode == ForwardMode.DRAFT_EXTEND and cuq is not None:
        want = np.arange(0, (s.batch_size + 1) * T, T)
        got = cuq[: s.batch_size + 1].astype(np.int64)
        if got.shape != want.shape or not np.array_equal(got, want):
            c.v("I8", f"cu_seqlens_q[:bs+1] = {got.tolist()}, expected stride {T}: {want.tolist()}")
        mq = s.scalars.get("kernel_q_len")
        if mq is not None and mq != T:
            c.v("I8", f"max_seq_len_q = {mq}, expected T = {T}")


def _check_pages(c: _Ctx) -> None:
    s, p = c.step, c.step.page_size
    cs, pt, starts = c.arr("cache_seqlens"), c.arr("page_table"), c.arr("req_to_token_page_starts")
    if cs is None or pt is None or starts is None:
        return
    for b, r in enumerate(s.requests):
        n = -(-int(cs[b]) // p)
        if n > pt.shape[1]:
            c.v("I10", f"reads {n} pages but only {pt.shape[1]} page-table columns were recorded as live",
                r.request_id)
            continue
        want = starts[b, :n] // p
        bad = np.nonzero(pt[b, :n] != want)[0]
        if bad.size:
            j = int(bad[0])
            c.v("I10", f"page_table[{b}, {j}] = {int(pt[b, j])} but req_to_token gives page {int(want[j])} "
                       f"({bad.size} of {n} pages differ)", r.request_id)
        unaligned = np.nonzero(starts[b, :n] % p)[0]
        if unaligned.size:
            j = int(unaligned[0])
            c.v("I11", f"req_to_token[slot, {j * p}] = {int(starts[b, j])} is not page-aligned (P = {p})",
                r.request_id)


def _check_tokens(c: _Ctx) -> None:
    s, p = c.step, c.step.page_size
    cs, pt, pos, loc = c.arr("cache_seqlens"), c.arr("page_table"), c.arr("positions"), c.arr("out_cache_loc")
    if cs is None or pt is None or pos is None or loc is None:
        return
    if s.mode in _UNIFORM:
        q = [s.tokens_per_request] * s.batch_size
    else:
        q = [r.num_q_tokens for r in s.requests]
    start = 0
    for b, r in enumerate(s.requests):
        n = q[b]
        want_pos = np.arange(int(cs[b]) - n, int(cs[b]))
        got_pos = pos[start:start + n].astype(np.int64)
        if got_pos.shape == want_pos.shape and not np.array_equal(got_pos, want_pos):
            c.v("I13", f"positions {got_pos.tolist()[:8]} but cache_seqlens {int(cs[b])} - q {n} + t gives "
                       f"{want_pos.tolist()[:8]}", r.request_id)
        pages = want_pos // p
        if want_pos.size and pages.max() < pt.shape[1] and want_pos.min() >= 0:
            want_loc = pt[b, pages].astype(np.int64) * p + want_pos % p
            got = loc[start:start + n].astype(np.int64)
            if got.shape == want_loc.shape and not np.array_equal(got, want_loc):
                t = int(np.nonzero(got != want_loc)[0][0])
                c.v("I12", f"query token {t} writes KV slot {int(got[t])} but the kernel reads position "
                           f"{int(want_pos[t])} from slot {int(want_loc[t])}", r.request_id)
        start += n


def _check_padding(c: _Ctx) -> None:
    s = c.step
    if s.padded_batch_size <= s.batch_size:
        return
    fill = s.scalars.get("seq_len_fill_value", 1)
    pad = slice(s.batch_size, s.padded_batch_size)
    seq, rpi, cs = c.arr("seq_lens"), c.arr("req_pool_indices"), c.arr("cache_seqlens")
    if seq is not None and np.any(seq[pad] != fill):
        c.v("I18", f"padded rows have seq_lens {seq[pad].tolist()}, fill value is {fill}")
    if rpi is not None and np.any(rpi[pad] != 0):
        c.v("I18", f"padded rows use request slots {rpi[pad].tolist()}, expected slot 0")
    if cs is not None and np.any(cs[pad] > s.page_size):
        c.v("I18", f"padded rows read {int(cs[pad].max())} KV positions, past their single page "
                   f"({s.page_size} slots)")
    loc = c.arr("out_cache_loc")
    if loc is not None:
        t = s.tokens_per_request if s.mode in _UNIFORM else 1
        if np.any(loc[s.batch_size * t: s.padded_batch_size * t] != 0):
            c.v("I18", "padded rows write KV outside slot 0")


def _check_capture(c: _Ctx) -> None:
    cs = c.arr("cache_seqlens")
    if cs is not None and cs.size and int(cs.min()) <= 0:
        c.v("I17", f"captured with cache_seqlens {cs.tolist()[:8]}: rows with 0 KV give NaN (softmax over nothing)")
    pt = c.arr("page_table")
    if pt is not None and pt.size and np.any(pt[:, :1] != 0):
        c.v("I17", "capture rows must point at reserved page 0")


def _check_freshness(c: _Ctx) -> None:
    s = c.step
    cs, refreshed = c.arr("cache_seqlens"), s.scalars.get("refreshed_page_cols")
    if cs is None or refreshed is None or refreshed < 0 or not s.batch_size:
        return
    need = -(-int(cs[: s.batch_size].max()) // s.page_size)
    if refreshed < need:
        c.v("I19", f"replay prep refreshed {refreshed} page-table columns but the kernels read {need}: "
                   "the rest are left over from an earlier batch")


def _check_streams(c: _Ctx) -> None:
    sc = c.step.scalars
    if not sc.get("plan_stream"):
        return
    if sc.get("plan_waited_producers") == 0:
        c.v("I21", "metadata was prepared on the plan stream without waiting for the producers of seq_lens "
                   "and req_to_token")
    if sc.get("compute_waited_plan") == 0:
        c.v("I22", "the compute stream did not wait for the plan stream before launching")
    if sc.get("fixup_hook_ok") == 0 and not any(v.check_id == "I28" for v in c.step.violations):
        c.v("I28", "update_verify_buffers_to_fill_after_draft is missing")


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
                           f"(step {cap.index}): the kernels read the captured address")
        frozen = cap.scalars.get("captured_max_seq_len_q", cap.scalars.get("max_seq_len_q"))
        now = s.scalars.get("max_seq_len_q")
        if frozen is not None and now is not None and now != frozen:
            c.v("I16", f"max_seq_len_q = {now} at replay prep, the graph froze {frozen} at capture")


class Checker:
    """The streaming checker: feed steps in index order; it keeps the capture/replay state between them.

    A live viewer (or the checker process beside a run's writer) calls `feed` as each step is committed and
    can break on the violations it returns; `check_steps` is a loop over it.
    """

    def __init__(self) -> None:
        self._graphs = _GraphState()

    def feed(self, step: Step) -> list[Violation]:
        """Every violation of `step` (violations attached before writing come first)."""
        c = _Ctx(step)
        c.out.extend(step.violations)
        if step.arrays:
            _check_shapes(c)
            _check_query_tokens(c)
            _check_values(c)
            _check_verify_and_extend(c)
            _check_pages(c)
            _check_tokens(c)
            _check_padding(c)
            if step.graph == GraphPhase.CAPTURE:
                _check_capture(c)
            if step.graph == GraphPhase.REPLAY:
                _check_freshness(c)
            self._graphs.check(c)
            if step.array("attn_q") is not None:
                c.out.extend(differential_check([step]))
        _check_streams(c)
        return c.out


def check_steps(steps: Iterable[Step]) -> Iterator[Violation]:
    """Every violation, in step order (a loop over `Checker.feed`)."""
    checker = Checker()
    for step in steps:
        yield from checker.feed(step)
