"""The TUI on a bug-report bundle: its steps keep the original trace's numbers (the range, and the captures it adds
before it), and go-to, stepping, home / end, n / N and the status line speak of those numbers."""

from __future__ import annotations

from pathlib import Path

import pytest
from specscope.tracer.store import TraceReader
from specscope.ui.cli import main
from specscope.ui.tui.app import SpecscopeApp
from specscope.ui.tui.step_list import StepList
from tui_fixtures import _at_root, anyio_backend, screen_text  # noqa: F401 - fixtures
from tui_samples import ROOT, sample

START, STOP = 30, 50  # a middle range of the stale-page-table sample: violations in it, graph captures before it


@pytest.fixture
def bundle(tmp_path: Path) -> str:
    """`specscope export SAMPLE --bundle t.zip --steps 30:50`, through the real command line."""
    out = tmp_path / "t.zip"
    src = str(Path(ROOT) / sample("cpu-fault-stale-page-table"))
    assert main(["export", src, "--bundle", str(out), "--steps", f"{START}:{STOP}"]) == 0
    return str(out)



@pytest.mark.anyio
async def test_go_to_and_step_keys_use_the_original_step_numbers(bundle: str) -> None:
    with TraceReader(bundle) as r:
        held = r.step_indexes()
    captures = [i for i in held if i < START]
    assert captures and held == captures + list(range(START, STOP))
    app = SpecscopeApp(bundle)
    async with app.run_test(size=(120, 40)) as pilot:
        await app.ready()
        app.accel.window = 0  # every press a lone press
        assert app.current == captures[0]  # the first step the bundle holds, not 0
        await pilot.press("g", "4", "0", "enter")
        assert app.current == 40
        assert app.query_one(StepList).cursor == held.index(40)  # its row in the list
        assert "step 40/49" in screen_text(app) and app.source.display == bundle  # the zip, not its copy
        await pilot.press("right_square_bracket")
        assert app.current == 41
        await pilot.press("left_square_bracket", "left_square_bracket")
        assert app.current == 39
        # A step the bundle left out: the prompt stays and says which steps there are.
        await pilot.press("g", "2", "0", "enter")
        text = screen_text(app)
        assert "no step 20" in text and f"{START}–{STOP - 1}" in text
        await pilot.press("escape")
        assert app.current == 39
        # The gap between the captures and the range is one step for [ and ].
        assert app.goto_text(str(START)) is None and app.current == START
        await pilot.press("left_square_bracket")
        assert app.current == captures[-1]
        await pilot.press("right_square_bracket")
        assert app.current == START
        assert app.goto_text("+3") is None and app.current == START + 3
        await pilot.press("end")
        assert app.current == STOP - 1
        await pilot.press("home")
        assert app.current == captures[0]
        # n: the next step with a violation, by its original number; every violation the TUI holds is one.
        await pilot.press("n")
        viol = app.source.violations
        assert app.current in held and viol.at(app.current)
        assert viol.total() and all(s in held for s in viol.by_step)
        # A click on a row picks the step in that row.
        row = app.source.index_at(len(captures) + 5)
        assert row is not None
        app.on_step_list_picked(StepList.Picked(row))
        assert app.current == START + 5
