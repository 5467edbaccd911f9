"""The step view answers "which value, why" without a key: violations first, in full, and each cell they name marked
in place with found vs expected; n / N walk them; the status line says only what is true of the current step."""

from __future__ import annotations

import os

import pytest
from specscope.tracer.schema import Severity, Violation
from specscope.tracer.store import TraceReader, TraceWriter, mark_checked
from specscope.ui.tui.app import SpecscopeApp
from specscope.ui.tui.live import Breakpoints, LiveController
from specscope.ui.tui.marks import StepMarks, short_message
from specscope.ui.tui.page_grid import PageGrid
from specscope.ui.tui.requests_table import RequestsTable
from specscope.ui.tui.step_detail import DetailPanel
from specscope.ui.tui.step_violations import StepViolations
from specscope.ui.tui.violations_panel import ViolationsPanel
from tui_fixtures import _at_root, anyio_backend, screen_lines, until  # noqa: F401 - fixtures
from tui_samples import sample

OVERRIDE = sample("cpu-fault-max-seq-len-q-override")  # PR #27495's bug: the verify runs with q 4 for T = 2
STALE = sample("cpu-fault-stale-page-table")



def _status_words(app: SpecscopeApp) -> list[str]:
    """The status line's phrases that say how far the verdicts reach."""
    line = screen_lines(app)[0]
    return [w for w in ("checked through", "unchecked") if w in line]


def _first_violating_verify(path: str) -> int:
    with TraceReader(path) as r:
        steps = sorted({v.step for v in r.violations()})
        return next(i for i in steps if r.summary(i).mode.value == "TARGET_VERIFY")


@pytest.mark.anyio
@pytest.mark.parametrize("size", [(120, 40), (80, 24)])
async def test_the_overridden_max_seq_len_q_is_marked_with_found_and_expected(size: tuple[int, int]) -> None:
    """Opening the first violating verify step of the #27495 trace shows, with no key pressed, max_seq_len_q 4 marked
    with what the check expected (T = 2), as text, and the violation's whole message."""
    step = _first_violating_verify(OVERRIDE)
    app = SpecscopeApp(OVERRIDE, start=step)
    async with app.run_test(size=size) as pilot:
        await app.ready()
        await pilot.pause()
        lines = screen_lines(app)
        marked = [ln for ln in lines if "✗ max_seq_len_q 4" in ln]
        assert marked, "\n".join(lines)
        assert "expected 2" in marked[0]
        assert app.current == step
        # The step's violations, first in the centre column, with their messages unabridged (wrapped).
        pane = app.query_one(StepViolations)
        assert pane.display and pane.count == len(app.source.violations.at(step))
        words = " ".join(pane.plain.split())
        for v in app.source.violations.at(step):
            assert " ".join(short_message(v).split()) in words
        assert "step 0 (" not in pane.plain  # the prefix the pane's title already says


@pytest.mark.anyio
async def test_each_recorded_cell_is_marked_where_it_appears() -> None:
    """Seqlens entries, page-table cells and request rows the violations name carry a mark and, as text, found vs
    expected."""
    with TraceReader(STALE) as r:
        v = next(v for v in r.violations() if v.array == "page_table" and v.found is not None)
    app = SpecscopeApp(STALE, start=v.step)
    async with app.run_test(size=(120, 40)) as pilot:
        await app.ready()
        await pilot.pause()
        grid = app.query_one(PageGrid)
        text = "\n".join(screen_lines(app))
        assert f"✗ page_table[{v.row}, {v.col}] = {v.found}, expected {v.expected}" in text
        y = v.row + 1 - int(grid.scroll_offset.y)
        cells = [seg for seg in grid.render_line(y) if seg.style is not None and seg.style.underline]
        assert cells, "the named page-table cell is marked in the grid"
        table = app.query_one(RequestsTable)
        assert table.cell_text(v.row, 0).endswith("✗")  # its request row
    app = SpecscopeApp(OVERRIDE, start=_first_violating_verify(OVERRIDE))
    async with app.run_test(size=(120, 40)) as pilot:
        await app.ready()
        await pilot.pause()
        text = "\n".join(screen_lines(app))
        assert "✗ cu_seqlens_q[1] = 4, expected 2" in text  # I7's entry, beside the grid
        assert "4✗" in text


@pytest.mark.anyio
async def test_n_and_N_walk_the_violations_of_a_step_then_across_steps() -> None:
    app = SpecscopeApp(OVERRIDE, start=0)
    async with app.run_test(size=(120, 40)) as pilot:
        await app.ready()
        here = app.source.violations.at(0)
        assert len(here) == 3
        seen = [app.focus_violation]
        for _ in range(2):
            await pilot.press("n")
            assert app.current == 0
            seen.append(app.focus_violation)
        assert len({(v.check_id, v.message) for v in seen}) == 3  # every one of the step's, once
        assert "(3/3)" in screen_lines(app)[0]
        detail = app.query_one(DetailPanel).plain
        assert "✗" in detail
        await pilot.press("n")  # past the step's last: the next step with a violation, its first
        nxt = app.source.violations.next_step(0)
        assert app.current == nxt and "(1/" in screen_lines(app)[0]
        await pilot.press("N")  # back: the previous step's last
        assert app.current == 0 and app.focus_violation == seen[-1]
        await pilot.press("N", "N")
        assert app.current == 0 and app.focus_violation == seen[0]


@pytest.mark.anyio
async def test_the_status_line_speaks_of_the_current_step_only() -> None:
    app = SpecscopeApp(OVERRIDE, start=0)
    async with app.run_test(size=(160, 40)) as pilot:
        await app.ready()
        await pilot.press("n", "n", "n")  # to step 1's first violation
        assert app.current == 1 and "here: I3 I6 I7" in screen_lines(app)[0]
        clean = next(i for i in range(2, 9) if not app.source.violations.at(i))
        assert app.goto_text(str(clean)) is None
        await pilot.pause()
        status = screen_lines(app)[0]
        assert "here:" not in status and "I3" not in status and "step 1" not in status
        last = max(v.step for _, vs in app.source.violations.groups() for v in vs)
        app.move_to(last)
        for _ in range(len(app.source.violations.at(last))):
            await pilot.press("n")
        assert "no later violation" in screen_lines(app)[0]
        assert app.goto_text("0") is None
        await pilot.pause()
        assert "no later violation" not in screen_lines(app)[0]


def _steps_of(path: str, lo: int, hi: int) -> list:
    with TraceReader(path) as r:
        return list(r.steps(lo, hi))


@pytest.mark.anyio
async def test_following_a_trace_reads_how_far_its_verdicts_reach(tmp_path) -> None:
    """A followed trace whose writer marks more steps checked: the status line drops "checked through" once the
    verdicts cover the last step, instead of keeping the count it read at start."""
    src = sample("cpu-default")
    with TraceReader(src) as r:
        run = r.run
    path = os.path.join(tmp_path, "growing.db")
    w = TraceWriter(path, run)
    for st in _steps_of(src, 0, 5):
        w.write_step(st)
    w.flush()
    mark_checked(path, 2)
    app = SpecscopeApp(path, auto_check=False)
    async with app.run_test(size=(160, 40)) as pilot:
        await app.ready()
        await until(pilot, lambda: "checked through step 2" in screen_lines(app)[0], "the partial verdicts")
        for st in _steps_of(src, 5, 30):
            w.write_step(st)
        w.flush()
        mark_checked(path, 29)
        await until(pilot, lambda: app.current == 29, "the new steps")
        await until(pilot, lambda: not {"checked through", "unchecked"} & set(_status_words(app)),
                    "the verdicts of every step")
        w.close()


@pytest.mark.anyio
async def test_t_vs_k_is_marked_only_where_a_check_says_so() -> None:
    """T ≠ K is a healthy verify runner (and prefill's T is its longest extend): the step list's `≠` and the
    detail's mark come from a check that judged T against the kernel's q length."""
    app = SpecscopeApp(sample("cpu-default"))
    async with app.run_test(size=(120, 40)) as pilot:
        await app.ready()
        await pilot.pause()
        assert not any("≠" in ln[:34] for ln in screen_lines(app)[2:30])  # the step list: draft 1/4, prefill 122/4
    app = SpecscopeApp(OVERRIDE, start=0)
    async with app.run_test(size=(120, 40)) as pilot:
        await app.ready()
        await pilot.pause()
        rows = [ln[:34] for ln in screen_lines(app)[3:30]]
        assert any("verify" in ln and "2≠4" in ln for ln in rows)
        assert not any("draft" in ln and "≠" in ln for ln in rows)
        assert "T 2 K 4 ✗ I3 I6" in app.query_one(DetailPanel).plain


@pytest.mark.anyio
async def test_the_first_enter_in_the_violations_tree_jumps() -> None:
    app = SpecscopeApp(STALE, start=0)
    async with app.run_test(size=(120, 40)) as pilot:
        await app.ready()
        tree = app.query_one(ViolationsPanel)
        tree.focus()
        await pilot.pause()
        node = tree.cursor_node
        assert node is not None and isinstance(node.data, Violation)
        await pilot.press("enter")
        await pilot.pause()
        assert app.current == node.data.step > 0
        assert app.focus_violation == node.data


def test_typing_violation_in_the_breakpoint_box_keeps_that_breakpoint_on(tmp_path) -> None:
    ctl = LiveController([], os.path.join(tmp_path, "t.db"), Breakpoints(on_violation=True))
    try:
        assert ctl.breakpoint_text("violation") is None
        assert ctl.breaks.on_violation  # said "violation": it stays on (it toggled off before)
        assert ctl.breakpoint_text("violation off") is None and not ctl.breaks.on_violation
        assert ctl.breakpoint_text("violation") is None and ctl.breaks.on_violation
        assert ctl.breakpoint_text("step 7") is None and ctl.breaks.on_violation and ctl.breaks.step == 7
        assert ctl.breaks.describe() == "break: violation, step 7"
    finally:
        ctl.channel.close()


def test_a_derived_scalar_marks_the_one_it_came_from() -> None:
    """kernel_q_len is the max_seq_len_q the kernel ran with: a check on it marks max_seq_len_q (where they agree)."""
    with TraceReader(OVERRIDE) as r:
        st = r.step(0)
    v = Violation("I6", Severity.ERROR, 0, "m", array="kernel_q_len", found="4", expected="2")
    marks = StepMarks.of([v], st)
    got = marks.scalar("max_seq_len_q")
    assert got and got[0].found == "4" and got[0].expected == "2" and not got[0].is_related
    other = Violation("I6", Severity.ERROR, 0, "m", array="kernel_q_len", found="3", expected="2")
    assert not StepMarks.of([other], st).scalar("max_seq_len_q")  # a value that is not max_seq_len_q's


def test_related_cells_are_marked_apart() -> None:
    from specscope.tracer.schema import Cell

    with TraceReader(STALE) as r:
        st = r.step(14)
    v = Violation("I10", Severity.ERROR, 14, "m", 0, array="page_table", row=0, col=0, found="0", expected="1",
                  related=(Cell("req_to_token_page_starts", 0, 0, "16"), Cell("cache_seqlens", 0, None, "123", 3)))
    marks = StepMarks.of([v], st)
    own, rel = marks.grid(0, 0, 1)
    assert not own.is_related and rel.is_related and rel.found == "16"
    assert not marks.seqlens("cache_seqlens", 0)  # recorded at step 3, not here
