"""What the recording could not record, in the dashboard: a real SGLang 0.5.23 trace (its own backend, CPU) says so
in a banner on every page that opens to the full text, its graph replays say "not recorded (computed inside the
graph)" where their metadata would be, and the field the release lacks says "(absent in this backend)". A trace
that recorded everything shows no banner. Headless Debian chromium; fails on any console error."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

pytest.importorskip("dash")
pytest.importorskip("playwright")

from specscope.tracer.store import TraceReader  # noqa: E402
from webfixtures import FAULT, ROOT, browser_fixture, open_page, serve  # noqa: E402,F401

# Recorded with `PYTHONPATH=.sglang/0.5.23 python -m specscope.integrations.sglang_drive -o ...` (tests/unit/
# test_recording_notes.py checks it still says what a fresh recording says).
DRIVE = os.path.join(ROOT, "tests", "data", "sglang-0.5.23-drive.db")


def _first(graph: str, mode: str | None = None) -> int:
    with TraceReader(DRIVE) as r:
        return next(s.index for s in r.iter_summaries() if s.graph.value == graph
                    and (mode is None or s.mode.value == mode))



@pytest.fixture(scope="module")
def drive_url() -> Iterator[str]:
    yield from serve(DRIVE)


@pytest.fixture(scope="module")
def fault_url() -> Iterator[str]:
    yield from serve(FAULT)




def test_every_page_of_an_sglang_trace_says_what_it_could_not_record(browser: object, drive_url: str) -> None:
    ctx, p, problems = open_page(browser, drive_url)
    try:
        for path, ready in (("/", "#timeline-page"), ("/violations", "#page > div"), ("/acceptance", "#page > div"),
                            (f"/step/{_first('eager')}", "#step-page")):
            p.goto(path)  # type: ignore[attr-defined]
            p.wait_for_selector(ready)  # type: ignore[attr-defined]
            summary = p.locator("#recording-notes-a summary")  # type: ignore[attr-defined]
            assert summary.inner_text() == "⚠ recording: absent: max_seq_len_k · replay metadata not recorded", path
        # The summary opens to the full text, the release note included.
        p.locator("#recording-notes-a summary").click()  # type: ignore[attr-defined]
        full = p.locator("#recording-notes-a ul").inner_text()  # type: ignore[attr-defined]
        assert "max_seq_len_k absent in this backend" in full
        assert "graph replays' metadata not recorded: computed inside the graph (SGLang 0.5.15+)" in full
        assert not problems, problems
    finally:
        ctx.close()  # type: ignore[attr-defined]


def test_a_replay_says_its_metadata_was_computed_inside_the_graph(browser: object, drive_url: str) -> None:
    ctx, p, problems = open_page(browser, drive_url)
    try:
        # An eager step: the field SGLang 0.5.23 dropped is named absent, the rest is recorded.
        p.goto(f"/step/{_first('eager')}")  # type: ignore[attr-defined]
        detail = p.locator("#step-detail")  # type: ignore[attr-defined]
        detail.wait_for()
        rows = dict(line.split("\t", 1) for line in detail.inner_text().splitlines() if "\t" in line)
        assert rows["max_seq_len_k"] == "(absent in this backend)", rows
        assert rows["max_seq_len_q"].isdigit(), rows
        assert p.locator("#step-heatmap .main-svg").count() > 0  # type: ignore[attr-defined]
        # Replays, a verify replay among them: no values, and no capture's stale ones, but the reason.
        for i in (_first("replay"), _first("replay", "TARGET_VERIFY")):
            p.goto(f"/step/{i}")  # type: ignore[attr-defined]
            p.locator("#step-not-recorded").wait_for()  # type: ignore[attr-defined]
            rows = dict(line.split("\t", 1) for line in p.locator("#step-detail").inner_text().splitlines()  # type: ignore[attr-defined]
                        if "\t" in line)
            assert rows["max_seq_len_q"] == "not recorded (computed inside the graph)", rows
            assert rows["max_seq_len_k"] == "not recorded (computed inside the graph)", rows
            text = p.locator("#step-not-recorded").inner_text()  # type: ignore[attr-defined]
            assert text.startswith("not recorded (computed inside the graph): page table, cache_seqlens"), text
            assert p.locator("#step-heatmap").count() == 0  # type: ignore[attr-defined]
            assert "this step recorded no page table" not in p.locator("#step-page").inner_text()  # type: ignore[attr-defined]
        assert not problems, problems
    finally:
        ctx.close()  # type: ignore[attr-defined]


def test_a_trace_that_recorded_everything_shows_no_recording_banner(browser: object, fault_url: str) -> None:
    ctx, p, problems = open_page(browser, fault_url)
    try:
        p.goto("/")  # type: ignore[attr-defined]
        p.wait_for_selector("#timeline-page")  # type: ignore[attr-defined]
        assert p.locator("#recording-notes").count() == 1  # type: ignore[attr-defined]
        assert p.locator("#recording-notes > *").count() == 0  # type: ignore[attr-defined]
        assert not problems, problems
    finally:
        ctx.close()  # type: ignore[attr-defined]
