"""The shared view models (ui/views.py) on real sample traces and on steps built through the public schema."""

from __future__ import annotations

import dataclasses
import glob
import os

import numpy as np
import pytest
from specscope.tracer.schema import ArraySnapshot, ForwardMode, GraphPhase, RequestState, Step, StepSummary
from specscope.tracer.store import TraceReader
from specscope.ui import views

SAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "samples", "traces")


def _arr(name: str, values: list) -> ArraySnapshot:
    v = np.array(values, dtype=np.int32)
    return ArraySnapshot(name, "int32", v.shape, 0, v)


def _verify_step(page_table: list[list[int]], starts: list[list[int]], cache: list[int], bs: int,
                 out_loc: list[int], num_kv_pages: int = 16) -> Step:
    reqs = tuple(RequestState(10 + b, b + 1, cache[b] - 2, cache[b], 2, (65, 66), (65, 67), 2) for b in range(bs))
    return Step(
        index=7, iteration=3, mode=ForwardMode.TARGET_VERIFY, model="target", step_id=None, batch_size=bs,
        padded_batch_size=len(page_table), graph=GraphPhase.REPLAY, tokens_per_request=2, num_draft_tokens=3,
        page_size=4, start_ns=0, end_ns=1000, scalars={"num_kv_pages": num_kv_pages, "kernel_q_len": 2},
        requests=reqs,
        arrays=(_arr("page_table", page_table), _arr("req_to_token_page_starts", starts),
                _arr("cache_seqlens", cache), _arr("out_cache_loc", out_loc)),
    )  # fmt: skip


def test_page_grid_classifies_every_kind() -> None:
    # Row 0 reads pages 1, 2; row 1 reads 3 (req_to_token says 4: stale) and 2 (also row 0's: shared);
    # row 2 is padding; page 99 is outside a 16-page pool; column 2 of row 0 is past its cache_seqlens.
    pt = [[1, 2, 5], [3, 2, 99], [0, 0, 0]]
    starts = [[4, 8, 20], [16, 8, 0], [0, 0, 0]]
    step = _verify_step(pt, starts, cache=[6, 12, 1], bs=2, out_loc=[5, 6, 8 + 2, 8 + 3, 0, 0])
    g = views.page_grid(step)
    assert g is not None
    kinds = [[c.kind for c in row] for row in g.cells]
    K = views.CellKind
    assert kinds[0] == [K.FRESH, K.SHARED, K.UNREAD]  # out_cache_loc 5, 6 lie in page 1
    assert kinds[1] == [K.STALE, K.SHARED, K.OUT_OF_RANGE]
    assert kinds[2] == [K.PADDED] * 3
    assert g.cell(1, 0).expected_page == 4 and g.cell(1, 0).page == 3
    assert g.cell(0, 1).shared_with == (11,) and g.row_labels == ["r10", "r11", "pad2"]
    assert (g.cell(0, 1).token_start, g.cell(0, 1).token_end) == (4, 6)
    # Every kind has its own symbol, so the grid reads without colour.
    assert len(set(views.SYMBOLS.values())) == len(views.CellKind)


def test_fresh_pages_come_from_out_cache_loc() -> None:
    step = _verify_step([[1, 2]], [[4, 8]], cache=[7], bs=1, out_loc=[9, 10])
    g = views.page_grid(step)
    assert [c.kind for c in g.cells[0]] == [views.CellKind.OK, views.CellKind.FRESH]


def test_bin_columns_never_hides_a_stale_page() -> None:
    pt = [[1, 2, 3, 4, 5, 6, 7, 8]]
    starts = [[4, 8, 12, 16, 20, 24, 28 + 4, 32]]  # column 6 is stale
    step = _verify_step(pt, starts, cache=[32], bs=1, out_loc=[40, 41], num_kv_pages=64)
    bins = views.bin_columns(views.page_grid(step), 2)[0]
    assert [(b.col_lo, b.col_hi) for b in bins] == [(0, 3), (4, 7)]
    assert bins[1].kind == views.CellKind.STALE and bins[0].kind != views.CellKind.STALE


def test_request_views_mark_the_accepted_prefix() -> None:
    step = _verify_step([[1]], [[4]], cache=[3], bs=1, out_loc=[1, 2])
    (r,) = views.request_views(step, views.byte_text)
    assert r.draft_accepted == (True, False) and r.bonus == 67 and r.num_draft_accepted == 1
    assert r.draft_text == "AB" and r.accepted_text == "AC"
    assert views.byte_text([10, 9, 65, 200]) == "\\n\\tA\\xc8"


def test_acceptance_from_histogram_separates_bonus() -> None:
    # 4 rows at T = 4 (3 drafts each): accept lengths 1, 2, 4, 4.
    st = views.acceptance_from_histogram([0, 1, 1, 0, 2], verify_steps=2, drafted=12)
    assert st.mean_accept_length == pytest.approx(11 / 4)
    assert st.draft_acceptance == pytest.approx(7 / 12) and st.draft_waste == pytest.approx(5 / 12)
    assert st.by_position == pytest.approx([3 / 4, 2 / 4, 2 / 4])
    assert st.tokens_per_verify_step == pytest.approx(11 / 2)


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(SAMPLES, "*.db"))), ids=os.path.basename)
def test_views_on_every_sample(path: str) -> None:
    with TraceReader(path) as r:
        fmt = views.token_formatter(r.run)
        verify = r.find_steps("TARGET_VERIFY", limit=3)
        for i in verify or [0]:
            step = r.step(i)
            g = views.page_grid(step)
            assert g is not None and len(g.cells) == step.padded_batch_size
            assert sum(g.counts.values()) == g.num_cols * len(g.cells)
            assert len(views.request_views(step, fmt)) == len(step.requests) <= step.batch_size
            rows = dict(views.step_detail(step, capture=r.capture_of(i), kernel=r.run.attention_kernel))
            assert rows["mode"].startswith(step.mode.value)
        st = views.acceptance_from_summaries(r.iter_summaries())
        hist = r.accept_histogram()
        assert st.histogram == hist and st.rows == sum(hist)


def test_step_detail_names_the_capture_of_a_replay() -> None:
    s = StepSummary(5, 1, ForwardMode.TARGET_VERIFY, "target", None, 3, 4, GraphPhase.REPLAY, 2, 4, 16, 0, 2000,
                    0, 0, {"max_seq_len_q": 4, "kernel_q_len": 4})
    rows = dict(views.step_detail(s, capture=1))
    assert rows["graph"] == "replay (capture step 1)"
    assert rows["tokens"] == "T 2 / K 4"  # T ≠ K is healthy: only a check marks a value as wrong
    assert rows["bs / padded"].startswith("3 / 4")


def test_violation_marks_name_the_wrong_cell_and_its_relation() -> None:
    from specscope.tracer.schema import Cell, Severity, Violation
    from specscope.ui.views import marks_by_cell, violation_marks

    scalar = Violation("I7", Severity.ERROR, 5, "max_seq_len_q 4 != T 2", None, "max_seq_len_q", None, None, "4", "2")
    rel = Violation("I40", Severity.ERROR, 5, "slot shared", 1002, "page_table", 1, 2, "9", "12",
                    (Cell("page_table", 0, 3, "9"), Cell("page_table", 0, 3, "9", step=2)))
    bare = Violation("I28", Severity.WARNING, 5, "no cell", None)
    marks = violation_marks([scalar, rel, bare], step=5)
    assert [(m.array, m.row, m.col, m.is_related) for m in marks] == [
        ("max_seq_len_q", None, None, False), ("page_table", 1, 2, False), ("page_table", 0, 3, True)]
    assert marks[0].text == "I7: 4, expected 2" and marks[2].text == "I40: 9 (related)"
    assert len(violation_marks([rel])) == 3  # without a step filter the capture-side fact is listed too
    assert list(marks_by_cell(marks)) == [("max_seq_len_q", None, None), ("page_table", 1, 2), ("page_table", 0, 3)]


def test_step_marks_mark_the_source_of_a_derived_scalar() -> None:
    from specscope.tracer.schema import Severity, Violation

    s = StepSummary(0, -1, ForwardMode.TARGET_VERIFY, "target", None, 1, 1, GraphPhase.CAPTURE, 2, 4, 16, 0, 10,
                    0, 0, {"max_seq_len_q": 4, "kernel_q_len": 4, "captured_max_seq_len_q": 4})
    v = Violation("I6", Severity.ERROR, 0, "kernel q_len_per_req = 4 but T = 2", None, "kernel_q_len", None, None,
                  "4", "2")
    marks = views.step_marks([v], s)
    # kernel_q_len's source, max_seq_len_q, holds the same 4: marked too; the captured value only on a replay
    assert [(m.array, m.text) for m in marks] == [("kernel_q_len", "I6: 4, expected 2"),
                                                  ("max_seq_len_q", "I6: 4, expected 2")]
    other = dataclasses.replace(s, scalars={"max_seq_len_q": 2, "kernel_q_len": 4})
    assert [m.array for m in views.step_marks([v], other)] == ["kernel_q_len"]
    assert views.cell_name("page_table", 0, 3) == "page_table[0, 3]" and views.cell_name("bs", None, None) == "bs"
