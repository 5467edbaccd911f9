"""The TUI's view models: the fast page-grid classification, token text, chains, violation cells, run flags."""

from __future__ import annotations

import argparse
import os

import numpy as np
from specscope.tracer.schema import Severity, Violation
from specscope.tracer.store import TraceReader
from specscope.ui.tui import model as m
from tui_fixtures import _at_root  # noqa: F401 - fixtures
from tui_samples import ROOT


def test_the_grid_marks_the_stale_page_a_violation_names() -> None:
    """The TUI draws the shared classifier's grid (`views.page_classes`): the page-table cell a stale-page
    violation names is classed stale (or out of range), a padded row padded, a live row's tail not read."""
    from specscope.ui import views

    path = os.path.join(ROOT, "samples", "traces", "cpu-fault-stale-page-table.db")
    with TraceReader(path) as r:
        vs = [v for v in r.violations() if v.array == "page_table" and v.row is not None and v.col is not None]
        assert vs
        v = vs[0]
        g = views.page_classes(r.step(v.step))
        assert g is not None and m.Grid is views.PageClasses
        assert g.cls[v.row, v.col] in (m.STALE, m.OUT_OF_RANGE)
        assert (g.cls[g.live_rows:] == m.PADDED).all() or g.live_rows == g.rows
        need = -(-g.cache_seqlens[0] // g.page_size)
        assert (g.cls[0, need:] == m.NOT_READ).all()


def test_zoom_and_fit() -> None:
    g = m.Grid(np.arange(12).reshape(2, 6), np.array([[m.OK] * 5 + [m.STALE], [m.NOT_READ] * 6], np.int8), 2,
               (1, 2), [96, 10], [0, 1, 2], [0, 96, 106], 16, 6)
    cls, first = m.zoom_cells(g, 4)
    assert cls.tolist() == [[m.OK, m.STALE], [m.NOT_READ, m.NOT_READ]] and first.tolist() == [0, 4]
    assert m.fit_zoom(1563, 100) == 16  # a 100k-token context in 64-token pages fits 100 columns at 16/char
    assert len(set(m.SYMBOLS)) == len(m.SYMBOLS)  # readable without colour


def test_tokens_and_draft_chain() -> None:
    assert m.tokens_text([104, 105, 10], True) == "hi\\n"
    assert m.token_text(32, True) == "␣" and m.token_text(1234, False) == "1234"
    chain = m.draft_chain((5, 6, 7), (5, 9))  # first draft accepted, then the target's own token
    assert [(c.token, c.accepted, c.bonus) for c in chain] == [(5, True, False), (6, False, False),
                                                               (7, False, False), (9, True, True)]


def test_violation_cell_prefers_the_recorded_cell_then_the_message() -> None:
    from specscope.ui.views import Cell, catalogue_order, violation_cell

    rec = Violation("I10", Severity.ERROR, 4, "x", 7, array="page_table", row=1, col=3)
    assert violation_cell(rec, infer=True) == Cell("page_table", 1, 3) == ("page_table", 1, 3)
    old = Violation("I10", Severity.ERROR, 4, "step 4 request 7: page_table[2, 5] = 0 but ...", 7)
    assert violation_cell(old, infer=True) == Cell("page_table", 2, 5)
    assert violation_cell(old) is None  # the dashboard's default: recorded cells only
    none = Violation("I3", Severity.ERROR, 4, "2 query tokens but 4", None)
    assert violation_cell(none, infer=True) is None
    warn = Violation("I2", Severity.WARNING, 4, "w", None)
    assert [v.check_id for v in catalogue_order([warn, rec, none])] == ["I3", "I10", "I2"]


def test_acceptance_by_position() -> None:
    hist = [0, 2, 1, 0, 1]  # accept lengths 1,1,2,4 (bonus included)
    assert m.accept_by_position(hist) == [0.5, 0.25, 0.25]
    assert m.mean_accept(hist) == 2.0
    assert m.bar(0.5, 4) == "██  "


def test_sliding_window_histogram_equals_the_sum_over_the_window() -> None:
    import random

    with TraceReader(os.path.join(ROOT, "samples", "traces", "cpu-default.db")) as r:
        rows = r.summaries(0, r.num_steps())
    n = len(rows)
    sliding = m.SlidingHist()
    rng = random.Random(1)
    i = n // 2
    verified = 0
    for _ in range(300):  # mostly single steps both ways, sometimes a far jump
        i = rng.randrange(n) if rng.random() < 0.05 else max(0, min(n - 1, i + rng.choice((-3, -1, 1, 1, 2, 25))))
        a, b = max(0, i - 40), min(n, i + 41)
        got = sliding.window(a, b, lambda lo, hi: rows[lo:hi])
        assert got == m.window_hist(rows[a:b]), (i, a, b)
        verified += bool(got)
    assert verified > 100
    assert m.SlidingHist().window(0, 10, lambda lo, hi: None) is None  # not at hand: nothing changes


def test_run_flags_are_rebuilt_for_the_child() -> None:
    from specscope.ui import cmd_tui

    p = argparse.ArgumentParser()
    sub = p.add_subparsers()
    cmd_tui.add_parser(sub)
    args = p.parse_args(["tui", "--live", "--device", "cpu", "--batch-size", "2", "--no-cuda-graph", "--inject",
                         "stale-page-table", "--prompt-len", "24,60", "--ignore-eos", "-o", "x.db", "--break-step",
                         "7"])
    argv = cmd_tui.run_argv(args)
    want = ["--device", "cpu", "--batch-size", "2", "--prompt-len", "24,60", "--ignore-eos", "--no-cuda-graph",
            "--inject", "stale-page-table"]
    pairs = lambda xs: sorted(" ".join(xs).replace(" --", "\n--").split("\n"))  # noqa: E731 - flag order is free
    assert pairs(argv) == pairs(want)
    assert "-o" not in argv and "--output" not in argv  # the TUI names the trace itself


def test_idle_collector_postpones_full_passes_until_the_keys_pause() -> None:
    import gc

    from specscope.ui.tui.idle_gc import FULL_PASS_EVERY, IdleCollector

    saved = gc.get_threshold()
    now = [100.0]
    c = IdleCollector(idle_s=0.5, clock=lambda: now[0])
    c.start()
    try:
        assert gc.get_threshold()[2] >= FULL_PASS_EVERY and gc.get_freeze_count() > 0
        assert not c.tick()  # nothing moved yet: nothing owed
        c.moved()
        now[0] += 0.2
        assert not c.tick()  # keys still coming
        now[0] += 0.4
        assert c.tick() and not c.tick()  # one full pass per pause
        for _ in range(70):  # a view that never rests, with nothing promoted to the oldest generation: no pass
            c.moved()
            now[0] += 0.25
            assert not c.tick()
        gc.collect(1)  # a middle-generation pass: objects reach the oldest generation
        assert gc.get_count()[2] > 0
        for _ in range(70):  # ... now it is owed: one pass within max_wait_s (a followed live run)
            c.moved()
            now[0] += 0.25
            if c.tick():
                break
        assert now[0] - c.last < 0.5 and c.collected == now[0]
    finally:
        c.stop()
    assert gc.get_threshold() == saved and gc.get_freeze_count() == 0


def test_neighbour_prefetch_decodes_and_classifies_ahead() -> None:
    import time

    from specscope.ui import views
    from specscope.ui.tui.source import TraceSource

    path = os.path.join(ROOT, "samples", "traces", "cpu-fault-stale-page-table.db")
    src = TraceSource(path)
    try:
        n = src.num_steps()
        want = [n // 2, n // 2 + 1, n + 5, -1]  # past either end: ignored
        src.prefetch_steps(want)
        deadline = time.monotonic() + 10
        while not all(j in src._grids for j in want[:2]) and time.monotonic() < deadline:
            time.sleep(0.01)
        with TraceReader(path) as r:
            for j in want[:2]:
                assert j in src._grids  # done on the thread, before the UI asked
                ref = views.page_classes(r.step(j))
                got = src.grid(j)
                assert got is not None and ref is not None and np.array_equal(got.cls, ref.cls)
                assert src.step(j).index == j and src.step(j).requests == r.step(j).requests
    finally:
        src.close()
