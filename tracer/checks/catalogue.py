"""The invariant catalogue (`reference/sglang-trtllm-mha.md` §7): each invariant's id, severity, assertion and
origin, and the recorded facts and relation kinds it judges.

CATALOGUE's order is the check order every listing follows (`check --list`, docs/checks.md, `not_recorded`).
scripts/check_coverage.py builds the fact-coverage matrix from FACTS, RELATIONS and each entry's facts / relations.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..schema import Severity

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
METADATA_FACTS = frozenset(FACTS["array"]) | frozenset(FACTS["scalar"])

COLLAPSE_VERIFIES = 4  # I35: consecutive verifies of combined evidence (repeated drafts and bonus-only rows)
BONUS_ONLY_VERIFIES = 16  # I35: consecutive verifies where every row accepted only the bonus token
