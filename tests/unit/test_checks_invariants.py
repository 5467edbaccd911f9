"""The value-based invariants added in trace v2 (I29-I35, I18, I19, I2): each fires on a trace that breaks it,
built by changing one recorded value of a real clean run and writing it through the public writer, and stays
quiet on the unchanged trace."""

from __future__ import annotations

import dataclasses
import os

import pytest

pytest.importorskip("torch")

from checkgen import (  # noqa: E402
    base_run,
    check,
    find,
    ids,
    replace_step,
    set_cells,
    set_request,
    verify_replay,
)
from specscope.tracer.checks import BONUS_ONLY_VERIFIES, COLLAPSE_VERIFIES  # noqa: E402
from specscope.tracer.schema import ForwardMode, GraphPhase, RequestState, Step  # noqa: E402


@pytest.fixture(scope="module")
def base() -> tuple:
    return base_run()


def test_the_base_run_is_clean(tmp_path, base) -> None:
    run, steps = base
    assert check(str(tmp_path / "t.db"), run, steps) == []


def test_i29_page_owned_by_two_live_requests(tmp_path, base) -> None:
    run, steps = base
    i = find(steps, verify_replay)
    s = steps[i]
    p = s.page_size
    page = int(s.array("req_to_token_page_starts").values[0, 0]) // p

    # Row 1's first page becomes row 0's first page, in req_to_token and in the page table the kernel read.
    bad = set_cells(set_cells(s, "req_to_token_page_starts", lambda v: v.__setitem__((1, 0), page * p)),
                    "page_table", lambda v: v.__setitem__((1, 0), page))
    vs = check(str(tmp_path / "bad.db"), run, replace_step(steps, i, bad))
    hit = [v for v in vs if v.check_id == "I29"]
    assert hit and hit[0].step == s.index and hit[0].array == "req_to_token_page_starts"
    assert (hit[0].row, hit[0].col, hit[0].found) == (1, 0, str(page))
    assert "I10" not in ids(vs)  # the kernel's table matches req_to_token: only the ownership is wrong


def test_i30_write_slot_in_another_requests_page(tmp_path, base) -> None:
    run, steps = base
    i = find(steps, verify_replay)
    s = steps[i]
    other = int(s.array("req_to_token_page_starts").values[0, 0]) + 3  # a slot in row 0's first page
    first_of_row1 = s.tokens_per_request  # uniform verify: row 1 starts at token T
    bad = set_cells(s, "out_cache_loc", lambda v: v.__setitem__(first_of_row1, other))
    vs = check(str(tmp_path / "bad.db"), run, replace_step(steps, i, bad))
    hit = [v for v in vs if v.check_id == "I30"]
    assert hit and (hit[0].array, hit[0].row, hit[0].col, hit[0].found) == ("out_cache_loc", 1, 0, str(other))
    assert hit[0].request_id == s.requests[1].request_id


def _verify(steps: tuple[Step, ...]) -> int:
    return find(steps, lambda s: s.mode == ForwardMode.TARGET_VERIFY and s.iteration >= 0 and
                any(r.accept_length >= 2 for r in s.requests))


@pytest.mark.parametrize("case", ["zero", "too-long", "after", "not-prefix"])
def test_i31_acceptance_consistency(tmp_path, base, case: str) -> None:
    run, steps = base
    i = _verify(steps)
    s = steps[i]
    b = next(k for k, r in enumerate(s.requests) if r.accept_length >= 2)
    r = s.requests[b]
    T = s.tokens_per_request
    change = {
        "zero": dict(accept_length=0),
        "too-long": dict(accept_length=T + 1),
        "after": dict(seq_len_after=r.seq_len_after + 1),
        "not-prefix": dict(accepted_tokens=((r.accepted_tokens[0] + 1) % 256,) + r.accepted_tokens[1:]),
    }[case]
    vs = check(str(tmp_path / "bad.db"), run, replace_step(steps, i, set_request(s, b, **change)))
    hit = [v for v in vs if v.check_id == "I31" and v.step == s.index]
    assert len(hit) == 1 and hit[0].row == b and hit[0].request_id == r.request_id


def test_i31_greedy_bonus_must_differ_from_the_next_draft(tmp_path, base) -> None:
    run, steps = base
    i = find(steps, lambda s: s.mode == ForwardMode.TARGET_VERIFY and s.iteration >= 0 and
             any(r.accept_length < len(r.draft_tokens) + 1 for r in s.requests))
    s = steps[i]
    b = next(k for k, r in enumerate(s.requests) if r.accept_length < len(r.draft_tokens) + 1)
    r = s.requests[b]
    n = r.accept_length
    acc = r.accepted_tokens[:-1] + (r.draft_tokens[n - 1],)  # the "bonus" equals the rejected draft
    bad = replace_step(steps, i, set_request(s, b, accepted_tokens=acc))
    vs = check(str(tmp_path / "greedy.db"), run, bad)
    assert [(v.check_id, v.row, v.col) for v in vs if v.step == s.index] == [("I31", b, n - 1)]
    sampled = dataclasses.replace(run, config={**run.config, "temperature": 0.7})  # rejection sampling may do it
    assert check(str(tmp_path / "sampled.db"), sampled, bad) == []


def test_i32_next_iteration_starts_from_the_committed_length(tmp_path, base) -> None:
    run, steps = base
    i = _verify(steps)
    s, r = steps[i], steps[i].requests[0]
    j = find(steps, lambda t: t.iteration > s.iteration and any(q.request_id == r.request_id for q in t.requests))
    t = steps[j]
    b = next(k for k, q in enumerate(t.requests) if q.request_id == r.request_id)
    bad = set_request(t, b, seq_len_before=t.requests[b].seq_len_before - 1)
    vs = check(str(tmp_path / "bad.db"), run, replace_step(steps, j, bad))
    hit = [v for v in vs if v.check_id == "I32"]
    assert hit and hit[0].step == t.index and hit[0].expected == str(r.seq_len_after)


def test_i33_every_context_boundary(tmp_path, base) -> None:
    run, steps = base
    i = find(steps, lambda s: s.mode == ForwardMode.EXTEND and s.batch_size >= 2)
    s = steps[i]
    bad = set_cells(s, "cu_seqlens_q", lambda v: v.__setitem__(1, v[1] + 1))  # last boundary untouched
    vs = check(str(tmp_path / "bad.db"), run, replace_step(steps, i, bad))
    hit = [v for v in vs if v.check_id == "I33"]
    assert hit and (hit[0].array, hit[0].col) == ("cu_seqlens_q", 1)
    assert "I3" not in ids(vs)  # the old check looked at the last boundary only


def test_i34_cpu_mirror_against_device_seq_lens(tmp_path, base) -> None:
    run, steps = base
    i = find(steps, verify_replay)
    bad = set_cells(steps[i], "seq_lens_cpu", lambda v: v.__setitem__(0, v[0] + 5))
    vs = check(str(tmp_path / "bad.db"), run, replace_step(steps, i, bad))
    hit = [v for v in vs if v.check_id == "I34"]
    assert hit and (hit[0].row, hit[0].array) == (0, "seq_lens_cpu")


def _verifies(n: int, drafts: tuple[int, ...], bonus_only: bool) -> list[Step]:
    """n verify steps (requests only, no arrays) of one request advancing by its accept length."""
    out, seq = [], 100
    for k in range(n):
        acc = (9,) if bonus_only else drafts[:1] + (9,)
        out.append(Step(index=k, iteration=k, mode=ForwardMode.TARGET_VERIFY, model="target", step_id=None,
                        batch_size=1, padded_batch_size=1, graph=GraphPhase.EAGER, tokens_per_request=4,
                        num_draft_tokens=4, page_size=16, start_ns=k, end_ns=k + 1,
                        requests=(RequestState(7, 1, seq, seq + len(acc), 4, drafts, acc, len(acc)),)))
        seq += len(acc)
    return out


@pytest.mark.parametrize("drafts,bonus_only,window,array", [((5, 5, 5), True, COLLAPSE_VERIFIES, "draft_tokens"),
                                                             ((3, 5, 8), True, BONUS_ONLY_VERIFIES, "accept_length")])
def test_i35_acceptance_collapse_warning(tmp_path, base, drafts, bonus_only, window, array) -> None:
    run, _ = base
    short = check(str(tmp_path / "short.db"), run, _verifies(window - 1, drafts, bonus_only))
    assert short == []
    vs = check(str(tmp_path / "long.db"), run, _verifies(window + 3, drafts, bonus_only))
    assert [(v.check_id, v.severity.value, v.step, v.array) for v in vs] == [
        ("I35", "warning", window - 1, array)]  # once per stretch


def test_i35_repeated_text_the_target_accepts_is_legal(tmp_path, base) -> None:
    run, _ = base
    assert check(str(tmp_path / "rep.db"), run, _verifies(BONUS_ONLY_VERIFIES + 3, (5, 5, 5), False)) == []


def test_i18_padded_verify_rows_spanning_two_pages_are_fine(tmp_path) -> None:
    """T = 16 with page 16: a padded row reads fill + T = 17 positions, two columns of page 0 (no violation)."""
    run, steps = base_run(batch_size=6, num_requests=9, max_new_tokens=8, spec_steps=3, verify_tokens=16,
                          plan_stream=False)
    padded = [s for s in steps if s.mode == ForwardMode.TARGET_VERIFY and s.padded_batch_size > s.batch_size]
    assert padded and all(int(s.array("cache_seqlens").values[-1]) == 17 for s in padded)
    # I7 warns by design: T (16) != K (4), and the static graph buffer keeps stride K (the kernel never reads it).
    assert [v for v in check(str(tmp_path / "t16.db"), run, steps) if v.check_id != "I7"] == []
    i = steps.index(padded[0])
    last = padded[0].padded_batch_size - 1
    bad = set_cells(padded[0], "page_table", lambda v: v.__setitem__((last, 1), 3))
    vs = check(str(tmp_path / "bad.db"), run, replace_step(steps, i, bad))
    assert [(v.check_id, v.row, v.col) for v in vs if v.check_id != "I7"] == [("I18", last, 1)]


def test_i19_needs_a_left_over_cell_not_any_mismatch(tmp_path, base) -> None:
    """A page-table cell nobody held is I10 (wrong), not I19 (stale); the stale case is the fault's (test_faults)."""
    run, steps = base
    i = find(steps, verify_replay)
    bad = set_cells(steps[i], "page_table", lambda v: v.__setitem__((0, 1), v.max() + 1))
    vs = check(str(tmp_path / "bad.db"), run, replace_step(steps, i, bad))
    assert "I10" in ids(vs) and "I19" not in ids(vs)


def test_i2_rows_that_disagree_are_reported_and_checking_goes_on(tmp_path, base) -> None:
    run, steps = base
    i = find(steps, verify_replay)
    short = set_cells(steps[i], "page_table", lambda v: None)
    short = dataclasses.replace(short, arrays=tuple(
        dataclasses.replace(a, values=a.values[:-1], shape=(a.shape[0] - 1, *a.shape[1:])) if a.name == "page_table"
        else a for a in short.arrays))
    j = find(steps, lambda s: s.index > steps[i].index and verify_replay(s))
    later = set_cells(steps[j], "seq_lens_cpu", lambda v: v.__setitem__(0, v[0] + 1))
    bad = replace_step(steps, i, short)
    bad[j] = later
    vs = check(str(tmp_path / "bad.db"), run, bad)
    assert [v.check_id for v in vs if v.step == steps[i].index] == ["I2"]
    assert "I34" in {v.check_id for v in vs if v.step == steps[j].index}


def test_check_cli_survives_inconsistent_arrays(tmp_path, base) -> None:
    import json
    import subprocess
    import sys

    from checkgen import roundtrip

    run, steps = base
    i = find(steps, verify_replay)
    broken = dataclasses.replace(steps[i], arrays=tuple(
        dataclasses.replace(a, values=a.values[:1]) if a.name in ("positions", "cache_seqlens") else a
        for a in steps[i].arrays))
    path = str(tmp_path / "broken.db")
    roundtrip(path, run, replace_step(steps, i, broken))
    res = subprocess.run([sys.executable, "-m", "specscope.ui.cli", "check", path, "--json"], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "SPECSCOPE_DEBUG": "1"})
    assert res.returncode == 1, res.stderr
    assert "I2" in {v["id"] for v in json.loads(res.stdout)["violations"]} and "Traceback" not in res.stderr


def test_a_v1_trace_is_judged_by_its_values_too() -> None:
    """A schema-1 trace (engine flags, no wait edges): the stale page table is still I19, from the cells."""
    from specscope.tracer.checks import check_steps
    from specscope.tracer.store import TraceReader

    here = os.path.join(os.path.dirname(__file__), "..", "data", "v1")
    with TraceReader(os.path.join(here, "cpu-fault-stale-page-table.db")) as r:
        assert r.major == 1
        stale = ids(list(check_steps(r.steps(), r.run, waits_recorded=False)))
    with TraceReader(os.path.join(here, "cpu-default.db")) as r:
        clean = list(check_steps(r.steps(), r.run, waits_recorded=False))
    assert {"I10", "I19"} <= stale and clean == []
