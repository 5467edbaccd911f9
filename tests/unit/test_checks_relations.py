"""The relations between recorded facts (I36-I42), D1/D2 on non-finite outputs, and facts a backend does not record:
each relation fires on a real clean CPU run with one recorded value changed (written through the public writer) at
the cell it names, with found and expected, and every other step stays quiet."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("torch")

from checkgen import base_run, check, replace_step, roundtrip, set_cells, set_request  # noqa: E402
from specscope.tracer.checks import CATALOGUE, Checker  # noqa: E402
from specscope.tracer.schema import ForwardMode, GraphPhase, Step, Violation  # noqa: E402

R2T, PT = "req_to_token_page_starts", "page_table"


@pytest.fixture(scope="module")
def base() -> tuple:
    return base_run()


@pytest.fixture(scope="module")
def sampled() -> tuple:
    """The same run with layer 0's attention recorded at every step."""
    return base_run(record_attention=1)


def _row(s: Step, rid: int) -> int:
    return next(b for b, r in enumerate(s.requests) if r.request_id == rid)


def _last_of(steps: tuple[Step, ...], rid: int) -> int:
    """Index of the last step that has request `rid` (its final draft extend): no later step compares with it."""
    return max(i for i, s in enumerate(steps) if any(r.request_id == rid for r in s.requests))


def _verify_with(steps: tuple[Step, ...], rows: int, committed_pages: int) -> int:
    """A verify replay with `rows` live rows whose row 0 has at least `committed_pages` fully committed pages."""
    return next(i for i, s in enumerate(steps) if s.mode == ForwardMode.TARGET_VERIFY and s.graph == GraphPhase.REPLAY
                and s.batch_size >= rows and s.requests[0].seq_len_before >= committed_pages * s.page_size)


def _free_page(steps: tuple[Step, ...]) -> int:
    """A physical page no step of the run maps anything to (inside the KV pool)."""
    used = {int(x) for s in steps if (a := s.array(PT)) is not None for x in a.values.ravel()}
    pool = next(int(s.scalars["num_kv_pages"]) for s in steps if "num_kv_pages" in s.scalars)
    return max(p for p in range(1, pool) if p not in used)


def _map_page(s: Step, b: int, j: int, page: int) -> Step:
    """Row b's logical page j mapped to physical page `page`, in req_to_token and the page table alike (so the
    kernel's table agrees with req_to_token cell by cell: I10 stays quiet)."""
    p = s.page_size
    return set_cells(set_cells(s, R2T, lambda v: v.__setitem__((b, j), page * p)), PT,
                     lambda v: v.__setitem__((b, j), page))


def _at(vs: list[Violation], step: int) -> list[tuple[str, str | None, int | None, int | None]]:
    return [(v.check_id, v.array, v.row, v.col) for v in vs if v.step == step]


def _elsewhere(vs: list[Violation], step: int) -> list[Violation]:
    return [v for v in vs if v.step != step]


# ---- I36 distinct pages, I37 no page 0 -------------------------------------------------------------------------

def test_i36_two_logical_pages_of_a_row_on_one_physical_page(tmp_path, base) -> None:
    run, steps = base
    rid = steps[_verify_with(steps, 2, 2)].requests[0].request_id
    i = _last_of(steps, rid)
    s = steps[i]
    b = _row(s, rid)
    first = int(s.array(R2T).values[b, 0])
    vs = check(str(tmp_path / "bad.db"), run, replace_step(steps, i, _map_page(s, b, 1, first // s.page_size)))
    hit = next(v for v in vs if v.check_id == "I36")
    assert (hit.step, hit.array, hit.row, hit.col, hit.request_id) == (s.index, R2T, b, 1, rid)
    assert hit.found == str(first) and hit.expected == "a page other than logical page 0's"
    assert [(c.array, c.row, c.col, c.value) for c in hit.related] == [(R2T, b, 0, str(first))]
    # Logical page 1 moved within the iteration its verify read it in: I40 names that at the same cell.
    assert _at(vs, s.index) == [("I36", R2T, b, 1), ("I40", R2T, b, 1)]
    assert _elsewhere(vs, s.index) == []


def test_i36_judges_the_page_table_where_req_to_token_is_not_recorded(tmp_path, base) -> None:
    run, steps = base
    bare = tuple(dataclasses.replace(s, arrays=tuple(a for a in s.arrays if a.name != R2T)) for s in steps)
    assert check(str(tmp_path / "bare.db"), run, bare) == []
    i = _verify_with(bare, 2, 2)
    s = bare[i]
    page = int(s.array(PT).values[0, 0])
    vs = check(str(tmp_path / "bad.db"), run, replace_step(bare, i, set_cells(s, PT, lambda v: v.__setitem__(
        (0, 1), page))))
    assert _at(vs, s.index) == [("I36", PT, 0, 1)] and _elsewhere(vs, s.index) == []
    assert vs[0].found == str(page) and vs[0].related[0].value == str(page)


def test_i37_a_live_row_mapped_to_the_padding_page(tmp_path, base) -> None:
    run, steps = base
    rid = steps[_verify_with(steps, 2, 2)].requests[0].request_id
    i = _last_of(steps, rid)
    s = steps[i]
    b = _row(s, rid)
    vs = check(str(tmp_path / "bad.db"), run, replace_step(steps, i, _map_page(s, b, 1, 0)))
    hit = next(v for v in vs if v.check_id == "I37")
    assert (hit.array, hit.row, hit.col, hit.found, hit.expected) == (R2T, b, 1, "0", "a page > 0")
    assert _at(vs, s.index) == [("I37", R2T, b, 1), ("I40", R2T, b, 1)] and _elsewhere(vs, s.index) == []


def test_i37_a_live_token_writing_into_the_padding_page(tmp_path, base) -> None:
    run, steps = base
    i = _verify_with(steps, 2, 2)
    s = steps[i]
    T = s.tokens_per_request
    bad = set_cells(s, "out_cache_loc", lambda v: v.__setitem__(T + 1, 3))  # token 1 of row 1
    vs = check(str(tmp_path / "bad.db"), run, replace_step(steps, i, bad))
    hit = next(v for v in vs if v.check_id == "I37")
    assert (hit.array, hit.row, hit.col, hit.found, hit.expected) == ("out_cache_loc", 1, 1, "3", f">= {s.page_size}")
    assert hit.request_id == s.requests[1].request_id
    # The slot is not its position's either: I12 names the same token.
    assert sorted(_at(vs, s.index)) == [("I12", "out_cache_loc", 1, 1), ("I37", "out_cache_loc", 1, 1)]
    assert _elsewhere(vs, s.index) == []


# ---- I38 ownership, I39 identity --------------------------------------------------------------------------------

def test_i38_two_live_rows_in_one_request_slot(tmp_path, base) -> None:
    run, steps = base
    i = _verify_with(steps, 2, 2)
    s = steps[i]
    slot0 = s.requests[0].slot
    bad = set_cells(set_request(s, 1, slot=slot0), "req_pool_indices", lambda v: v.__setitem__(1, slot0))
    vs = check(str(tmp_path / "bad.db"), run, replace_step(steps, i, bad))
    assert _at(vs, s.index) == [("I38", "req_pool_indices", 1, None), ("I38", "slot", 1, None)]
    assert all(v.found == str(slot0) and v.related[0].row == 0 and v.related[0].value == str(slot0) for v in vs)
    assert _elsewhere(vs, s.index) == []  # req_pool_indices == slot: I39 has nothing to say


def test_i38_two_tokens_writing_one_kv_slot(tmp_path, base) -> None:
    run, steps = base
    i = _verify_with(steps, 2, 2)
    s = steps[i]
    T = s.tokens_per_request
    loc = s.array("out_cache_loc").values
    taken = int(loc[0])
    bad = set_cells(s, "out_cache_loc", lambda v: v.__setitem__(T, taken))  # token 0 of row 1
    vs = check(str(tmp_path / "bad.db"), run, replace_step(steps, i, bad))
    hit = next(v for v in vs if v.check_id == "I38")
    assert (hit.array, hit.row, hit.col, hit.found) == ("out_cache_loc", 1, 0, str(taken))
    assert [(c.array, c.row, c.col, c.value) for c in hit.related] == [("out_cache_loc", 0, 0, str(taken))]
    # The same write is also outside its own position's slot (I12) and in a page row 0 owns (I30).
    assert {v.check_id for v in vs if v.step == s.index} == {"I12", "I30", "I38"}
    assert _elsewhere(vs, s.index) == []


def test_i39_req_pool_indices_not_the_request_rows_slot(tmp_path, base) -> None:
    run, steps = base
    i = _verify_with(steps, 2, 2)
    s = steps[i]
    other = max(r.slot for st in steps for r in st.requests) + 1
    vs = check(str(tmp_path / "bad.db"), run, replace_step(steps, i, set_cells(
        s, "req_pool_indices", lambda v: v.__setitem__(1, other))))
    assert _at(vs, s.index) == [("I39", "req_pool_indices", 1, None)] and _elsewhere(vs, s.index) == []
    assert (vs[0].found, vs[0].expected) == (str(other), str(s.requests[1].slot))
    assert [(c.array, c.row, c.value) for c in vs[0].related] == [("slot", 1, str(s.requests[1].slot))]


def test_i39_seq_lens_not_the_request_rows_length(tmp_path, base) -> None:
    """Device seq_lens and its host mirror agree with each other (I34 quiet) but not with the request row."""
    run, steps = base
    i = _verify_with(steps, 2, 2)
    s = steps[i]
    S = s.requests[0].seq_len_before
    bad = set_cells(set_cells(s, "seq_lens", lambda v: v.__setitem__(0, v[0] + 1)), "seq_lens_cpu",
                    lambda v: v.__setitem__(0, v[0] + 1))
    vs = check(str(tmp_path / "bad.db"), run, replace_step(steps, i, bad))
    assert _at(vs, s.index) == [("I39", "seq_lens", 0, None)] and _elsewhere(vs, s.index) == []
    assert (vs[0].found, vs[0].expected) == (str(S + 1), str(S))
    assert [(c.array, c.row, c.value) for c in vs[0].related] == [("seq_len_before", 0, str(S))]


def test_i39_a_verify_row_with_another_window(tmp_path, base) -> None:
    run, steps = base
    i = _verify_with(steps, 2, 2)
    s = steps[i]
    T = s.tokens_per_request
    vs = check(str(tmp_path / "bad.db"), run, replace_step(steps, i, set_request(s, 1, num_q_tokens=T - 1)))
    assert _at(vs, s.index) == [("I39", "num_q_tokens", 1, None)] and _elsewhere(vs, s.index) == []
    assert (vs[0].found, vs[0].expected, vs[0].related[0].array) == (str(T - 1), str(T), "tokens_per_request")


# ---- I40 one iteration, I41 one life ----------------------------------------------------------------------------

def test_i40_a_committed_page_read_differently_within_one_iteration(tmp_path, base) -> None:
    run, steps = base
    rid = steps[_verify_with(steps, 2, 2)].requests[0].request_id
    i = _last_of(steps, rid)
    s = steps[i]
    b = _row(s, rid)
    free = _free_page(steps)
    was = int(s.array(R2T).values[b, 1])
    vs = check(str(tmp_path / "bad.db"), run, replace_step(steps, i, _map_page(s, b, 1, free)))
    assert _at(vs, s.index) == [("I40", R2T, b, 1)] and _elsewhere(vs, s.index) == []
    v = vs[0]
    assert (v.found, v.expected, v.request_id) == (str(free * s.page_size), str(was), rid)
    verify = max(k for k in range(i)
                 if steps[k].iteration == s.iteration and steps[k].mode == ForwardMode.TARGET_VERIFY)
    assert [(c.array, c.col, c.value, c.step) for c in v.related] == [(R2T, 1, str(was), steps[verify].index)]


def test_i40_a_draft_step_starting_from_another_length(tmp_path, base) -> None:
    """The request row of the verify says S + 1 while its draft steps said S; cache_seqlens and seq_lens follow the
    row (I5 / I39 quiet), so only the iteration's relation sees it."""
    run, steps = base
    i = _verify_with(steps, 2, 2)
    s = steps[i]
    T = s.tokens_per_request
    r = s.requests[1]
    bad = set_request(s, 1, seq_len_before=r.seq_len_before + 1)
    for name in ("cache_seqlens", "seq_lens", "seq_lens_cpu"):
        bad = set_cells(bad, name, lambda v: v.__setitem__(1, v[1] + 1))
    bad = set_cells(bad, "cu_seqlens_k", lambda v: v.__setitem__(slice(2, None), v[2:] + 1))
    bad = set_cells(bad, "positions", lambda v: v.__setitem__(slice(T, 2 * T), v[T:2 * T] + 1))
    vs = check(str(tmp_path / "bad.db"), run, replace_step(steps, i, bad))
    hit = [v for v in vs if v.step == s.index and v.check_id == "I40"]
    assert [(v.array, v.row, v.found, v.expected) for v in hit] == [
        ("seq_len_before", 1, str(r.seq_len_before + 1), str(r.seq_len_before))]
    first = next(k for k in range(i) if steps[k].iteration == s.iteration)  # the extend that joined the request
    field = "seq_len_after" if steps[first].mode == ForwardMode.EXTEND else "seq_len_before"
    assert [(c.array, c.step, c.value) for c in hit[0].related] == [
        (field, steps[first].index, str(r.seq_len_before))]
    assert {v.check_id for v in vs if v.step == s.index} - {"I40", "I12", "I31"} == set()


def test_i41_committed_kv_moved_between_iterations(tmp_path, base) -> None:
    """From one draft step on, a committed page of a request maps to another page for the rest of its life: I41
    fires once, where it moved (every later step agrees with the new page)."""
    run, steps = base
    rid = steps[_verify_with(steps, 2, 2)].requests[0].request_id
    life = [i for i, s in enumerate(steps) if any(r.request_id == rid for r in s.requests)]
    at = next(i for i in life if steps[i].iteration > steps[life[0]].iteration + 2
              and steps[i].mode == ForwardMode.DRAFT_DECODE)
    free = _free_page(steps)
    bad = list(steps)
    for i in life:
        if i >= at:
            bad[i] = _map_page(steps[i], _row(steps[i], rid), 1, free)
    vs = check(str(tmp_path / "bad.db"), run, bad)
    s = steps[at]
    b = _row(s, rid)
    assert _at(vs, s.index) == [("I41", R2T, b, 1)] and _elsewhere(vs, s.index) == []
    v = vs[0]
    assert (v.found, v.expected) == (str(free * s.page_size), str(int(s.array(R2T).values[b, 1])))
    assert v.related[0].step == steps[max(i for i in life if i < at)].index
    assert "committed positions 16..31" in v.message


# ---- I42 finite attention records, D1 / D2 on NaN -----------------------------------------------------------------

def _sampled_verify(steps: tuple[Step, ...], padded: bool) -> int:
    return next(i for i, s in enumerate(steps) if s.mode == ForwardMode.TARGET_VERIFY and s.array("attn_q") is not None
                and (s.padded_batch_size > s.batch_size) == padded)


def test_the_sampled_run_is_clean(tmp_path, sampled) -> None:
    run, steps = sampled
    assert check(str(tmp_path / "t.db"), run, steps) == []


def test_a_nan_in_a_live_output_is_i42_and_a_d1_d2_mismatch(tmp_path, sampled) -> None:
    run, steps = sampled
    i = _sampled_verify(steps, padded=False)
    s = steps[i]
    T = s.tokens_per_request
    bad = set_cells(s, "attn_out", lambda v: v.__setitem__((T + 2, 5), np.nan))  # token 2 of row 1
    vs = check(str(tmp_path / "bad.db"), run, replace_step(steps, i, bad))
    assert _elsewhere(vs, s.index) == []
    assert [(v.check_id, v.array, v.row, v.col) for v in vs] == [
        ("I42", "attn_out", 1, 2), ("D1", "attn_out", 1, None), ("D2", "attn_out", 1, None)]
    assert (vs[0].found, vs[0].expected) == ("nan", "finite")
    assert all("non-finite" in v.message and v.found == "rel. error nan" for v in vs[1:])


def test_a_nan_in_the_kv_a_live_row_reads(tmp_path, sampled) -> None:
    run, steps = sampled
    i = _sampled_verify(steps, padded=False)
    s = steps[i]
    ids = s.array("attn_page_ids").values
    k = int(np.nonzero(ids == int(s.array(PT).values[0, 0]))[0][0])  # row 0's first page
    vs = check(str(tmp_path / "bad.db"), run, replace_step(steps, i, set_cells(s, "attn_kv", lambda v: v.__setitem__(
        (k, 0, 0, 3, 7), np.inf))))
    assert _elsewhere(vs, s.index) == []
    assert [(v.check_id, v.array, v.row, v.col) for v in vs][0] == ("I42", "attn_kv", None, 0)
    assert vs[0].found == "inf" and {v.check_id for v in vs[1:]} <= {"D1", "D2"} and any(
        v.check_id == "D1" and v.row == 0 for v in vs)


def test_non_finite_garbage_where_the_contract_allows_it_is_quiet(tmp_path, sampled) -> None:
    """Padded rows' query and output tokens and the reserved page 0 may hold anything."""
    run, steps = sampled
    i = _sampled_verify(steps, padded=True)
    s = steps[i]
    T, live = s.tokens_per_request, s.batch_size
    ids = s.array("attn_page_ids").values
    bad = set_cells(s, "attn_out", lambda v: v.__setitem__(slice(live * T, None), np.nan))
    bad = set_cells(bad, "attn_q", lambda v: v.__setitem__(slice(live * T, None), np.inf))
    bad = set_cells(bad, "attn_kv", lambda v: v.__setitem__(int(np.nonzero(ids == 0)[0][0]), np.nan))
    assert check(str(tmp_path / "pad.db"), run, replace_step(steps, i, bad)) == []


# ---- facts the backend does not record ----------------------------------------------------------------------------

def _feed(path: str, run, steps) -> tuple[list[Violation], list[tuple[str, str, int]]]:
    run, back = roundtrip(path, run, steps)
    checker = Checker(run)
    vs = [v for s in back for v in checker.feed(s)]
    return vs, checker.not_recorded()


def test_an_absent_max_seq_len_k_is_not_recorded_never_a_made_up_value(tmp_path, base) -> None:
    """A backend without max_seq_len_k (SGLang 0.5.14+): I9, the only check that reads it, says "not recorded" on
    every step, and a stray value is judged neither way."""
    run, steps = base
    why = "TRTLLMMHAMetadata has no max_seq_len_k in SGLang 0.5.14"
    absent = dataclasses.replace(run, config={**run.config, "not_recorded": {"fields": {"max_seq_len_k": why}}})
    stripped = [dataclasses.replace(s, scalars={k: v for k, v in s.scalars.items() if k != "max_seq_len_k"})
                for s in steps]
    vs, nr = _feed(str(tmp_path / "absent.db"), absent, stripped)
    assert vs == [] and nr == [("I9", f"max_seq_len_k: {why}", len(steps))]
    assert [i.check_id for i in CATALOGUE if "max_seq_len_k" in i.facts] == ["I9"]
    # A value the backend would have to make up (one too small) is not judged either.
    i = _verify_with(steps, 2, 2)
    made_up = replace_step(tuple(stripped), i, dataclasses.replace(stripped[i], scalars={
        **stripped[i].scalars, "max_seq_len_k": 1}))
    vs, nr = _feed(str(tmp_path / "made-up.db"), absent, made_up)
    assert vs == [] and [x[0] for x in nr] == ["I9"]
    # The same value in a trace that records the field is an I9 violation.
    vs, nr = _feed(str(tmp_path / "recorded.db"), run, replace_step(steps, i, dataclasses.replace(
        steps[i], scalars={**steps[i].scalars, "max_seq_len_k": 1})))
    assert [(v.check_id, v.step) for v in vs] == [("I9", steps[i].index)] and nr == []


def test_replays_without_metadata_are_not_recorded_and_their_request_rows_still_judged(tmp_path, base) -> None:
    """Metadata computed inside the graph (SGLang 0.5.15+): a replay records its header, request rows and spans."""
    run, steps = base
    why = "computed inside the graph (SGLang 0.5.15+)"
    inside = dataclasses.replace(run, config={**run.config, "not_recorded": {"replay_metadata": why}})
    bare = tuple(dataclasses.replace(s, arrays=(), scalars={}) if s.graph == GraphPhase.REPLAY else s for s in steps)
    replays = sum(s.graph == GraphPhase.REPLAY for s in steps)
    vs, nr = _feed(str(tmp_path / "inside.db"), inside, bare)
    assert vs == [] and nr
    metadata = {i.check_id for i in CATALOGUE if set(i.facts) & {"cache_seqlens", "page_table", "max_seq_len_q",
                                                                 "data_ptr", "out_cache_loc"}}
    assert metadata <= {cid for cid, _, _ in nr} and "I31" not in {cid for cid, _, _ in nr}
    assert all(reason == f"replay metadata: {why}" and n == replays for _, reason, n in nr)
    # What a bare replay does record (its request rows) is still judged: a wrong accept length is I31.
    i = _verify_with(steps, 2, 2)
    b = next(k for k, r in enumerate(bare[i].requests) if r.accept_length >= 1)
    vs, _ = _feed(str(tmp_path / "bad.db"), inside, replace_step(bare, i, set_request(bare[i], b, accept_length=0)))
    assert [(v.check_id, v.step, v.row) for v in vs] == [("I31", steps[i].index, b)]


# ---- messages name the relation -----------------------------------------------------------------------------------

def test_i6_names_max_seq_len_q_beside_the_kernel_query_length(tmp_path, base) -> None:
    run, steps = base
    i = _verify_with(steps, 2, 2)
    s = steps[i]
    T = s.tokens_per_request
    bad = dataclasses.replace(s, scalars={**s.scalars, "kernel_q_len": T + 1})
    vs = check(str(tmp_path / "bad.db"), run, replace_step(steps, i, bad))
    hit = next(v for v in vs if v.check_id == "I6")
    assert (hit.array, hit.found, hit.expected) == ("kernel_q_len", str(T + 1), str(T))
    assert [(c.array, c.value) for c in hit.related] == [("max_seq_len_q", str(s.scalars["max_seq_len_q"]))]
    assert f"max_seq_len_q = {s.scalars['max_seq_len_q']}" in hit.message


def test_i19_counts_the_cells_the_page_table_grid_marks_stale() -> None:
    import os
    import re

    from specscope.tracer.checks import check_steps
    from specscope.tracer.store import TraceReader
    from specscope.ui.views import CellKind, page_grid

    here = os.path.join(os.path.dirname(__file__), "..", "data", "v1", "cpu-fault-stale-page-table.db")
    with TraceReader(here) as r:
        steps = {s.index: s for s in r.steps()}
        vs = [v for v in check_steps(steps.values(), r.run, waits_recorded=False) if v.check_id == "I19"]
    assert vs
    for v in vs:
        grid = page_grid(steps[v.step])
        assert grid is not None and v.row is not None
        marked = sum(c.kind == CellKind.STALE for c in grid.cells[v.row])
        said = re.search(r"\((\d+) stale cells in this row, (\d+) of them left over", v.message)
        assert said and int(said[1]) == marked >= int(said[2]) >= 1, v.message
