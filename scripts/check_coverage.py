#!/usr/bin/env python
"""The fact-coverage matrix: every recorded field x the relation kinds that constrain it, from the catalogue.

    python scripts/check_coverage.py            # print the matrix (markdown)
    python scripts/check_coverage.py --write    # replace its section in docs/checks.md
    python scripts/check_coverage.py --check    # exit 1 if docs/checks.md is stale or a cell is unjustified

A cell lists the invariants whose declared facts (`Invariant.facts`) include the field and whose relation kinds
(`Invariant.relations`) include the column. An empty cell carries a one-line justification from JUSTIFY (keyed by
(field, kind), else by (the field's group, kind)); the script fails on an empty cell that has none, so a new field
or invariant cannot leave a hole unexplained.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specscope.tracer.checks import (
    ACCEPTANCE,
    CAPTURE,
    CATALOGUE,
    FACTS,
    IDENTITY,
    ITERATION,
    LIFE,
    NUMERICS,
    RELATIONS,
    ROW,
    ROWS,
)

KINDS = (ROW, ROWS, IDENTITY, ITERATION, LIFE, CAPTURE, NUMERICS, ACCEPTANCE)
DOC = Path(__file__).resolve().parents[1] / "docs" / "checks.md"
BEGIN, END = "<!-- fact-coverage:begin (scripts/check_coverage.py) -->", "<!-- fact-coverage:end -->"

_INT = "an integer: no NaN / Inf to find; its values are judged by the other columns"
_NOT_ACC = "not an acceptance fact (acceptance is drafts, accepted tokens, accept length and the lengths they commit)"
_STEP_LIFE = "a per-step value; what a request carries across its life is its committed length (I32) and pages (I41)"
_STEP_IT = "a per-step value; each step ties it to the request's length and pages, which I40 ties across the iteration"

# (field or group, kind) -> why no invariant relates it that way.
JUSTIFY: dict[tuple[str, str], str] = {
    # group defaults
    ("step", NUMERICS): _INT, ("scalar", NUMERICS): _INT, ("row", NUMERICS): _INT, ("run", NUMERICS): "a setting",
    ("step", ACCEPTANCE): _NOT_ACC, ("scalar", ACCEPTANCE): _NOT_ACC, ("array", ACCEPTANCE): _NOT_ACC,
    ("span", ACCEPTANCE): _NOT_ACC, ("row", ACCEPTANCE): _NOT_ACC,
    ("array", LIFE): _STEP_LIFE, ("scalar", LIFE): _STEP_LIFE, ("step", LIFE): _STEP_LIFE,
    ("array", ITERATION): _STEP_IT, ("scalar", ITERATION): _STEP_IT, ("step", ITERATION): _STEP_IT,
    ("row", CAPTURE): "request rows are host bookkeeping: a capture has none and the graph never reads them",
    ("step", CAPTURE): "part of the key a replay is matched to its capture by (model, mode, step id, padded bs)",
    ("scalar", CAPTURE): "not frozen by the graph (recomputed by every replay's prep); frozen ones are I16's",
    ("array", CAPTURE): "its contents change every replay by design; its address is I15's where the graph binds it",
    ("span", ROW): "spans and wait edges are per step, not per row: their order is I21 / I22, errors K1 / I28",
    ("span", ROWS): "per step, not per row (I21 / I22 / K1 / I28 judge them)",
    ("span", IDENTITY): "per step, not per row (I21 / I22 / K1 / I28 judge them)",
    ("span", ITERATION): "the stream order within a step (I21 / I22); no ordering across steps is recorded",
    ("span", LIFE): "per step, not per request",
    ("span", CAPTURE): "a replay records its own spans; the graph freezes no times",
    ("span", NUMERICS): "integer nanoseconds (host or %globaltimer)",
    ("run", ROWS): "one setting per run", ("run", IDENTITY): "one setting per run",
    ("run", ITERATION): "one setting per run", ("run", LIFE): "one setting per run",
    ("run", CAPTURE): "one setting per run",
    ("row", ROWS): "a request's own field; rows share nothing through it (ownership is of pages, slots and ids)",
    # step header
    ("batch_size", ROW): "the number of live rows: it selects the rows, it is not a row's value",
    ("batch_size", IDENTITY): "== the number of request rows (I2, form)",
    ("padded_batch_size", ROW): "the number of rows the kernel ran; I2 ties every array's rows to it",
    ("padded_batch_size", IDENTITY): "the captured graph size; I2 ties every array's rows to it",
    ("num_draft_tokens", ROW): "K configures the graph buffers; the kernel runs T (tokens_per_request), judged by I6",
    ("num_draft_tokens", ROWS): "K configures the graph buffers; I7 warns where cu_seqlens_q keeps stride K",
    ("num_draft_tokens", IDENTITY): "K may differ from T by design (--verify-tokens); I6 judges the T the kernel runs",
    ("page_size", ROWS): "one page size per run; I29 / I30 use it to map slots to pages",
    ("step_id", ROWS): "one draft step per step, the same for every row",
    ("iteration", ROW): "one iteration per step", ("iteration", ROWS): "one iteration per step",
    ("iteration", IDENTITY): "the scheduler's counter; no kernel index comes from it",
    ("mode", ROWS): "one mode per step", ("mode", LIFE): "a request's modes follow the loop; its lengths are I32's",
    ("graph", ROW): "one phase per step", ("graph", IDENTITY): "the phase selects I15-I19, it is not a row index",
    ("graph", ITERATION): "eager and replayed steps of one iteration are held to the same relations (I40)",
    ("tokens_per_request", LIFE): _STEP_LIFE,
    # scalars
    ("max_seq_len_q", ROW): "a bound over rows, not a row value; I6 / I8 tie it to T",
    ("max_seq_len_q", ROWS): "== T for every uniform or draft-extend row (I6 / I8)",
    ("kernel_q_len", ACCEPTANCE): _NOT_ACC,
    ("max_seq_len_k", ROW): "a bound over the rows (I9, across rows)",
    ("max_seq_len_k", IDENTITY): "a bound, not a per-row index",
    ("max_context_len", ROW): "a pool bound: cache_seqlens <= it (I14, form)",
    ("max_context_len", ROWS): "a pool bound (I14, form)", ("max_context_len", IDENTITY): "a pool bound (I14, form)",
    ("num_kv_pages", ROW): "a pool bound: page ids < it (I14, form)",
    ("num_kv_pages", ROWS): "a pool bound (I14, form)", ("num_kv_pages", IDENTITY): "a pool bound (I14, form)",
    ("seq_len_fill_value", ROW): "applies to padded rows only (I18, across rows)",
    ("seq_len_fill_value", IDENTITY): "padded rows have no request row to agree with",
    ("seq_len_fill_value", CAPTURE): "the replay's padded rows must hold it (I18 at each replay)",
    ("captured_max_seq_len_q", ROW): "frozen at capture, judged against the replay (I16)",
    ("captured_max_seq_len_q", ROWS): "frozen at capture, judged against the replay (I16)",
    ("captured_max_seq_len_q", IDENTITY): "frozen at capture, judged against the replay (I16)",
    ("backend_num_draft_tokens", ROW): "the backend's K, reported in I6's message; the kernel runs kernel_q_len",
    ("backend_num_draft_tokens", ROWS): "the backend's K; the kernel runs kernel_q_len (I6)",
    ("backend_num_draft_tokens", IDENTITY): "the backend's K may differ from T by design (--verify-tokens)",
    ("backend_num_draft_tokens", CAPTURE): "the backend's K; what the graph froze is captured_* (I16)",
    # arrays
    ("cu_seqlens_q", IDENTITY): "its spans are tied to the request rows' query tokens (I33) and T (I7 / I8)",
    ("cu_seqlens_k", IDENTITY): "the prefix sum of cache_seqlens (I4), which I5 ties to the request rows",
    ("cu_seqlens_k", NUMERICS): _INT, ("cu_seqlens_q", NUMERICS): _INT, ("seq_lens", NUMERICS): _INT,
    ("seq_lens_cpu", NUMERICS): _INT, ("req_pool_indices", NUMERICS): _INT, ("out_cache_loc", NUMERICS): _INT,
    ("data_ptr", NUMERICS): _INT, ("dtype_shape", NUMERICS): "a dtype and a shape",
    ("seq_lens_cpu", IDENTITY): "the host mirror == the device seq_lens (I34), which I39 ties to the request rows",
    ("req_pool_indices", ROW): "a row's slot is one value; what it indexes (req_to_token) is I10's",
    ("out_cache_loc", IDENTITY): "== the slot of each position through the page table (I12), tied to req_to_token",
    ("positions", IDENTITY): "== cache_seqlens - q + t (I13), and cache_seqlens follows the request row (I5)",
    ("positions", ROWS): "per token; padded rows' positions are left as the static buffer holds them (not copied)",
    ("data_ptr", ROWS): "addresses are per array, not per row",
    ("data_ptr", IDENTITY): "addresses are per array, not per row",
    ("dtype_shape", ROW): "dtype / shape are per array (I1 / I2, form)",
    ("dtype_shape", ROWS): "row counts agree across arrays (I2, form)",
    ("dtype_shape", IDENTITY): "row counts == bs / padded bs (I2, form)",
    ("dtype_shape", CAPTURE): "a replayed array has its capture's address (I15); its shape follows the bs (I2)",
    ("seq_lens", CAPTURE): _STEP_IT.replace("I40 ties across the iteration", "I15 binds to the captured address"),
    ("seq_lens_cpu", CAPTURE): "a host mirror: replay prep reads it on the host, the graph holds no address of it",
    ("out_cache_loc", CAPTURE): "integrations record the live tensor replay copies from (SGLang), not the buffer",
    ("positions", CAPTURE): "integrations record the live tensor replay copies from (SGLang), not the buffer",
    ("req_pool_indices", CAPTURE): "contents change every replay; the address is I15's",
    ("cu_seqlens_q", CAPTURE): "contents change every replay; the address is I15's",
    ("cu_seqlens_k", CAPTURE): "contents change every replay; the address is I15's",
    ("cache_seqlens", CAPTURE): "contents change every replay; the address is I15's, left-over pages I19's",
    ("page_table", CAPTURE): "contents change every replay; the address is I15's, left-over cells I19's",
    ("positions", ITERATION): "== cache_seqlens - q + t in each step (I13); the lengths are I40's",
    ("out_cache_loc", ITERATION): "== the slot of each position in each step (I12); the pages are I40's",
    ("page_table", ITERATION): "== req_to_token in each step (I10); req_to_token is I40's",
    ("page_table", LIFE): "== req_to_token in each step (I10); req_to_token is I41's",
    ("out_cache_loc", LIFE): "writes go to positions >= S (I12 / I13); the committed slots are I41's",
    ("attn_q", ROW): "a recorded copy: the differential recomputation (D1 / D2) judges it as a whole row",
    ("attn_out", ROW): "a recorded copy: D1 / D2 judge it per row against the recomputation",
    ("attn_kv", ROW): "a recorded copy of the pages the live rows read; D1 / D2 gather it per row",
    ("attn_page_ids", ROW): "the ids of the copied pages; D1 / D2 look pages up by them",
    ("attn_scaling", ROW): "one softmax scale per call",
    ("dtype_shape", ITERATION): "dtype / shape are per array (I1 / I2)", ("dtype_shape", LIFE): "per array",
    ("data_ptr", ITERATION): "addresses of eager steps may change freely; replays' are I15's",
    ("data_ptr", LIFE): "addresses are per array, not per request",
    # requests
    ("request_id", ROW): "the row's name; the other fields are judged under it",
    ("request_id", IDENTITY): "SGLang's backend sees no ids (request_id = slot); the slot is I39's",
    ("request_id", CAPTURE): "a capture has no requests",
    ("slot", ROW): "a row's slot is one value; I39 ties it to req_pool_indices",
    ("slot", ITERATION): "== req_pool_indices in every step (I39), whose req_to_token row I40 follows",
    ("slot", LIFE): "a retracted request may come back in another slot; its committed pages are I41's",
    ("num_q_tokens", LIFE): "per forward; the committed lengths it adds up to are I32's",
    ("num_q_tokens", ACCEPTANCE): "the window a verify runs (T, I39); acceptance is judged on what it accepts",
    ("draft_tokens", ROWS): "a row's own drafts; I35 pools the rows' evidence",
    ("draft_tokens", IDENTITY): "no kernel index comes from the drafts",
    ("draft_tokens", ITERATION): "drafted by this iteration's draft steps, which record no tokens to compare with",
    ("draft_tokens", LIFE): "drafts of one verify only",
    ("accepted_tokens", ROWS): "a row's own tokens", ("accepted_tokens", IDENTITY): "no kernel index comes from them",
    ("accepted_tokens", ITERATION): "the draft extend records no tokens to compare with",
    ("accepted_tokens", LIFE): "their count commits the length (I31), which I32 carries",
    ("accept_length", ROWS): "a row's own count; I35 pools the rows' evidence",
    ("accept_length", IDENTITY): "no kernel index comes from it",
    ("accept_length", LIFE): "commits seq_len_after (I31), which I32 carries to the next iteration",
    ("seq_len_before", ROWS): "a request's own length", ("seq_len_after", ROWS): "a request's own length",
    ("seq_len_after", CAPTURE): "a capture has no requests",
    ("temperature", ROW): "a run setting: it selects I31's greedy rule",
}

for _a in ("attn_q", "attn_out", "attn_kv", "attn_page_ids", "attn_scaling"):
    JUSTIFY[(_a, ROWS)] = "a sampled copy of one call; D2 recomputes each row from its own KV, so a row that reads " \
                          "another's pages differs"
    JUSTIFY[(_a, IDENTITY)] = "a sampled copy; D2 recomputes it from the request's own req_to_token and positions"
    JUSTIFY[(_a, CAPTURE)] = "the recorder's copy at sampled steps, not a graph input"


def cell_ids(fact: str, kind: str) -> list[str]:
    """The invariants relating `fact` by `kind`."""
    return [i.check_id for i in CATALOGUE if fact in i.facts and kind in i.relations]


def matrix() -> tuple[str, list[str]]:
    """The markdown section and the (fact, kind) cells that are empty and unjustified."""
    group_of = {f: g for g, fs in FACTS.items() for f in fs}
    missing = []
    notes: dict[str, int] = {}
    lines = [BEGIN, "", "## Fact coverage", "",
             "Made by `python scripts/check_coverage.py --write` from each invariant's declared facts and relation "
             "kinds (`Invariant.facts`, `Invariant.relations`). A cell names the invariants that constrain the field "
             "by that kind of relation; an empty cell's number is the note below that says why none does. Kinds: "
             + "; ".join(f"**{k}**: {RELATIONS[k]}" for k in KINDS) + ".", "",
             "| group | field | " + " | ".join(KINDS) + " |", "|---|---|" + "---|" * len(KINDS)]
    for group, fields in FACTS.items():
        for f in fields:
            row = []
            for k in KINDS:
                ids = cell_ids(f, k)
                if ids:
                    row.append(", ".join(ids))
                    continue
                why = JUSTIFY.get((f, k)) or JUSTIFY.get((group_of[f], k))
                if why is None:
                    missing.append(f"{f} x {k}")
                    row.append("**?**")
                    continue
                row.append(f"({notes.setdefault(why, len(notes) + 1)})")
            lines.append(f"| {group} | `{f}` | " + " | ".join(row) + " |")
    lines += ["", "Notes on empty cells:", ""]
    lines += [f"{n}. {why}" for why, n in sorted(notes.items(), key=lambda kv: kv[1])]
    lines += ["", END]
    return "\n".join(lines), missing


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="replace the section in docs/checks.md")
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/checks.md is stale or a cell unjustified")
    args = ap.parse_args()
    text, missing = matrix()
    for m in missing:
        print(f"unjustified empty cell: {m}", file=sys.stderr)
    doc = DOC.read_text()
    if BEGIN in doc and END in doc:
        new = doc[: doc.index(BEGIN)] + text + doc[doc.index(END) + len(END):]
    else:
        head, sep, tail = doc.partition("\n## Faults")
        new = head.rstrip("\n") + "\n\n" + text + "\n" + sep + tail
    if args.write:
        DOC.write_text(new)
    elif args.check:
        if new != doc:
            print("docs/checks.md: the fact-coverage section is stale (run with --write)", file=sys.stderr)
            return 1
    else:
        print(text)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
