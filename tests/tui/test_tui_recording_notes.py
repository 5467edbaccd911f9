"""What the recording could not record, on screen: a real SGLang 0.5.23 trace (its own backend, CPU) opened in the
app says so in a notice line at 80x24, its graph replays say "not recorded (computed inside the graph)" instead of
empty or stale arrays, the field the release lacks says "(absent in this backend)", and help has the full text."""

from __future__ import annotations

import json
import shutil
import sqlite3

import pytest
from specscope.tracer.store import TraceReader
from specscope.ui.tui.app import SpecscopeApp
from specscope.ui.tui.screens import HelpScreen
from textual.widgets import Static
from tui_fixtures import _at_root, anyio_backend, screen_text, until  # noqa: F401 - fixtures
from tui_samples import sample

# Recorded with `PYTHONPATH=.sglang/0.5.23 python -m specscope.integrations.sglang_drive -o ...` (tests/unit/
# test_recording_notes.py checks it still says what a fresh recording says).
DRIVE = "tests/data/sglang-0.5.23-drive.db"


def _help_text(app: SpecscopeApp) -> str:
    """The open help screen's text, as one line per paragraph (80 columns wrap it)."""
    assert isinstance(app.screen, HelpScreen)
    return " ".join(str(app.screen.query_one(Static).render()).split())



def _first(graph: str, mode: str | None = None) -> int:
    with TraceReader(DRIVE) as r:
        return next(s.index for s in r.iter_summaries() if s.graph.value == graph
                    and (mode is None or s.mode.value == mode))


@pytest.mark.anyio
async def test_an_sglang_trace_says_what_it_could_not_record_at_80x24() -> None:
    replay, verify, eager = _first("replay"), _first("replay", "TARGET_VERIFY"), _first("eager")
    app = SpecscopeApp(DRIVE, start=eager)
    async with app.run_test(size=(80, 24)) as pilot:
        await app.ready()
        await pilot.pause()
        screen = screen_text(app)
        notice = screen.splitlines()[1]
        assert notice.strip() == "⚠ recording: absent: max_seq_len_k · replay metadata not recorded · ? details"
        # An eager step: the field SGLang 0.5.23 dropped is named absent, not shown as "-".
        assert "max_seq_len_k (absent in this backend)" in screen
        assert "max_seq_len_k -" not in screen
        assert "cache_sl" in screen  # its page table is recorded
        # A replay: the graph computed its metadata; the panes say so and show no capture's values.
        app.move_to(replay)
        await pilot.pause()
        screen = screen_text(app)
        assert app._detail.plain.splitlines()[2].startswith("not recorded (computed inside the graph): max_seq_len_q")
        lines = [ln for ln in screen.splitlines() if "not recorded (computed inside the graph)" in ln]
        assert len(lines) == 2, screen  # the step pane and the page-table pane
        assert "no page table in this step" not in screen and "cache_sl" not in screen
        assert "replay of capture" in screen and "(+1 pad)" in screen  # its header and requests are recorded
        # A verify replay keeps its acceptance scalar, and is still a replay without metadata.
        app.move_to(verify)
        await pilot.pause()
        assert screen_text(app).count("not recorded (computed inside the graph)") == 2
        # Help has the whole text, with the release note the short form leaves out.
        await pilot.press("question_mark")
        await pilot.pause()
        text = _help_text(app)
        assert "What this trace could not record" in text
        assert "computed inside the graph (SGLang 0.5.15+)" in text
        assert "max_seq_len_k absent in this backend" in text


@pytest.mark.anyio
async def test_the_draft_chain_of_a_trace_without_accepted_tokens_counts_by_accept_length() -> None:
    """SGLang's backend sees accept lengths, not tokens: the chain marks the first accept_length - 1 drafts
    accepted and says the tokens are not recorded, rather than striking every draft as rejected."""
    verify = _first("replay", "TARGET_VERIFY")
    with TraceReader(DRIVE) as r:
        rows = r.step(verify).requests
    app = SpecscopeApp(DRIVE, start=verify)
    async with app.run_test(size=(120, 40)) as pilot:
        await app.ready()
        await pilot.pause()
        chain = app._chain.plain
        assert "tokens not recorded" in chain
        for row in rows:
            line = next(ln for ln in chain.splitlines() if ln.startswith(f"r{row.request_id}"))
            assert line.count("✓") == row.accept_length - 1, line
            assert line.count("✗") == len(row.draft_tokens) - (row.accept_length - 1), line


@pytest.mark.anyio
async def test_recording_problems_lead_the_notice_and_a_clean_trace_has_none(tmp_path) -> None:
    """A trace whose recorder failed somewhere (its `meta.recording_problems`, as the SGLang recorder writes it)
    says so first; a trace of the engine shows no notice line at all."""
    path = str(tmp_path / "problems.db")
    shutil.copyfile(DRIVE, path)
    with sqlite3.connect(path) as db:  # the row the recorder writes (SglangTracer._write_problems)
        db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", ("recording_problems", json.dumps(
            [{"what": "prep: page table", "first_step": 13, "count": 2,
              "detail": "IndexError: index 9 out of range"}])))
    app = SpecscopeApp(path)
    async with app.run_test(size=(80, 24)) as pilot:
        await app.ready()
        await pilot.pause()
        notice = screen_text(app).splitlines()[1].strip()
        assert notice.startswith("⚠ recording: 2 recording problems · ") and notice.endswith("? details"), notice
        assert len(notice) <= 78
        await pilot.press("f1")
        await pilot.pause()
        assert "prep: page table: 2x, first at step 13: IndexError: index 9 out of range" in _help_text(app)
    clean = SpecscopeApp(sample("cpu-default"))
    async with clean.run_test(size=(80, 24)) as pilot:
        await clean.ready()
        await pilot.pause()
        assert "recording:" not in screen_text(clean) and not clean._notice.display
