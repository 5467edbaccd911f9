"""Browser tests of the marks, the violations page and the timeline's range boxes, in headless Debian chromium:
the #27495 sample's verify step shows max_seq_len_q marked with no click, a violation found with one filter opens
its step with one click, n / N walk violations, Enter commits a step-range box. Fails on any console error.
SPECSCOPE_SCREENSHOTS=docs/screenshots refreshes the page screenshots these tests take."""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

pytest.importorskip("dash")
pytest.importorskip("playwright")

from specscope.tracer.store import TraceReader  # noqa: E402
from specscope.ui.web import explorer_parts as pages  # noqa: E402
from specscope.ui.web.explorer_parts import short_message  # noqa: E402
from webfixtures import FAULT, SAMPLES, browser_fixture, open_page, screenshot_dir, serve  # noqa: E402,F401

OVERRIDE = os.path.join(SAMPLES, "cpu-fault-max-seq-len-q-override.db")



@pytest.fixture(scope="module")
def fault_url() -> Iterator[str]:
    yield from serve(FAULT)


@pytest.fixture(scope="module")
def override_url() -> Iterator[str]:
    yield from serve(OVERRIDE)




def _shot(p: object, name: str, full_page: bool = False) -> None:
    d = screenshot_dir()
    if d:
        p.screenshot(path=os.path.join(d, f"web-{name}.png"), full_page=full_page)  # type: ignore[attr-defined]


def _idle(p: object) -> None:
    p.wait_for_function("() => !document.querySelector('[data-dash-is-loading=\"true\"]')")  # type: ignore[attr-defined]
    p.wait_for_timeout(200)  # type: ignore[attr-defined]


def test_the_first_violating_verify_step_shows_max_seq_len_q_marked(browser: object, override_url: str) -> None:
    with TraceReader(OVERRIDE) as r:
        first = next(v.step for v in r.violations() if r.summary(v.step).mode.value == "TARGET_VERIFY")
    ctx, p, problems = open_page(browser, override_url)
    try:
        p.goto(f"/step/{first}")  # type: ignore[attr-defined]
        row = p.locator("#step-detail tr.marked", has_text="max_seq_len_q")  # type: ignore[attr-defined]
        row.wait_for()
        assert "4 ✗ I6: 4, expected 2" in row.inner_text().replace("\t", " ")
        assert "I6" in p.inner_text("#step-violations")  # type: ignore[attr-defined]
        # the violations are above the fold, before the detail
        assert p.locator("#step-violations").bounding_box()["y"] < 300  # type: ignore[attr-defined]
        p.wait_for_selector("#step-heatmap .main-svg", state="attached")  # type: ignore[attr-defined]
        _idle(p)
        _shot(p, "step-marks")
    finally:
        ctx.close()  # type: ignore[attr-defined]
    assert problems == [], problems


def test_a_violation_found_with_one_filter_opens_marked_with_one_click(browser: object, fault_url: str) -> None:
    with TraceReader(FAULT) as r:
        every = r.violations()
    v = every[-7]  # deep in the list: page 22 of 22 without a filter
    ctx, p, problems = open_page(browser, fault_url)
    try:
        p.goto("/violations")  # type: ignore[attr-defined]
        p.wait_for_selector(".viol-table")  # type: ignore[attr-defined]
        assert f"of {len(every):,} violations" in p.inner_text("#vl-count")  # type: ignore[attr-defined]
        _idle(p)
        _shot(p, "violations")
        box = p.locator("#vl-from")  # type: ignore[attr-defined]
        box.fill(str(v.step))
        box.press("Enter")
        p.wait_for_function(f"() => document.querySelector('.viol-table td a')?.innerText === 'step {v.step}'")  # type: ignore[attr-defined]
        row = p.locator(".viol-table tr", has_text=v.message.split(": ", 1)[1][:60]).first  # type: ignore[attr-defined]
        row.locator("a").click()
        p.wait_for_url(re.compile(rf"/step/{v.step}\?v=\d+&check={v.check_id}"))  # type: ignore[attr-defined]
        p.wait_for_selector("#violation-banner")  # type: ignore[attr-defined]
        assert v.check_id in p.inner_text("#violation-banner")  # type: ignore[attr-defined]
        assert p.locator("#step-violations li.cur").count() == 1  # type: ignore[attr-defined]
        assert f"found {v.found}, expected {v.expected}" in p.inner_text("#step-violations li.cur")  # type: ignore[attr-defined]
        _idle(p)
    finally:
        ctx.close()  # type: ignore[attr-defined]
    assert problems == [], problems


def test_n_and_shift_n_walk_the_violations(browser: object, fault_url: str) -> None:
    with TraceReader(FAULT) as r:
        every = r.violations()
    steps = sorted({v.step for v in every})
    a, b = steps[0], steps[1]
    here = sum(1 for v in every if v.step == a)
    ctx, p, problems = open_page(browser, fault_url)
    try:
        p.goto(f"/step/{a}")  # type: ignore[attr-defined]
        p.wait_for_selector("#step-violations")  # type: ignore[attr-defined]
        _idle(p)
        for k in range(here):
            p.keyboard.press("n")  # type: ignore[attr-defined]
            p.wait_for_url(re.compile(rf"/step/{a}\?v={k}&"))  # type: ignore[attr-defined]
            cur = f"() => document.querySelector('#step-violations li.cur')?.value === {k + 1}"  # the list's number
            p.wait_for_function(cur)  # type: ignore[attr-defined]
        p.keyboard.press("n")  # type: ignore[attr-defined]  # past the step's last: the next step's first
        p.wait_for_url(re.compile(rf"/step/{b}\?v=0&"))  # type: ignore[attr-defined]
        p.wait_for_function(f"() => document.querySelector('#step-pos')?.innerText.startsWith('step {b} ')")  # type: ignore[attr-defined]
        p.keyboard.press("Shift+N")  # type: ignore[attr-defined]
        p.wait_for_url(re.compile(rf"/step/{a}\?v={here - 1}&"))  # type: ignore[attr-defined]
        p.click("#viol-next")  # type: ignore[attr-defined]  # the buttons do the same
        p.wait_for_url(re.compile(rf"/step/{b}\?v=0&"))  # type: ignore[attr-defined]
        p.wait_for_selector("#step-heatmap .main-svg", state="attached")  # type: ignore[attr-defined]
        _idle(p)
        _shot(p, "step")
    finally:
        ctx.close()  # type: ignore[attr-defined]
    assert problems == [], problems


def test_a_step_range_box_commits_on_enter(browser: object, fault_url: str) -> None:
    ctx, p, problems = open_page(browser, fault_url)
    try:
        p.goto("/")  # type: ignore[attr-defined]
        p.wait_for_selector("#tl-gantt .main-svg", state="attached")  # type: ignore[attr-defined]
        _idle(p)
        before = p.inner_text("#tl-window-stats")  # type: ignore[attr-defined]
        box = p.locator("#tl-from")  # type: ignore[attr-defined]
        box.fill("20")
        p.locator("#tl-to").fill("60")  # type: ignore[attr-defined]  # leaving the first box commits nothing
        p.wait_for_timeout(400)  # type: ignore[attr-defined]
        assert p.inner_text("#tl-window-stats") == before  # type: ignore[attr-defined]
        p.locator("#tl-to").press("Enter")  # type: ignore[attr-defined]
        p.wait_for_function("() => document.querySelector('#tl-window-stats').innerText.includes('steps 20–60')")  # type: ignore[attr-defined]
        _idle(p)
        p.check("#tl-outliers input")  # type: ignore[attr-defined]  # the full scale, outliers included
        _idle(p)
        _shot(p, "timeline-window")
    finally:
        ctx.close()  # type: ignore[attr-defined]
    assert problems == [], problems


def test_the_acceptance_page_draws(browser: object, fault_url: str) -> None:
    ctx, p, problems = open_page(browser, fault_url)
    try:
        p.goto("/acceptance")  # type: ignore[attr-defined]
        for g in ("acc-position", "acc-hist", "acc-time", "acc-bs", "acc-request"):
            p.wait_for_selector(f"#{g} .main-svg", state="attached")  # type: ignore[attr-defined]
        _idle(p)
        _shot(p, "acceptance")
    finally:
        ctx.close()  # type: ignore[attr-defined]
    assert problems == [], problems


@pytest.fixture(scope="module")
def crowded(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A bs-24 run of the stale page table fault: 33 violations at each of its worst steps."""
    pytest.importorskip("torch")
    path = str(tmp_path_factory.mktemp("crowded") / "crowded.db")
    subprocess.run([sys.executable, "-m", "specscope.ui.cli", "run", "--device", "cpu", "--requests", "24",
                    "--batch-size", "24", "--max-new-tokens", "8", "--page-size", "16", "--inject", "stale-page-table",
                    "--quiet", "-o", path], check=True, capture_output=True, timeout=300)
    return path


def test_a_crowded_step_lists_every_violation_and_n_walks_past_the_drawn_ones(browser: object, crowded: str) -> None:
    """More violations than the list draws as links: every one is on the page in full, and `n` reaches each,
    the current one drawn as a link with its cell marked."""
    with TraceReader(crowded) as r:
        every = r.violations()
    by_step = collections.Counter(v.step for v in every)
    step, n = by_step.most_common(1)[0]
    assert n > pages.MAX_LISTED + 4
    here = [v for v in every if v.step == step]
    for url in serve(crowded):
        ctx, p, problems = open_page(browser, url)
        try:
            p.goto(f"/step/{step}")  # type: ignore[attr-defined]
            p.wait_for_selector("#step-violations")  # type: ignore[attr-defined]
            assert p.locator("#step-violations li").count() == pages.MAX_LISTED  # type: ignore[attr-defined]
            rest = p.locator("#step-violations-rest pre").inner_text()  # type: ignore[attr-defined]
            assert len(rest.splitlines()) == n - pages.MAX_LISTED
            text = p.inner_text("#step-violations") + rest  # type: ignore[attr-defined]
            for v in here:  # in full: the message and the cell with found vs expected
                assert short_message(v) in text, v.message
                assert f"found {v.found}" in text
            _idle(p)
            k = pages.MAX_LISTED + 3  # past the links drawn at first
            for j in range(k + 1):  # one key a rendered page: a key pressed mid-render clicks the old link
                p.keyboard.press("n")  # type: ignore[attr-defined]
                p.wait_for_url(re.compile(rf"/step/{step}\?v={j}&"))  # type: ignore[attr-defined]
                p.wait_for_function(f"() => document.querySelector('#step-violations li.cur')?.value === {j + 1}")  # type: ignore[attr-defined]
            p.wait_for_function(f"() => document.querySelector('#step-violations li.cur')?.value === {k + 1}")  # type: ignore[attr-defined]
            cur = p.inner_text("#step-violations li.cur")  # type: ignore[attr-defined]
            assert here[k].check_id in cur and f"found {here[k].found}" in cur
            assert p.locator("#step-violations li").count() == pages.MAX_LISTED  # type: ignore[attr-defined]
            assert len(p.locator("#step-violations-rest pre").inner_text().splitlines()) == n - pages.MAX_LISTED  # type: ignore[attr-defined]
        finally:
            ctx.close()  # type: ignore[attr-defined]
        assert problems == [], problems
