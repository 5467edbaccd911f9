"""Snapshots of the main screens at 120x40 and 80x24 (pytest-textual-snapshot; SVGs under __snapshots__).

After an intended change of the screens (or re-recorded samples, or a changed check catalogue), review and
accept with `pytest tests/tui/test_snapshots.py --snapshot-update`, then refresh docs/screenshots with
`python tests/tui/copy_screenshots.py`.
"""

from __future__ import annotations

import pytest
from specscope.tracer.store import TraceReader
from specscope.ui.tui.app import SpecscopeApp
from tui_fixtures import _at_root  # noqa: F401 - fixtures
from tui_samples import sample

SIZES = {"wide": (120, 40), "small": (80, 24)}


def _verify_step(path: str) -> int:
    with TraceReader(path) as r:
        return r.find_steps("verify", after=r.num_steps() // 3)[0]


def _main(path: str, step: int | None = None, press: tuple[str, ...] = ()):
    async def run_before(pilot) -> None:
        app = pilot.app
        await app.ready()
        if step is not None:
            app.move_to(step)
        for k in press:
            await pilot.press(k)
        await pilot.pause()

    return run_before


@pytest.mark.parametrize("size", SIZES)
def test_main_screen(snap_compare, size: str) -> None:
    path = sample("cpu-default")
    assert snap_compare(SpecscopeApp(path), terminal_size=SIZES[size], run_before=_main(path, _verify_step(path)))


@pytest.mark.parametrize("size", SIZES)
def test_violation_jump(snap_compare, size: str) -> None:
    path = sample("cpu-fault-stale-page-table")
    assert snap_compare(SpecscopeApp(path), terminal_size=SIZES[size], run_before=_main(path, 0, ("n",)))


def test_side_column_on_a_small_terminal(snap_compare) -> None:
    path = sample("cpu-fault-stale-page-table")
    assert snap_compare(SpecscopeApp(path), terminal_size=SIZES["small"], run_before=_main(path, 0, ("n", "v")))


def test_padded_replay_grid(snap_compare) -> None:
    path = sample("h200-graphs-changing-bs")
    with TraceReader(path) as r:
        step = next(s.index for s in r.iter_summaries() if s.graph.value == "replay"
                    and s.padded_batch_size > s.batch_size)
    assert snap_compare(SpecscopeApp(path), terminal_size=SIZES["wide"], run_before=_main(path, step))


def test_help_screen(snap_compare) -> None:
    path = sample("cpu-default")
    assert snap_compare(SpecscopeApp(path), terminal_size=SIZES["wide"], run_before=_main(path, 0, ("f1",)))
