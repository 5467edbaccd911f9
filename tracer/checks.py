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

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, overload

import numpy as np

from .differential import differential_check
from .schema import Cell, ForwardMode, GraphPhase, RequestState, RunInfo, Severity, Step, StreamSpan, Violation

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
    # Machine-readable form of `reads`: the recorded fields it needs (names in FACTS), so a trace that lacks one
    # skips it (run.config["not_recorded"]) and scripts/check_coverage.py can build the fact-coverage matrix.
    facts: tuple[str, ...] = ()
    relations: tuple[str, ...] = ()  # the relation kinds (RELATIONS) it constrains those facts by


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
    Invariant("I15", E, "replay passes the kernels the same addresses the graph captured, for every array they "
              "read through a captured address: cache_seqlens, cu_seqlens_q/k, page_table, seq_lens, "
              "req_pool_indices", "G2, G3", "data_ptr of those arrays at capture and replay"),
    Invariant("I16", E, "replay's max_seq_len_q, and every scalar the capture froze (captured_X / frozen_X), == the "
              "value frozen at capture", "G4, G5",
              "scalars max_seq_len_q, X at replay; captured_max_seq_len_q / max_seq_len_q, captured_X at capture"),
    Invariant("I17", E, "capture: every row has cache_seqlens > 0 and points at reserved page 0", "PR #26521 (G1)",
              "cache_seqlens, page_table of capture steps"),
    Invariant("I18", E, "padded rows: seq_lens (and seq_lens_cpu) == fill value, slot 0, KV slot 0, cache_seqlens "
              "== the mode formula over the fill value, every page they read is page 0, and each padded row's "
              "cu_seqlens_q span == the live rows' span (positions of padded rows are not constrained: replay copies "
              "only the live tokens' positions)", "§6.1",
              "seq_lens, seq_lens_cpu, req_pool_indices, out_cache_loc, cache_seqlens, page_table, cu_seqlens_q of "
              "rows [bs, padded bs); scalar seq_len_fill_value"),
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
    Invariant("I35", W, "acceptance collapse: 4 verifies in a row where every row drafted one repeated token and "
              "accepted only the bonus (both at once: repeated text alone is legal), or 16 where every row accepted "
              "only the bonus", "§6.4 symptoms",
              "request accept_length, draft_tokens over consecutive verify steps"),
    Invariant("D1", E, "sampled attention: kernel output == float64 attention over the metadata it consumed",
              "differential (--record-attention)", f"attn_q, attn_out, attn_kv, attn_page_ids, {_MD}"),
    Invariant("D2", E, "sampled attention: output == attention over the request's own KV (req_to_token, positions)",
              "differential (--record-attention)", "attn_q, attn_out, attn_kv, req_to_token_page_starts, positions"),
)
_NEW: tuple[Invariant, ...] = (
    Invariant("I36", E, "within a live row, the logical pages it reads map to distinct physical pages (page_table "
              "and req_to_token)", "§7 page contiguity", "page_table, req_to_token_page_starts, cache_seqlens"),
    Invariant("I37", E, "no live row reads or writes the reserved page 0 (page_table, req_to_token, out_cache_loc "
              "of its query tokens)", "§6.1 (page 0 is the padding page)",
              "page_table, req_to_token_page_starts, out_cache_loc, cache_seqlens, request rows"),
    Invariant("I38", E, "ownership across the live rows of a step: no KV write slot (out_cache_loc) written by two "
              "query tokens, no request-pool slot (req_pool_indices) or request id in two rows",
              "allocator / scheduler bugs", "out_cache_loc, req_pool_indices, request slot and request_id"),
    Invariant("I39", E, "identity: req_pool_indices[b] == request row b's slot; seq_lens[b] == row b's length by "
              "mode (draft decode / verify S, decode S+1, draft extend S+T, extend the full length); a uniform-q "
              "row's query tokens == T", "§3.2, §7", "req_pool_indices, seq_lens, request slot / seq_len_before / "
              "seq_len_after / num_q_tokens, T"),
    Invariant("I40", E, "one iteration: a request's draft steps, verify and draft extend start from one length "
              "(an extend's seq_len_after when it joined this iteration), the draft extend runs the verify's window "
              "T, and every page two steps both read is the same page", "§4 (the EAGLE loop)",
              "request seq_len_before/after, num_q_tokens, T, req_to_token_page_starts, cache_seqlens, iteration"),
    Invariant("I41", E, "a request's life: the page (so the KV slot) a committed position maps to never changes "
              "while the request lives (a new extend starts a new life)", "§4.3 commit, radix-cache bugs",
              "req_to_token_page_starts, request seq_len_before, request_id, across steps"),
    Invariant("I42", E, "numerics: recorded attention inputs and outputs of the live rows are finite (padded rows' "
              "query/output rows and the reserved page 0 excluded: their contract allows garbage)",
              "NaN / Inf propagation", "attn_q, attn_out, attn_kv, attn_page_ids, attn_scaling"),
)
CATALOGUE = CATALOGUE + _NEW

# The relation kinds the fact-coverage matrix (docs/checks.md) has a column for.
ROW, ROWS, IDENTITY, ITERATION, LIFE, CAPTURE, NUMERICS, ACCEPTANCE = (
    "row", "rows", "identity", "iteration", "life", "capture", "numerics", "acceptance")
FORM, ORDER = "form", "order"  # single-fact shape / bound checks; stream order and call errors
RELATIONS: dict[str, str] = {
    ROW: "within a row: lengths, positions, KV slots and pages of one live row agree; distinct pages; no page 0",
    ROWS: "across the rows of a step: ownership (no page / slot shared), padded rows' fill contract",
    IDENTITY: "the per-row indices and lengths the kernels use == what the step's request rows say",
    ITERATION: "across the steps of one iteration: starting length, window and pages agree",
    LIFE: "across a request's life: committed lengths and committed KV slots carry over",
    CAPTURE: "capture vs replay: addresses and frozen scalars",
    NUMERICS: "finite values; differential recomputation",
    ACCEPTANCE: "acceptance: drafts, accepted tokens, accept lengths, collapse",
    FORM: "the fact alone: dtype, shape, bounds, alignment",
    ORDER: "stream order and call errors",
}
# Every recorded field, by where it lives (per step header / scalar / array, per request row, per span).
FACTS: dict[str, tuple[str, ...]] = {
    "step": ("batch_size", "padded_batch_size", "tokens_per_request", "num_draft_tokens", "page_size", "step_id",
             "iteration", "mode", "graph"),
    "scalar": ("max_seq_len_q", "kernel_q_len", "max_seq_len_k", "max_context_len", "num_kv_pages",
               "seq_len_fill_value", "captured_max_seq_len_q", "backend_num_draft_tokens"),
    "array": ("cache_seqlens", "cu_seqlens_q", "cu_seqlens_k", "page_table", "seq_lens", "seq_lens_cpu",
              "req_pool_indices", "req_to_token_page_starts", "out_cache_loc", "positions", "data_ptr", "dtype_shape",
              "attn_q", "attn_out", "attn_kv", "attn_page_ids", "attn_scaling"),
    "row": ("request_id", "slot", "seq_len_before", "seq_len_after", "num_q_tokens", "draft_tokens",
            "accepted_tokens", "accept_length"),
    "span": ("spans", "waits", "errors"),
    "run": ("temperature",),
}
_CS, _PT, _R2T, _LOC, _POS = "cache_seqlens", "page_table", "req_to_token_page_starts", "out_cache_loc", "positions"
_LEN = ("seq_len_before", "seq_len_after")
_ATTN = ("attn_q", "attn_out", "attn_kv", "attn_page_ids", "attn_scaling")
_META: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "I1": (("dtype_shape", _CS, "cu_seqlens_q", "cu_seqlens_k", _PT), (FORM,)),
    "I2": (("dtype_shape", "batch_size", "padded_batch_size", "request_id"), (FORM,)),
    "I3": ((_POS, "kernel_q_len", "cu_seqlens_q", "padded_batch_size", "mode"), (ROWS,)),
    "I4": (("cu_seqlens_k", _CS), (ROW, ROWS)),
    "I5": ((_CS, *_LEN, "tokens_per_request", "step_id", "mode"), (ROW, IDENTITY)),
    "I6": (("kernel_q_len", "max_seq_len_q", "tokens_per_request"), (IDENTITY,)),
    "I7": (("cu_seqlens_q", "tokens_per_request"), (ROW,)),
    "I8": (("cu_seqlens_q", "kernel_q_len", "tokens_per_request", "batch_size"), (ROW, ROWS)),
    "I9": (("max_seq_len_k", _CS), (ROWS,)),
    "I10": ((_PT, _R2T, _CS, "page_size"), (ROW, IDENTITY)),
    "I11": ((_R2T, "page_size"), (FORM,)),
    "I12": ((_LOC, _PT, _CS, "num_q_tokens"), (ROW,)),
    "I13": ((_POS, _CS, "num_q_tokens"), (ROW,)),
    "I14": ((_CS, _PT, "max_context_len", "num_kv_pages"), (FORM,)),
    "I15": (("data_ptr", "graph"), (CAPTURE,)),
    "I16": (("max_seq_len_q", "captured_max_seq_len_q", "kernel_q_len", "graph"), (CAPTURE,)),
    "I17": ((_CS, _PT, "graph"), (ROWS,)),
    "I18": (("seq_lens", "seq_lens_cpu", "req_pool_indices", _LOC, _CS, _PT, "cu_seqlens_q", "seq_len_fill_value",
             "batch_size", "padded_batch_size"), (ROWS,)),
    "I19": ((_PT, "data_ptr", _R2T, _CS), (CAPTURE, ROW)),
    "I21": (("spans", "waits"), (ORDER,)),
    "I22": (("spans", "waits"), (ORDER,)),
    "I28": (("errors",), (ORDER,)),
    "K1": (("errors",), (ORDER,)),
    "I29": ((_R2T, _CS, "request_id", "page_size"), (ROWS,)),
    "I30": ((_LOC, _R2T, _CS, "num_q_tokens", "page_size"), (ROWS,)),
    "I31": (("draft_tokens", "accepted_tokens", "accept_length", *_LEN, "temperature"), (ACCEPTANCE, ROW)),
    "I32": ((*_LEN, "iteration", "request_id"), (LIFE,)),
    "I33": (("cu_seqlens_q", "num_q_tokens"), (ROW, ROWS)),
    "I34": (("seq_lens_cpu", "seq_lens"), (ROW,)),
    "I35": (("accept_length", "draft_tokens", "tokens_per_request"), (ACCEPTANCE,)),
    "D1": ((*_ATTN, _CS, _PT, "kernel_q_len", "cu_seqlens_q"), (NUMERICS,)),
    "D2": ((*_ATTN, _R2T, _POS), (NUMERICS,)),
    "I36": ((_PT, _R2T, _CS), (ROW,)),
    "I37": ((_PT, _R2T, _LOC, _CS, "page_size"), (ROW,)),
    "I38": ((_LOC, "req_pool_indices", "slot", "request_id"), (ROWS,)),
    "I39": (("req_pool_indices", "slot", "seq_lens", *_LEN, "num_q_tokens", "tokens_per_request", "step_id"),
            (IDENTITY,)),
    "I40": ((*_LEN, "num_q_tokens", "tokens_per_request", "accept_length", _R2T, _CS, "iteration", "mode",
             "request_id"), (ITERATION,)),
    "I41": ((_R2T, "seq_len_before", "request_id", "page_size", "mode"), (LIFE,)),
    "I42": (_ATTN, (NUMERICS,)),
}
CATALOGUE = tuple(dataclasses.replace(i, facts=_META[i.check_id][0], relations=_META[i.check_id][1])
                  for i in CATALOGUE)
BY_ID = {i.check_id: i for i in CATALOGUE}
# Facts that live in a step's arrays or scalars: a replay recorded without metadata has none of them.
_METADATA_FACTS = frozenset(FACTS["array"]) | frozenset(FACTS["scalar"])

COLLAPSE_VERIFIES = 4  # I35: consecutive verifies of combined evidence (repeated drafts and bonus-only rows)
BONUS_ONLY_VERIFIES = 16  # I35: consecutive verifies where every row accepted only the bonus token

_UNIFORM = (ForwardMode.DECODE, ForwardMode.DRAFT_DECODE, ForwardMode.TARGET_VERIFY)
_CONTEXT = (ForwardMode.EXTEND, ForwardMode.DRAFT_EXTEND)
_PTR_NAMES = ("cache_seqlens", "cu_seqlens_q", "cu_seqlens_k", "page_table")
# Arrays the replayed kernels read through the address the graph captured: the attention metadata and the graph's
# static batch inputs. Not: host mirrors (*_cpu, read by replay prep on the host), the recorder's attn_* copies, and
# out_cache_loc / positions, which an integration may record as the live tensors replay copies from (SGLang does).
_GRAPH_BOUND = frozenset(_PTR_NAMES) | {"seq_lens", "req_pool_indices"}
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

    def __init__(self, step: Step, skip: frozenset[str] = frozenset()) -> None:
        self.step = step
        self.out: list[Violation] = []
        self.a = {a.name: a for a in step.arrays}
        self.skip = skip  # invariants whose facts this trace does not record: never judged on a made-up value
        self._reads: tuple[int, np.ndarray, np.ndarray] | None | bool = False  # False: not computed yet
        self._want: list[int] | None = None
        self._tok: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def want_lens(self) -> list[int]:
        """Each live row's cache_seqlens by its mode's formula (I5, I39), computed once."""
        if self._want is None:
            s = self.step
            self._want = [_formula(s, r.seq_len_before, r.seq_len_after) for r in s.requests]
        return self._want

    def token_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`_token_rows` of this step, computed once."""
        if self._tok is None:
            self._tok = _token_rows(self)
        return self._tok

    def reads(self) -> tuple[int, np.ndarray, np.ndarray] | None:
        """`_live_reads` of this step, computed once (several relations need it)."""
        if self._reads is False:
            self._reads = _live_reads(self)
        return self._reads  # type: ignore[return-value]

    def v(self, check_id: str, msg: str, request_id: int | None = None, *, array: str | None = None,
          row: int | None = None, col: int | None = None, found: object = None, expected: object = None,
          related: Iterable[Cell] = ()) -> None:
        if check_id in self.skip:
            return
        s = self.step
        where = f"step {s.index} ({s.model} {s.mode.value}"
        where += f" #{s.step_id}" if s.step_id is not None else ""
        where += f", {s.graph.value}, bs {s.batch_size}/{s.padded_batch_size})"
        who = f" request {request_id}" if request_id is not None else ""
        self.out.append(Violation(
            check_id, BY_ID[check_id].severity, s.index, f"{where}{who}: {msg}", request_id, array=array, row=row,
            col=col, found=None if found is None else _short(found),
            expected=None if expected is None else _short(expected), related=tuple(related)))

    def arr(self, name: str) -> np.ndarray | None:
        a = self.a.get(name)
        return None if a is None else a.values


def cell(array: str, row: int | None = None, col: int | None = None, value: object = None,
         step: int | None = None) -> Cell:
    """The other side of a relation: a recorded cell with its value (`step` only when recorded at another step)."""
    return Cell(array, row, col, None if value is None else _short(value), step)


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


def _check_verify_and_extend(c: _Ctx) -> None:
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
            array="seq_lens_cpu", row=b, found=int(host[b]), expected=int(dev[b]),
            related=[cell("seq_lens", b, None, int(dev[b]))])


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
                found=int(pt[b, j]), expected=int(want[j]), related=[cell(_R2T, b, j, int(starts[b, j]))])
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


def _token_rows(c: _Ctx) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per query token of the live rows: its row, its index within the row, and the rows' query lengths."""
    q = np.asarray(_q_lens(c.step)[: len(c.step.requests)], dtype=np.int64)
    rows = np.repeat(np.arange(q.shape[0]), q)
    first = np.cumsum(q) - q
    return rows, np.arange(rows.shape[0]) - first[rows], q


def _check_ownership(c: _Ctx) -> None:
    """I29 / I30, vectorized for the common clean step; any suspect step is judged by the exact per-row walk."""
    p = c.step.page_size
    starts, loc = c.arr(_R2T), c.arr(_LOC)
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


def _check_ownership_rows(c: _Ctx) -> None:
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
                    related=[cell(_R2T, a, int(np.nonzero(starts[a] // p == pg)[0][0]), pg * p)])
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
                    expected=f"a slot outside page {pg}",
                    related=[cell(_R2T, other, int(np.nonzero(starts[other] // p == pg)[0][0]), pg * p)])
                break
        start += n


def _check_tokens(c: _Ctx) -> None:
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


def _check_tokens_rows(c: _Ctx) -> None:
    s, p = c.step, c.step.page_size
    cs, pt, pos, loc = c.arr("cache_seqlens"), c.arr("page_table"), c.arr("positions"), c.arr("out_cache_loc")
    assert cs is not None and pt is not None and pos is not None and loc is not None
    start = 0
    for b, (r, n) in enumerate(zip(s.requests, _q_lens(s), strict=False)):
        want_pos = np.arange(int(cs[b]) - n, int(cs[b]))
        got_pos = pos[start:start + n].astype(np.int64)
        if got_pos.shape == want_pos.shape and not np.array_equal(got_pos, want_pos):
            t = int(np.nonzero(got_pos != want_pos)[0][0])
            c.v("I13", f"positions {_short(got_pos)} but cache_seqlens {int(cs[b])} - q {n} + t gives "
                       f"{_short(want_pos)}", r.request_id, array="positions", row=b, col=t, found=int(got_pos[t]),
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
                found=int(vals[b]), expected=want, related=rel)

    rel = [cell("seq_len_fill_value", value=fill)] if "seq_len_fill_value" in s.scalars else []
    first("seq_lens", seq, fill, "the fill value is")
    first("seq_lens_cpu", c.arr("seq_lens_cpu"), fill, "the fill value is")
    cuq = c.arr("cu_seqlens_q")
    if cuq is not None and lo >= 1 and cuq.shape[0] >= hi + 1 and (s.mode in _UNIFORM
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
        t = s.tokens_per_request if s.mode in _UNIFORM or s.mode == ForwardMode.DRAFT_EXTEND else 1
        bad = np.nonzero(loc[lo * t: hi * t] != 0)[0]
        if bad.size:
            k = lo * t + int(bad[0])
            c.v("I18", f"padded row {k // t} writes KV slot {int(loc[k])}, outside the reserved slot 0",
                array="out_cache_loc", row=k // t, col=k % t, found=int(loc[k]), expected=0)


def _live_reads(c: _Ctx) -> tuple[int, np.ndarray, np.ndarray] | None:
    """(live rows, logical pages each reads, mask of the read columns) over the recorded page-table columns."""
    cs, pt = c.arr("cache_seqlens"), c.arr("page_table")
    live = len(c.step.requests)
    if cs is None or pt is None or not live or pt.ndim != 2:
        return None
    n = np.clip(-(-cs[:live].astype(np.int64) // c.step.page_size), 0, pt.shape[1])
    return live, n, np.arange(pt.shape[1])[None, :] < n[:, None]


def _first_dup(row: np.ndarray) -> tuple[int, int] | None:
    """(earlier column, later column) of the first repeated value in `row`, or None."""
    seen: dict[int, int] = {}
    for j, x in enumerate(row.tolist()):
        if x in seen:
            return seen[x], j
        seen[x] = j
    return None


def _check_row_pages(c: _Ctx) -> None:
    """I36 (a live row's logical pages are distinct physical pages) and I37 (no live row touches page 0)."""
    got = c.reads()
    if got is None:
        return
    live, n, mask = got
    s, p = c.step, c.step.page_size
    pt, starts = c.arr("page_table"), c.arr(_R2T)
    # req_to_token is where the pages come from; the page table the kernel read is tied to it cell by cell (I10), so
    # it is judged here only where req_to_token was not recorded.
    if starts is not None and starts.shape[1] == pt.shape[1]:  # type: ignore[union-attr]
        name, pages = _R2T, starts[:live].astype(np.int64) // p
    else:
        name, pages = "page_table", pt[:live].astype(np.int64)  # type: ignore[index]
    # One sort of (page, row) keys finds a page repeated within a row without a Python loop.
    keyed = np.sort((pages * live + np.arange(live)[:, None])[mask])
    dup = keyed[1:][keyed[1:] == keyed[:-1]]
    scale = p if name == _R2T else 1
    if dup.size:
        b = int(dup[0]) % live
        pair = _first_dup(pages[b, : n[b]])
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
    loc = c.arr(_LOC)
    if loc is not None and loc.ndim == 1:
        ntok = min(sum(_q_lens(s)), loc.shape[0])
        z = np.nonzero(loc[:ntok] // p == 0)[0]
        if z.size:
            k = int(z[0])
            b, t = _token_row(s, k)
            c.v("I37", f"query token {t} of a live row writes KV slot {int(loc[k])}, in the reserved page 0",
                s.requests[b].request_id if b < live else None, array=_LOC, row=b, col=t, found=int(loc[k]),
                expected=f">= {p}")


def _token_row(s: Step, k: int) -> tuple[int, int]:
    """(row, token within the row) of query token k of the live rows."""
    start = 0
    for b, n in enumerate(_q_lens(s)):
        if k < start + n:
            return b, k - start
        start += n
    return len(s.requests), k - start


def _check_row_ownership(c: _Ctx) -> None:
    """I38: no KV write slot, request-pool slot or request id used by two live rows (tokens) of one step."""
    s = c.step
    live = len(s.requests)
    if not live:
        return  # a capture has no request rows: its rows are all dummies
    loc = c.arr(_LOC)
    if loc is not None and loc.ndim == 1:
        ntok = min(sum(_q_lens(s)), loc.shape[0])
        w = np.sort(loc[:ntok])
        if np.any(w[1:] == w[:-1]):
            w = loc[:ntok]
            pair = _first_dup(w)
            assert pair is not None
            (b0, t0), (b, t) = _token_row(s, pair[0]), _token_row(s, pair[1])
            c.v("I38", f"query token {t} of row {b} writes KV slot {int(w[pair[1]])}, which token {t0} of row {b0} "
                       "also writes: one of the two KV entries is lost", s.requests[b].request_id, array=_LOC, row=b,
                col=t, found=int(w[pair[1]]), expected="a slot no other token writes",
                related=[cell(_LOC, b0, t0, int(w[pair[0]]))])
    rpi = c.arr("req_pool_indices")
    for name, vals in (("req_pool_indices", None if rpi is None else rpi[:live].tolist()),
                       ("slot", [r.slot for r in s.requests]),
                       ("request_id", [r.request_id for r in s.requests])):
        if vals is not None and len(set(vals)) != len(vals):
            pair = _first_dup(np.array(vals))
            assert pair is not None
            b0, b = pair
            c.v("I38", f"{name} {int(vals[b])} is used by live rows {b0} and {b}: they read and write one "
                       "req_to_token row", s.requests[b].request_id, array=name, row=b, found=int(vals[b]),
                expected=f"a {name} no other live row has", related=[cell(name, b0, None, int(vals[b0]))])


def _seq_lens_offset(step: Step) -> int:
    """cache_seqlens - seq_lens by mode: draft step i attends S + i + 1 from seq_lens S; verify S + T from S."""
    if step.mode == ForwardMode.DRAFT_DECODE:
        return (step.step_id or 0) + 1
    return step.tokens_per_request if step.mode == ForwardMode.TARGET_VERIFY else 0


def _check_identity(c: _Ctx) -> None:
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
    if s.mode in _UNIFORM:
        for b, r in enumerate(s.requests):
            if r.num_q_tokens != s.tokens_per_request:
                c.v("I39", f"request row {b} has {r.num_q_tokens} query tokens but the {s.mode.value} runs T = "
                           f"{s.tokens_per_request} per row", r.request_id, array="num_q_tokens", row=b,
                    found=r.num_q_tokens, expected=s.tokens_per_request,
                    related=[cell("tokens_per_request", value=s.tokens_per_request)])
                break


def _check_finite(c: _Ctx) -> None:
    """I42: the recorded attention inputs and outputs of live rows hold no NaN / Inf."""
    s = c.step
    if not s.requests:
        return
    ntok = sum(_q_lens(s))
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
            row, col = (_token_row(s, k) if name in ("attn_q", "attn_out") else (None, k))
            what = f"token {col} of row {row}" if row is not None else f"entry {k}"
            c.v("I42", f"{name} holds a non-finite value ({vals[tuple(bad)]}) at {what} ({int((~fin).sum())} "
                       "values): the kernel consumed or produced NaN / Inf", array=name, row=row, col=col,
                found=str(vals[tuple(bad)]), expected="finite")


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
        for a in c.step.arrays:
            b = capa.get(a.name)
            # An address of 0 was not recorded.
            if b is None or a.name not in _GRAPH_BOUND or not a.data_ptr or not b.data_ptr:
                continue
            if a.data_ptr != b.data_ptr:
                c.v("I15", f"{a.name} at 0x{a.data_ptr:x}, but the graph captured 0x{b.data_ptr:x} "
                           f"(step {cap.index}): the kernels read the captured address", array=a.name,
                    found=f"0x{a.data_ptr:x}", expected=f"0x{b.data_ptr:x}",
                    related=[cell(f"{a.name}.data_ptr", value=f"0x{b.data_ptr:x}", step=cap.index)])
        frozen = cap.scalars.get("captured_max_seq_len_q", cap.scalars.get("max_seq_len_q"))
        now = s.scalars.get("max_seq_len_q")
        if frozen is not None and now is not None and now != frozen:
            name = "captured_max_seq_len_q" if "captured_max_seq_len_q" in cap.scalars else "max_seq_len_q"
            c.v("I16", f"max_seq_len_q = {now} at replay prep, the graph froze {frozen} at capture",
                array="max_seq_len_q", found=now, expected=frozen, related=[cell(name, value=frozen, step=cap.index)])
        for key_name, val in cap.scalars.items():
            # Every other scalar the capture says it froze into the graph (captured_X / frozen_X) binds X.
            for prefix in ("captured_", "frozen_"):
                if key_name.startswith(prefix) and key_name != "captured_max_seq_len_q":
                    base = key_name[len(prefix):]
                    got = s.scalars.get(base)
                    if base != "max_seq_len_q" and got is not None and got != val:
                        c.v("I16", f"{base} = {got} at replay prep, the graph froze {key_name} = {val} at capture "
                                   f"(step {cap.index})", array=base, found=got, expected=val,
                            related=[cell(key_name, value=val, step=cap.index)])


def _stale_cells(c: _Ctx, b: int) -> int:
    """Cells of live row b the page-table grid marks stale (ui/views.py): read, inside the KV pool, and not the
    page req_to_token gives."""
    pt, starts = c.arr("page_table"), c.arr(_R2T)
    assert pt is not None and starts is not None, "I19 judges only steps that record both"
    n = min(_reads(c, b), starts.shape[1])
    row, want = pt[b, :n].astype(np.int64), starts[b, :n].astype(np.int64) // c.step.page_size
    npages = c.step.scalars.get("num_kv_pages")
    inside = (row >= 0) & (row < npages) if npages is not None else np.ones(n, dtype=bool)
    return int(np.count_nonzero((row != want) & inside))


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
                    marked = _stale_cells(c, b)
                    c.v("I19", f"page_table[{b}, {j}] = {int(pt[b, j])} is what the graph's buffer held at step "
                               f"{since}, but req_to_token gives page {int(want[j])} ({marked} stale cells in "
                               f"this row, {stale.size} of them left over from step {since}): replay prep did not "
                               "refresh it", r.request_id, array="page_table", row=b,
                        col=j, found=int(pt[b, j]), expected=int(want[j]),
                        related=[cell(_R2T, b, j, int(starts[b, j])), cell("page_table", b, j, int(held[b, j]), since)])
        rows = max(pt.shape[0], prev[0].shape[0] if prev else 0)
        cols = max(pt.shape[1], prev[0].shape[1] if prev else 0)
        new = np.full((rows, cols), -1, dtype=np.int64)
        if prev is not None:
            new[: prev[0].shape[0], : prev[0].shape[1]] = prev[0]
        new[: pt.shape[0], : pt.shape[1]] = pt
        self.held[key] = (new, s.index)


class _Requests:
    """I40 (the steps of one iteration agree per request) and I41 (a committed position keeps its page for life).

    Per request it keeps the page start of every logical page some step read (req_to_token), with the step,
    row and iteration that recorded it. A later step must read the same page where one of its own iteration read
    it (I40: within an iteration nothing is committed or freed between draft, verify and draft extend) or where
    the page holds committed positions (I41: j * P < the step's S). An extend starts a new life (a re-prefill after
    retraction may take its prefix from other cached pages)."""

    PRUNE = 256  # iterations a request may be absent before its pages are forgotten

    def __init__(self) -> None:
        # request id -> per logical page: slot of its first position, and the step, row and iteration that read it
        self.pages: dict[int, tuple[list[int], list[int], list[int], list[int]]] = {}
        self.seen: dict[int, int] = {}  # request id -> last iteration
        self.iteration: int | None = None
        self.start: dict[int, tuple[int, int, int, str]] = {}  # request id -> (length, step, row, field)
        self.window: dict[int, tuple[int, int, int, int]] = {}  # request id -> (T, accept length, step, row)
        self.pruned_at = 0

    def gap(self) -> None:
        """Steps are missing: forget the iteration; committed pages stay (a committed slot never moves)."""
        self.iteration = None
        self.start, self.window = {}, {}

    def check(self, c: _Ctx) -> None:
        s = c.step
        if s.iteration < 0 or not s.requests:
            return
        if s.iteration != self.iteration:
            self.iteration, self.start, self.window = s.iteration, {}, {}
            if s.iteration - self.pruned_at >= self.PRUNE:
                self.pruned_at = s.iteration
                for rid in [r for r, it in self.seen.items() if s.iteration - it > self.PRUNE]:
                    del self.seen[rid]
                    self.pages.pop(rid, None)
        self._lengths(c)
        starts = c.arr(_R2T)
        got = c.reads() if starts is not None else None
        if got is None or starts is None or starts.ndim != 2 or starts.shape[1] != got[2].shape[1]:
            for r in s.requests:
                self.seen[r.request_id] = s.iteration
            return
        _, n, _ = got
        p, it = s.page_size, s.iteration
        table = starts.tolist()  # short rows: Python lists compare faster than one numpy call per row
        for b, r in enumerate(s.requests):
            rid = r.request_id
            self.seen[rid] = it
            nb = int(n[b])
            row = table[b][:nb]
            held = self.pages.get(rid)
            if held is not None and s.mode == ForwardMode.EXTEND and max(held[3], default=-1) < it:
                held = None  # a new life
            if held is None:
                self.pages[rid] = (row, [s.index] * nb, [b] * nb, [it] * nb)
                continue
            known, steps, rows, iters = held
            m = min(nb, len(known))
            if known[:m] != row[:m]:
                for j in range(m):
                    if known[j] == row[j] or not (iters[j] == it or j * p < r.seq_len_before):
                        continue
                    was = steps[j]
                    if iters[j] == it:
                        c.v("I40", f"req_to_token maps logical page {j} to slot {row[j]}, but step {was} of this "
                                   f"iteration read slot {known[j]} there: the steps of one iteration read "
                                   "different KV", rid, array=_R2T, row=b, col=j, found=row[j], expected=known[j],
                            related=[cell(_R2T, rows[j], j, known[j], was)])
                    else:
                        c.v("I41", f"req_to_token maps logical page {j} (committed positions {j * p}.."
                                   f"{min((j + 1) * p, r.seq_len_before) - 1}) to slot {row[j]}, but step {was} "
                                   f"read slot {known[j]} there: committed KV moved while the request lives",
                            rid, array=_R2T, row=b, col=j, found=row[j], expected=known[j],
                            related=[cell(_R2T, rows[j], j, known[j], was)])
                    break
            if nb > len(known):
                known.extend(row[len(known):])
                steps.extend([s.index] * (nb - len(steps)))
                rows.extend([b] * (nb - len(rows)))
                iters.extend([it] * (nb - len(iters)))
            known[:nb] = row
            steps[:nb] = [s.index] * nb
            rows[:nb] = [b] * nb
            iters[:nb] = [it] * nb

    def _lengths(self, c: _Ctx) -> None:
        """I40's lengths and window: one starting length per request and iteration; draft extend re-runs the
        verify's window (T tokens, spec v2) or its accepted tokens (spec v1)."""
        s = c.step
        for b, r in enumerate(s.requests):
            rid = r.request_id
            if s.mode == ForwardMode.EXTEND:
                have = self.start.get(rid)
                if have is None:
                    self.start[rid] = (r.seq_len_after, s.index, b, "seq_len_after")
                elif have[0] != r.seq_len_after:
                    c.v("I40", f"seq_len_after = {r.seq_len_after}, but step {have[1]} of this iteration made it "
                               f"{have[0]}", rid, array="seq_len_after", row=b, found=r.seq_len_after,
                        expected=have[0], related=[cell(have[3], have[2], None, have[0], have[1])])
                continue
            have = self.start.get(rid)
            if have is None:
                self.start[rid] = (r.seq_len_before, s.index, b, "seq_len_before")
            elif have[0] != r.seq_len_before:
                c.v("I40", f"seq_len_before = {r.seq_len_before}, but step {have[1]} of this iteration started this "
                           f"request at {have[0]}: the draft, verify and draft extend disagree on its length", rid,
                    array="seq_len_before", row=b, found=r.seq_len_before, expected=have[0],
                    related=[cell(have[3], have[2], None, have[0], have[1])])
            if s.mode == ForwardMode.TARGET_VERIFY:
                self.window[rid] = (s.tokens_per_request, r.accept_length, s.index, b)
            elif s.mode == ForwardMode.DRAFT_EXTEND and rid in self.window:
                T, acc, at, vb = self.window[rid]
                if r.num_q_tokens not in (T, acc):
                    c.v("I40", f"the draft extend runs {r.num_q_tokens} query tokens, but step {at}'s verify ran T = "
                               f"{T} and accepted {acc}", rid, array="num_q_tokens", row=b, found=r.num_q_tokens,
                        expected=f"{T} (or {acc})", related=[cell("tokens_per_request", None, None, T, at),
                                                             cell("accept_length", vb, None, acc, at)])


class _Acceptance:
    """I31 per verify row, I32 across iterations, I35 over stretches of verifies."""

    def __init__(self, greedy: bool | None) -> None:
        self.greedy = greedy
        self.committed: dict[int, tuple[int, int, int, int]] = {}  # request id -> (iteration, seq_len, step, row)
        self.stretch_bonus: list[int] = []  # consecutive verify steps where every row accepted only the bonus
        self.stretch_token: list[int] = []  # ... where also every row drafted one repeated token

    def gap(self) -> None:
        """Steps are missing before the next one: forget what needs the step before it."""
        self.committed.clear()
        self.stretch_bonus, self.stretch_token = [], []

    def check(self, c: _Ctx) -> None:
        s = c.step
        if s.iteration < 0:
            return
        for b, r in enumerate(s.requests):
            last = self.committed.get(r.request_id)
            if last is not None and s.iteration > last[0] and r.seq_len_before != last[1]:
                c.v("I32", f"seq_len_before = {r.seq_len_before}, but step {last[2]} (iteration {last[0]}) committed "
                           f"{last[1]}", r.request_id, array="seq_len_before", row=b, found=r.seq_len_before,
                    expected=last[1], related=[cell("seq_len_after", last[3], None, last[1], last[2])])
        # A recorder that could not see acceptance (SGLang's backend never learns it) says so; there is then no
        # recorded value to judge, which is not the same as a recorded accept length of 0.
        if s.mode == ForwardMode.TARGET_VERIFY and s.scalars.get("acceptance_recorded", 1) != 0:
            for b, r in enumerate(s.requests):
                self._row(c, b, r)
            self._collapse(c)
        if s.mode in (ForwardMode.TARGET_VERIFY, ForwardMode.DECODE, ForwardMode.EXTEND):
            for b, r in enumerate(s.requests):
                self.committed[r.request_id] = (s.iteration, r.seq_len_after, s.index, b)

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
        """Combined evidence over a short window: every row drafted one repeated token *and* accepted only the
        bonus (a draft that collapsed onto one token the target rejects). Repeated drafts alone are legal text
        (the target accepts them); a bonus-only stretch alone needs a longer window."""
        s = c.step
        if not s.requests or s.tokens_per_request < 2:
            return
        bonus = all(r.accept_length == 1 for r in s.requests)
        self.stretch_bonus = self.stretch_bonus + [s.index] if bonus else []
        repeated = all(len(r.draft_tokens) >= 2 and len(set(r.draft_tokens)) == 1 for r in s.requests)
        self.stretch_token = self.stretch_token + [s.index] if bonus and repeated else []
        if len(self.stretch_token) == COLLAPSE_VERIFIES:
            toks = sorted({r.draft_tokens[0] for r in s.requests})
            c.v("I35", f"{COLLAPSE_VERIFIES} verifies in a row (steps {self.stretch_token[0]}..{s.index}) where every "
                       f"row drafted one repeated token ({_short(toks)}) and accepted only the bonus: the draft "
                       "collapsed", array="draft_tokens", row=0, found=s.requests[0].draft_tokens,
                expected="varied drafts or accepted ones",
                related=[cell("accept_length", b, None, r.accept_length) for b, r in enumerate(s.requests)])
        if len(self.stretch_bonus) == BONUS_ONLY_VERIFIES and len(self.stretch_token) < COLLAPSE_VERIFIES:
            c.v("I35", f"{BONUS_ONLY_VERIFIES} verifies in a row (steps {self.stretch_bonus[0]}..{s.index}) where "
                       "every row accepted only the bonus token: the draft is useless or the verify attends wrongly",
                array="accept_length", found=1, expected="> 1 somewhere")


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
        self._requests = _Requests()
        self._last: int | None = None  # index of the step fed last
        # Facts the backend does not record (run.config["not_recorded"]): the invariants that need one are skipped
        # rather than judged on a made-up value. A trace without the key skips nothing.
        nr = (run.config.get("not_recorded") if run is not None else None) or {}
        fields = {str(k): str(v) for k, v in (nr.get("fields") or {}).items()}
        self._replay_reason: str | None = nr.get("replay_metadata")
        self._absent: dict[str, str] = {}  # invariant -> the fields it lacks and why
        for inv in CATALOGUE:
            lack = [f for f in inv.facts if f in fields]
            if lack:
                self._absent[inv.check_id] = "; ".join(f"{f}: {fields[f]}" for f in lack)
        self._skip = frozenset(self._absent)
        self._replay_skip = self._skip | {i.check_id for i in CATALOGUE if _METADATA_FACTS & set(i.facts)}
        self._skipped: dict[str, int] = {}  # invariant -> steps it was skipped on
        self._replays_skipped = 0

    @classmethod
    def for_trace(cls, reader: TraceReader) -> Checker:
        """A checker for the steps of `reader`'s trace: its run settings and whether it recorded wait edges."""
        return cls(reader.run, waits_recorded=reader.waits_recorded())

    def not_recorded(self) -> list[tuple[str, str, int]]:
        """(invariant, why, steps skipped) for each invariant skipped because the backend did not record a fact it
        needs: named fields, or the metadata of CUDA-graph replays. Empty for a trace that records everything."""
        out = []
        for inv in CATALOGUE:
            cid = inv.check_id
            if cid in self._absent:
                out.append((cid, self._absent[cid], self._skipped.get(cid, 0)))
            elif cid in self._replay_skip and self._replays_skipped:
                out.append((cid, f"replay metadata: {self._replay_reason}", self._replays_skipped))
        return out

    def feed(self, step: Step) -> list[Violation]:
        """Every violation of `step` (a step whose arrays cannot be checked is an I2 violation, never a crash).

        Steps whose indexes skip (a bundle keeps the original run's numbers, with the captures it adds before its
        range) leave a gap: what the steps in it committed is unknown, so the relations between consecutive steps
        (I32's committed lengths, I35's stretches, I40's iteration) start afresh after it. Captures stay (I15 / I16
        compare a replay with its capture wherever it is), and so do the graph buffers (I19 fires only on a page the
        step's own req_to_token contradicts) and committed pages (I41: a committed slot never moves)."""
        if self._last is not None and step.index > self._last + 1:
            self._accept.gap()
            self._requests.gap()
        self._last = step.index
        skip = self._skip
        if self._replay_reason and step.graph == GraphPhase.REPLAY and not step.arrays and not step.scalars:
            skip = self._replay_skip  # metadata computed inside the graph: nothing recorded to judge
            self._replays_skipped += 1
        for cid in self._absent:
            self._skipped[cid] = self._skipped.get(cid, 0) + 1
        c = _Ctx(step, skip)
        rows_ok = True
        if step.arrays:
            rows_ok = _guard(c, _check_shapes, default=False)
            _guard(c, _check_query_tokens)
            if rows_ok:
                for f in (_check_values, _check_verify_and_extend, _check_context_boundaries, _check_mirror,
                          _check_pages, _check_ownership, _check_tokens, _check_padding, _check_row_pages,
                          _check_row_ownership, _check_identity):
                    _guard(c, f)
                if step.graph == GraphPhase.CAPTURE:
                    _guard(c, _check_capture)
            _guard(c, self._graphs.check)
            _guard(c, lambda c: self._pages.check(c, rows_ok))
            if rows_ok and step.array("attn_q") is not None:
                _guard(c, _check_finite)
                _guard(c, lambda c: c.out.extend(v for v in differential_check([step]) if v.check_id not in c.skip))
        _guard(c, lambda c: _check_streams(c, self._waits_recorded))
        _guard(c, _check_errors)
        _guard(c, self._accept.check)
        if rows_ok:
            _guard(c, self._requests.check)
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
