"""Browser tests: the dashboard served on a free port, driven in headless Debian chromium by Playwright.

One server and one browser for the module. Every test fails on a browser console error, an uncaught page
error, a failed request or an HTTP error status. SPECSCOPE_SCREENSHOTS=docs/screenshots refreshes the committed
screenshots (docs/screenshots/web-*.png).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

import pytest

pytest.importorskip("dash")
pytest.importorskip("playwright")

from specscope.tracer.checks import check_steps  # noqa: E402
from specscope.tracer.diff import diff_traces  # noqa: E402
from specscope.tracer.store import TraceReader  # noqa: E402
from specscope.ui.web import dashboard  # noqa: E402
from specscope.ui.web.app import create_app  # noqa: E402
from specscope.ui.web.server import serve_in_thread  # noqa: E402
from webfixtures import (  # noqa: E402,F401
    FAULT,
    SAMPLES,
    browser_fixture,
    clean_twin_fixture,
    partial_bundle,
    screenshot_dir,
    twins_fixture,
)

TIMEOUT_MS = 20_000


@pytest.fixture(scope="module")
def server(clean_twin: str) -> Iterator[str]:
    app = create_app(FAULT, clean_twin, plotly=partial_bundle())  # type: ignore[arg-type]
    srv, url = serve_in_thread(app)
    try:
        yield url
    finally:
        srv.shutdown()


class Watch:
    """What went wrong in the browser while a test ran."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def attach(self, page: object) -> None:
        p = page
        p.on("console", lambda m: self.problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)  # type: ignore[attr-defined]
        p.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))  # type: ignore[attr-defined]
        p.on("requestfailed", lambda r: self.problems.append(f"request failed: {r.url} {r.failure}"))  # type: ignore[attr-defined]
        p.on("response", lambda r: self.problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)  # type: ignore[attr-defined]


@pytest.fixture
def page(browser: object, server: str) -> Iterator[object]:
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000}, base_url=server)  # type: ignore[attr-defined]
    pg = ctx.new_page()
    watch = Watch()
    watch.attach(pg)
    pg.set_default_timeout(TIMEOUT_MS)
    yield pg
    problems = list(watch.problems)  # before closing: closing aborts whatever is still loading
    ctx.close()
    assert problems == [], problems


def _rendered(page: object, graph_id: str) -> None:
    page.wait_for_selector(f"#{graph_id} .main-svg", state="attached")  # type: ignore[attr-defined]


# Dash marks the document while callbacks are in flight. Quiet means unmarked for this long without a break, as
# the page's own clock measures it: a callback that a finished one starts a moment later (a chain) resets it, so
# a slow machine waits longer instead of going on in the middle of the chain.
_QUIET_MS = 150
_QUIET = f"""() => {{
    const now = performance.now();
    if (document.querySelector('[data-dash-is-loading="true"]')) {{ window.__quietSince = null; return false; }}
    if (window.__quietSince == null) window.__quietSince = now;
    return now - window.__quietSince >= {_QUIET_MS};
}}"""


def _idle(page: object) -> None:
    """Wait until no Dash callback has been in flight for _QUIET_MS."""
    page.evaluate("() => { window.__quietSince = null; }")  # type: ignore[attr-defined]
    page.wait_for_function(_QUIET, polling="raf")  # type: ignore[attr-defined]


def _shot(page: object, name: str, full_page: bool = True) -> None:
    d = screenshot_dir()
    if d:
        page.screenshot(path=os.path.join(d, f"web-{name}.png"), full_page=full_page)  # type: ignore[attr-defined]


def _center(page: object, selector: str) -> tuple[float, float]:
    box = page.locator(selector).first.bounding_box()  # type: ignore[attr-defined]
    assert box, selector
    return box["x"] + box["width"] / 2, box["y"] + box["height"] / 2


def test_timeline_range_and_click_to_step(page: object) -> None:
    p = page
    p.goto("/")  # type: ignore[attr-defined]
    for g in ("tl-overview", "tl-gantt", "tl-overlap"):
        _rendered(p, g)
    assert p.locator("#tl-gantt .bars .point").count() > 0  # type: ignore[attr-defined]
    with TraceReader(FAULT) as r:  # the first window starts where the run does: after the graph captures
        lo = next(s.index for s in r.iter_summaries() if s.iteration >= 0)
    assert f"steps {lo}–{lo + 99}" in p.inner_text("#tl-window-stats")  # type: ignore[attr-defined]
    _idle(p)
    # Zoom with the range slider: its end handle, moved with the keyboard.
    handle = p.locator("#tl-range [role=slider]").nth(1)  # type: ignore[attr-defined]
    handle.focus()
    for _ in range(10):
        handle.press("ArrowLeft")
    p.wait_for_function(f"() => document.querySelector('#tl-window-stats').innerText.includes('steps {lo}–{lo + 89}')")  # type: ignore[attr-defined]
    # Click a Gantt bar: its step opens in the explorer.
    x, y = _center(p, "#tl-gantt .bars .point path")
    p.mouse.click(x, y)  # type: ignore[attr-defined]
    p.wait_for_url(re.compile(r"/step/\d+$"))  # type: ignore[attr-defined]
    p.wait_for_selector("#step-page")  # type: ignore[attr-defined]
    _idle(p)


def test_the_page_runs_the_partial_plotly_bundle(page: object) -> None:
    from specscope.ui.web import scripts

    p = page
    loaded: list[str] = []
    p.on("response", lambda r: loaded.append(r.url) if "plotly" in r.url and r.url.endswith(".js") else None)  # type: ignore[attr-defined]
    p.goto("/")  # type: ignore[attr-defined]
    _rendered(p, "tl-overview")
    assert [u.split("/", 3)[3] for u in loaded] == [partial_bundle().url.lstrip("/")]  # type: ignore[attr-defined]
    traces = p.evaluate("() => Object.keys(Plotly.PlotSchema.get().traces).sort()")  # type: ignore[attr-defined]
    assert traces == sorted(scripts.PARTIAL_TRACES)
    _idle(p)


def test_timeline_of_a_plan_stream_trace(browser: object) -> None:
    # Real H200 timings with the plan stream on: the overlap chart has bars and the window has a hidden share.
    app = create_app(os.path.join(SAMPLES, "h200-plan-stream.db"), plotly=partial_bundle())  # type: ignore[arg-type]
    srv, url = serve_in_thread(app)
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})  # type: ignore[attr-defined]
    p = ctx.new_page()
    watch = Watch()
    watch.attach(p)
    try:
        p.goto(url + "/")
        for g in ("tl-overview", "tl-gantt", "tl-overlap"):
            _rendered(p, g)
        assert p.locator("#tl-overlap .bars .point").count() > 0
        stats = p.inner_text("#tl-window-stats")
        assert re.search(r"plan hidden under compute\s+\d+\.\d%", stats), stats
        _idle(p)
        # Click the overview at a late step: the window moves there (past the first steps' warm-up).
        n = dashboard.of(app).sources["a"].num_steps()
        target = n - 50
        x, y = p.evaluate("""(s) => {
            const gd = document.querySelector('#tl-overview .js-plotly-plot'), fl = gd._fullLayout;
            const tr = gd.data.find(t => Array.from(t.x).includes(s)), y = tr.y[Array.from(tr.x).indexOf(s)];
            const box = gd.getBoundingClientRect();
            return [box.left + fl.xaxis._offset + fl.xaxis.l2p(s), box.top + fl.yaxis._offset + fl.yaxis.l2p(y)];
        }""", target)
        p.mouse.click(x, y)
        lo = max(0, min(target - 50, n - 100))
        p.wait_for_function(f"() => document.querySelector('#tl-window-stats').innerText.includes('steps {lo}–')")
        _idle(p)
        _shot(p, "timeline")
        problems = list(watch.problems)
    finally:
        ctx.close()
        srv.shutdown()
    assert problems == [], problems


def test_step_explorer_buttons_keys_and_heatmap(page: object) -> None:
    p = page
    with TraceReader(FAULT) as r:
        n = r.num_steps()
        bad = {v.step for v in check_steps(r.steps()) if v.check_id == "I10"}
        verify = [i for i in sorted(bad) if r.summary(i).mode.value == "TARGET_VERIFY" and i + 2 < n]
        first = verify[0] if verify else min(bad)  # a verify step shows the draft chain too
        step = r.step(first)
    p.goto(f"/step/{first}")  # type: ignore[attr-defined]
    _rendered(p, "step-heatmap")
    assert p.inner_text("#step-pos") == f"step {first} of {n}"  # type: ignore[attr-defined]
    assert "!" in p.inner_text("#step-heatmap")  # type: ignore[attr-defined]  # stale cells are marked
    assert p.locator("#request-table tbody tr").count() == len(step.requests)  # type: ignore[attr-defined]
    _idle(p)
    # A heatmap cell: the first one of row 0.
    box = p.locator("#step-heatmap .nsewdrag").first.bounding_box()  # type: ignore[attr-defined]
    cols = step.array("page_table").values.shape[1]
    rows = step.array("page_table").values.shape[0]
    p.mouse.click(box["x"] + box["width"] / cols / 2, box["y"] + box["height"] / rows / 2)  # type: ignore[attr-defined]
    p.wait_for_selector("#cell-table")  # type: ignore[attr-defined]
    text = p.inner_text("#cell-table")  # type: ignore[attr-defined]
    assert "physical page" in text and f"\t{int(step.array('page_table').values[0, 0])}" in text
    assert "req_to_token gives" in text and "tokens" in text and "owner" in text
    # (the step page screenshot comes from test_browser_marks.py, a step with violations marked)
    # Keys and buttons.
    p.keyboard.press("ArrowRight")  # type: ignore[attr-defined]
    p.wait_for_url(re.compile(rf"/step/{first + 1}$"))  # type: ignore[attr-defined]
    p.wait_for_function(f"() => document.querySelector('#step-pos')?.innerText === 'step {first + 1} of {n}'")  # type: ignore[attr-defined]
    p.click("#step-next")  # type: ignore[attr-defined]
    p.wait_for_url(re.compile(rf"/step/{first + 2}$"))  # type: ignore[attr-defined]
    p.wait_for_function(f"() => document.querySelector('#step-pos')?.innerText === 'step {first + 2} of {n}'")  # type: ignore[attr-defined]
    p.click("#step-prev")  # type: ignore[attr-defined]
    p.wait_for_url(re.compile(rf"/step/{first + 1}$"))  # type: ignore[attr-defined]
    p.wait_for_function(f"() => document.querySelector('#step-pos')?.innerText === 'step {first + 1} of {n}'")  # type: ignore[attr-defined]
    p.keyboard.press("ArrowLeft")  # type: ignore[attr-defined]
    p.wait_for_url(re.compile(rf"/step/{first}$"))  # type: ignore[attr-defined]
    p.wait_for_function(f"() => document.querySelector('#step-pos')?.innerText === 'step {first} of {n}'")  # type: ignore[attr-defined]
    _idle(p)


def test_step_urls_load_directly_and_bad_ones_say_why(page: object) -> None:
    p = page
    with TraceReader(FAULT) as r:
        n = r.num_steps()
    p.goto(f"/step/{n - 1}")  # type: ignore[attr-defined]
    p.wait_for_selector("#step-page")  # type: ignore[attr-defined]
    p.wait_for_load_state("networkidle")  # type: ignore[attr-defined]
    assert "disabled" in (p.get_attribute("#step-next", "class") or "")  # type: ignore[attr-defined]
    for url, msg in ((f"/step/{n + 5}", f"no step {n + 5}"), ("/step/abc", "no page"),
                     ("/step/1?trace=/etc/passwd", "no trace"), ("/nope", "no page")):
        p.goto(url)  # type: ignore[attr-defined]
        p.wait_for_selector("#error-message")  # type: ignore[attr-defined]
        p.wait_for_load_state("networkidle")  # type: ignore[attr-defined]  # leaving earlier aborts script loads
        assert msg in p.inner_text("#error-message"), url  # type: ignore[attr-defined]
        assert "Traceback" not in p.content()  # type: ignore[attr-defined]
    _idle(p)


def test_violations_link_to_the_highlighted_step(page: object) -> None:
    p = page
    with TraceReader(FAULT) as r:
        found = r.violations()
    ids = sorted({v.check_id for v in found})
    p.goto("/violations")  # type: ignore[attr-defined]
    p.wait_for_function("() => (document.querySelector('#viol-progress')?.innerText || '').includes('all ')")  # type: ignore[attr-defined]
    for cid in ids:
        assert cid in p.inner_text("#vl-checks"), cid  # type: ignore[attr-defined]
    assert f"{len(found)} violations" in p.inner_text("#viol-progress")  # type: ignore[attr-defined]
    _idle(p)
    p.locator("#vl-checks label", has_text="I10").locator("input").check()  # type: ignore[attr-defined]
    p.wait_for_function("() => document.querySelector('.viol-table tbody tr td:nth-child(2)')?.innerText === 'I10'")  # type: ignore[attr-defined]
    link = p.locator(".viol-table .viol-link").first  # type: ignore[attr-defined]
    href = link.get_attribute("href")
    link.click()
    p.wait_for_selector("#violation-banner")  # type: ignore[attr-defined]
    assert "I10" in p.inner_text("#violation-banner")  # type: ignore[attr-defined]
    assert p.locator("#request-table tr.hl").count() == 1 or "row=" not in href and "request=" not in href  # type: ignore[attr-defined]
    _rendered(p, "step-heatmap")
    _idle(p)


def test_acceptance_page(page: object) -> None:
    p = page
    p.goto("/acceptance")  # type: ignore[attr-defined]
    for g in ("acc-position", "acc-hist", "acc-time", "acc-bs", "acc-request"):
        _rendered(p, g)
    with TraceReader(FAULT) as r:
        hist = r.accept_histogram()
    mean = sum(n * c for n, c in enumerate(hist)) / sum(hist)
    assert f"{mean:.3f}" in p.inner_text("#acc-stats")  # type: ignore[attr-defined]
    _idle(p)
    # (the acceptance screenshot comes from test_browser_marks.py)


def test_compare_page(browser: object, twins: tuple[str, str]) -> None:
    # A fault run against its clean twin, both recorded by today's engine: they part where the fault fires.
    fault, clean = twins
    with TraceReader(fault) as a, TraceReader(clean) as b:
        rep = diff_traces(a, b, max_steps=2000)
    app = create_app(fault, clean, plotly=partial_bundle())  # type: ignore[arg-type]
    srv, url = serve_in_thread(app)
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000}, base_url=url)  # type: ignore[attr-defined]
    p = ctx.new_page()
    watch = Watch()
    watch.attach(p)
    p.set_default_timeout(TIMEOUT_MS)
    try:
        p.goto("/compare")
        p.wait_for_selector("#cmp-verdict")
        assert p.inner_text("#cmp-verdict") == rep.headline
        _rendered(p, "cmp-position")
        _idle(p)
        _shot(p, "compare")
        if rep.first is not None:
            p.click("#cmp-first-open-b")
            p.wait_for_url(re.compile(rf"/step/{rep.first.b_step}\?trace=b"))
            p.wait_for_selector("#step-page")
            assert f"step {rep.first.b_step} of" in p.inner_text("#step-pos")
            _idle(p)
        problems = list(watch.problems)
    finally:
        ctx.close()
        srv.shutdown()
    assert problems == [], problems
