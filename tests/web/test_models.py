"""Unit tests of the dashboard's pure functions: binning, stream overlap, acceptance, violations, routes, figures."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("plotly")

from specscope.tracer.schema import ForwardMode, Severity, SpanRow, Violation  # noqa: E402
from specscope.tracer.store import TraceReader  # noqa: E402
from specscope.ui import views  # noqa: E402
from specscope.ui.web import figures, models  # noqa: E402
from specscope.ui.web.routes import RouteError, parse_route, step_href  # noqa: E402
from specscope.ui.web.source import Columns, TraceSource  # noqa: E402
from webfixtures import FAULT, PLAN, SAMPLES  # noqa: E402


def test_bin_series_keeps_small_series_and_bins_large_ones_keeping_extremes() -> None:
    x = np.arange(100)
    s = models.bin_series(x, x * 2.0)
    assert not s.binned and len(s) == 100 and s.y[7] == 14
    y = np.ones(50_000)
    y[31_337] = 1000.0  # one spike must survive binning
    b = models.bin_series(np.arange(50_000), y, max_points=10_000, bins=500)
    assert b.binned and len(b) == 500
    assert b.count.sum() == 50_000
    assert b.y_max.max() == 1000.0 and b.y_min.min() == 1.0
    assert np.isclose((b.y * b.count).sum(), y.sum())


def _span(step: int, stream: str, a: int, b: int) -> SpanRow:
    return SpanRow(step, "target", ForwardMode.TARGET_VERIFY, stream, "x", a, b)


def test_step_streams_overlap_and_idle_gaps() -> None:
    spans = [
        _span(0, "compute", 0, 100),
        _span(1, "plan", 50, 150),  # half hidden under step 0's compute
        _span(1, "compute", 130, 200),  # 30 ns idle before it; hides 20 more ns of the plan span
        _span(2, "compute", 200, 260),  # back to back: no gap
        _span(3, "compute", 300, 310),  # 40 ns gap
    ]
    rows, gaps = models.step_streams(spans)
    by = {r.step: r for r in rows}
    assert by[1].plan_ns == 100 and by[1].plan_hidden_ns == 70 and by[1].hidden_share == 0.7
    assert by[1].idle_before_ns == 30 and by[2].idle_before_ns == 0 and by[3].idle_before_ns == 40
    assert [(g.after_step, g.before_step, g.end_ns - g.start_ns) for g in gaps] == [(0, 1, 30), (2, 3, 40)]
    tot = models.stream_totals(rows, gaps)
    assert tot["plan_hidden_share"] == 0.7 and tot["idle_ns"] == 70 and tot["gaps"] == 2


def valid(fig: dict) -> object:
    """The figure dict as plotly's validated `go.Figure` (raises on any property plotly.js does not know)."""
    import plotly.graph_objects as go

    return go.Figure(fig)


@pytest.fixture(scope="module")
def fault() -> TraceSource:
    return TraceSource(FAULT, "a", background=False)


def test_columns_match_the_reader(fault: TraceSource) -> None:
    with TraceReader(FAULT) as r:
        rows = r.summaries()
    assert len(fault.cols) == len(rows) == fault.num_steps()
    c = fault.cols
    for s in rows[:: max(1, len(rows) // 17)]:
        assert c.batch_size[s.index] == s.batch_size and c.start_ns[s.index] == s.start_ns
        assert c.num_errors[s.index] == s.num_errors
        assert list(c.accept_hist[s.index][: len(s.accept_hist)]) == list(s.accept_hist)
    half = Columns.from_summaries(rows[:10]).extend(Columns.from_summaries(rows[10:]))
    assert np.array_equal(half.accept_hist, c.accept_hist) and np.array_equal(half.end_ns, c.end_ns)


def test_acceptance_equals_the_shared_view_model(fault: TraceSource) -> None:
    with TraceReader(FAULT) as r:
        ref = views.acceptance_from_summaries(r.summaries())
        hist = r.accept_histogram()
    got = models.acceptance(fault.cols)
    assert got.histogram == list(hist[: len(got.histogram)]) and sum(got.histogram) == sum(hist)
    assert got.verify_steps == ref.verify_steps and got.rows == ref.rows
    assert got.mean_accept_length == pytest.approx(ref.mean_accept_length)
    assert got.draft_waste == pytest.approx(ref.draft_waste)
    per_bs = models.acceptance_by_batch_size(fault.cols)
    assert sum(g.rows for g in per_bs) == got.rows
    series = models.mean_accept_per_step(fault.cols)
    assert len(series) == got.verify_steps and not series.binned


def test_acceptance_by_request_from_steps(fault: TraceSource) -> None:
    idx = np.nonzero(models.verify_mask(fault.cols))[0]
    steps = [fault.reader.step(int(i), arrays=()) for i in idx]
    rows = models.acceptance_by_request(steps)
    lengths = [r.accept_length for s in steps for r in s.requests if r.accept_length > 0]
    assert sum(g.rows for g in rows) == len(lengths)
    assert sum(g.mean_accept_length * g.rows for g in rows) == pytest.approx(sum(lengths))


def test_violation_groups_and_targets() -> None:
    vs = [Violation("I10", Severity.ERROR, 5, "m", request_id=3), Violation("I2", Severity.ERROR, 9, "m"),
          Violation("I10", Severity.ERROR, 4, "m", array="page_table", row=1, col=2),
          Violation("I7", Severity.WARNING, 1, "m")]  # fmt: skip
    groups = models.violation_groups(vs, max_examples=1)
    assert [g.check_id for g in groups] == ["I2", "I7", "I10"]  # natural order, not "I10" < "I2"
    g10 = groups[-1]
    assert g10.count == 2 and g10.num_steps == 2 and g10.first_step == 4 and g10.examples[0].step == 4
    assert g10.description.startswith("page_table[b, j]")
    assert models.violation_target(vs[2]) == {"check": "I10", "row": 1, "col": 2, "array": "page_table"}
    assert models.violation_target(vs[0]) == {"check": "I10", "request": 3}


@pytest.fixture(scope="module")
def checked_fault(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A copy of the fault sample whose stored verdicts are today's catalogue's (`check --write`): the sample may
    carry verdicts an older catalogue stored, and the dashboard shows a trace's stored verdicts as they are."""
    import shutil
    import subprocess
    import sys

    path = str(tmp_path_factory.mktemp("checked") / "fault.db")
    shutil.copyfile(FAULT, path)
    p = subprocess.run([sys.executable, "-m", "specscope.ui.cli", "check", "--write", path], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode in (0, 1), p.stderr  # 1: violations found (and stored)
    return path


def _without_verdicts(path: str) -> str:
    """A copy of the trace at `path` that stores no verdict (as one recorded with checking off)."""
    import shutil
    import sqlite3

    out = path[: -len(".db")] + "-bare.db"
    shutil.copyfile(path, out)
    conn = sqlite3.connect(out)
    with conn:
        conn.execute("DELETE FROM violations")
        conn.execute("DELETE FROM meta WHERE key = 'checked_through'")
    conn.close()
    return out


def test_dashboard_checker_matches_the_catalogue(checked_fault: str) -> None:
    from specscope.tracer.checks import check_steps

    with TraceReader(checked_fault) as r:
        expected = list(check_steps(r.steps()))
        stored = r.violations()
    assert {v.message for v in stored} == {v.message for v in expected}  # what `check --write` stored
    src = TraceSource(checked_fault, "a", background=False)
    st = src.violation_state(budget_steps=10**6)
    assert st.checked_steps == st.num_steps == src.num_steps()
    assert st.source == "trace" and {v.message for v in st.violations} == {v.message for v in expected}
    first = min(v.step for v in expected)
    want = {v.message for v in expected if v.step == first}
    assert {v.message for v in src.step_violations(first)} == want  # from the trace's verdicts
    # With no stored verdicts the dashboard checks the trace itself, and gets the catalogue's verdicts: over the
    # whole trace, and for one step alone (its capture fed first).
    bare = _without_verdicts(checked_fault)
    own = TraceSource(bare, "a", background=False)
    st = own.violation_state(budget_steps=10**6)
    assert st.source == "dashboard" and [v.message for v in st.violations] == [v.message for v in expected]
    assert {v.message for v in own.step_violations(first)} == want  # from the dashboard's walk
    assert {v.message for v in TraceSource(bare, "a").step_violations(first)} == want  # replayed from the capture


@pytest.mark.parametrize("path,search,page,step,params", [
    ("/", "", "timeline", None, {}), (None, None, "timeline", None, {}), ("/timeline/", "", "timeline", None, {}),
    ("/step/12", "", "step", 12, {}), ("/step/3/", "?trace=b&row=1&col=2&check=I10", "step", 3,
                                         {"row": 1, "col": 2, "check": "I10"}),
    ("/acceptance", "", "acceptance", None, {}), ("/compare", "", "compare", None, {}),
])  # fmt: skip
def test_routes(path: str, search: str, page: str, step: int | None, params: dict) -> None:
    r = parse_route(path, search, ("a", "b"))
    assert (r.page, r.step, r.params) == (page, step, params)


@pytest.mark.parametrize("path,search,message", [
    ("/step/abc", "", "no page"), ("/step/-1", "", "no page"), ("/../../etc/passwd", "", "no page"),
    ("/samples/traces/cpu-default.db", "", "no page"), ("/step/1", "?trace=/etc/passwd", "no trace"),
    ("/step/1", "?trace=b", "no trace"), ("/step/1", "?row=x", "non-negative integer"),
    ("/step/1", "?row=1&row=2", "twice"), ("/step/1", "?evil=1", "unknown query parameter"),
    ("/step/1", "?check=../x", "malformed invariant"), ("/", "?row=1", "no query parameters"),
    (["/"], "", "malformed address"), ("/" + "x" * 300, "", "malformed address"), ("/step/1", "?a", "malformed"),
])  # fmt: skip
def test_bad_routes_are_one_line_errors(path: object, search: str, message: str) -> None:
    with pytest.raises(RouteError, match=message) as e:
        parse_route(path, search, ("a",))
    assert "\n" not in str(e.value)


def test_step_href_round_trips() -> None:
    href = step_href(7, "b", row=2, col=3)
    path, _, query = href.partition("?")
    r = parse_route(path, "?" + query, ("a", "b"))
    assert (r.trace, r.step, r.params) == ("b", 7, {"row": 2, "col": 3})


def test_heatmap_figure_marks_each_cell_kind(fault: TraceSource) -> None:
    from specscope.tracer.checks import check_steps

    with TraceReader(FAULT) as r:
        first = min(v.step for v in check_steps(r.steps()) if v.check_id == "I10")
    grid = views.page_grid(fault.step(first))
    assert grid is not None and grid.counts.get(views.CellKind.STALE, 0) > 0
    fig = valid(figures.heatmap_figure(grid, (1, 2)))
    hm = fig.data[0]
    z, custom = figures.from_typed_array(hm.z), figures.from_typed_array(hm.customdata)  # as plotly.js decodes them
    assert z.shape == (len(grid.cells), grid.num_cols) and custom.shape == (*z.shape, 3)
    kinds = [figures.KINDS[k] for row in z for k in row]
    assert kinds.count(views.CellKind.STALE) == grid.counts[views.CellKind.STALE]
    cell = grid.cells[0][0]
    # hover: physical page, token range and owner
    assert list(custom[0][0]) == [cell.page, cell.token_start, cell.token_end]
    assert hm.hovertext[0][0].startswith(f"request {cell.owner} · stale")
    assert fig.layout.shapes[0].y0 == 0.5 and fig.layout.shapes[0].x0 == 1.5


def test_heatmap_bins_wide_tables() -> None:
    from specscope.tracer.schema import ArraySnapshot, GraphPhase, Step

    cols = 1000
    pt = np.arange(1, 2 * cols + 1, dtype=np.int32).reshape(2, cols)
    step = Step(index=0, iteration=0, mode=ForwardMode.DRAFT_DECODE, model="draft", step_id=0, batch_size=2,
                padded_batch_size=2, graph=GraphPhase.EAGER, tokens_per_request=1, num_draft_tokens=4, page_size=16,
                start_ns=0, end_ns=1, arrays=(ArraySnapshot("page_table", "int32", (2, cols), 0, pt),
                                              ArraySnapshot("cache_seqlens", "int32", (2,), 0,
                                                            np.array([cols * 16, 16], np.int32))))  # fmt: skip
    fig = valid(figures.heatmap_figure(views.page_grid(step)))
    assert figures.from_typed_array(fig.data[0].z).shape[1] <= figures.MAX_HEATMAP_COLS


def test_timeline_figures_on_a_plan_stream_trace() -> None:
    src = TraceSource(PLAN, "a", background=False)
    spans = src.spans(0, 60)
    rows, gaps = models.step_streams(spans)
    g = valid(figures.gantt_figure(spans))
    assert sum(len(t.x) for t in g.data) == len(spans)
    assert {t.name for t in g.data} <= {m.value for m in ForwardMode}
    o = valid(figures.overlap_figure(rows))
    assert len(o.data[-1].x) == len(rows)
    ov = valid(figures.overview_figure(models.step_durations(src.cols), (0, 60)))
    assert sum(len(t.x) for t in ov.data) == src.num_steps()
    assert ov.layout.shapes[0].x0 == -0.5 and ov.layout.shapes[0].x1 == 59.5
    assert valid(figures.gantt_figure([])).layout.annotations[0].text.startswith("no stream spans")


def test_overview_is_binned_beyond_the_point_budget() -> None:
    n = 30_000
    rows = Columns(
        iteration=np.arange(n), mode=np.full(n, 2, np.int8), model=np.zeros(n, np.int8),
        batch_size=np.ones(n, np.int32), padded_batch_size=np.ones(n, np.int32), graph=np.zeros(n, np.int8),
        tokens_per_request=np.ones(n, np.int32), num_draft_tokens=np.ones(n, np.int32),
        start_ns=np.arange(n) * 1000, end_ns=np.arange(n) * 1000 + 500, num_errors=np.zeros(n, np.int32),
        num_warnings=np.zeros(n, np.int32), accept_hist=np.zeros((n, 1), np.int32),
    )  # fmt: skip
    fig = valid(figures.overview_figure(models.step_durations(rows)))
    assert sum(len(t.x) for t in fig.data) <= 3 * models.NUM_BINS


def test_samples_exist() -> None:
    import os

    assert os.path.exists(FAULT) and os.path.isdir(SAMPLES)


def test_acceptance_figures_are_valid_plotly(fault: TraceSource) -> None:
    stats = {"A": models.acceptance(fault.cols), "B": models.acceptance(fault.cols, 0, len(fault.cols) // 2)}
    for fig in (figures.by_position_figure(stats), figures.histogram_figure(stats),
                figures.over_time_figure({"A": models.mean_accept_per_step(fault.cols)}),
                figures.group_figure({"A": models.acceptance_by_batch_size(fault.cols)}, "t", "batch size"),
                figures.empty_figure("nothing")):
        assert len(valid(fig).data) == len(fig["data"])


def test_summaries_load_in_the_background_in_chunks() -> None:
    # A tiny chunk makes the loader take many steps; pages see a growing prefix, then the whole trace.
    with TraceReader(PLAN) as r:
        rows = r.summaries()
    src = TraceSource(PLAN, "a", chunk=7)
    assert src.num_steps() == len(rows)  # known at once, before any summary is loaded
    assert src.wait_loaded(timeout=30) and not src.loading() and src.load_error() is None
    ref = Columns.from_summaries(rows)
    assert np.array_equal(src.cols.end_ns, ref.end_ns) and np.array_equal(src.cols.accept_hist, ref.accept_hist)
    assert np.array_equal(src.columns().mode, ref.mode)
    src.close()
    assert not src.refresh()  # a closed source answers without touching its reader


def test_a_page_built_from_part_of_the_summaries_is_redrawn_once_they_are_in() -> None:
    src = TraceSource(PLAN, "a", chunk=5)
    part = src.columns(wait=0.0)
    partial = len(part) < src.num_steps()
    assert src.wait_loaded(timeout=30)
    assert src.refresh() is partial  # redraw only if a page saw the partial columns
    assert src.refresh() is False
    src.close()


def test_text_table_aligns_columns_and_marks_the_highlighted_row() -> None:
    from specscope.ui.web import pages

    t = pages.text_table(["row", "value"], [(0, 5), (1, 12345), (2, 7)], id="t", highlight=1)
    before, hl, after = t.children
    lines = (before + hl.children + after).strip("\n").split("\n")
    assert lines == ["row  value", "  0      5", "  1  12345", "  2      7"]
    assert hl.className == "hl" and hl.children == "  1  12345"
    plain = pages.text_table(["a"], [(1,)])
    assert plain.children == "a\n1\n"


def test_a_span_several_steps_share_counts_once() -> None:
    """The draft loop's metadata span is recorded on every draft step: the window's compute time counts it once."""
    spans = [SpanRow(i, "draft", ForwardMode.DRAFT_DECODE, "compute", "metadata", 0, 40) for i in (4, 5, 6)]
    spans += [SpanRow(i, "draft", ForwardMode.DRAFT_DECODE, "compute", "forward", 40 + 10 * k, 50 + 10 * k)
              for k, i in enumerate((4, 5, 6))]
    # The producers span of an iteration is on its verify (target) and its draft extend (draft) step.
    spans += [SpanRow(7, "target", ForwardMode.TARGET_VERIFY, "compute", "producers", 100, 120),
              SpanRow(8, "draft", ForwardMode.DRAFT_EXTEND, "compute", "producers", 100, 120)]
    rows, gaps = models.step_streams(spans)
    by = {r.step: r for r in rows}
    assert (by[4].compute_ns, by[5].compute_ns, by[6].compute_ns) == (50, 10, 10)
    assert (by[7].compute_ns, by[8].compute_ns) == (20, 0)
    tot = models.stream_totals(rows, gaps)
    assert tot["compute_ns"] == 90 and tot["idle_ns"] == 30 and len(gaps) == 1
