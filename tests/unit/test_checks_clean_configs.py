"""No false alarm on unusual but legal runs: the whole catalogue is silent on every clean trace in
tests/data/clean/ (see its README), except I7's warning where T != K, which is by design."""

from __future__ import annotations

from pathlib import Path

import pytest
from specscope.tracer.checks import check_steps
from specscope.tracer.store import TraceReader

CLEAN = Path(__file__).resolve().parents[1] / "data" / "clean"
TRACES = sorted(CLEAN.glob("*.db"))


def test_the_unusual_configurations_are_all_there() -> None:
    assert {p.stem for p in TRACES} >= {"attention", "bs-changes", "k16", "long", "page-boundary", "page128",
                                        "t-gt-k", "t-lt-k", "temperature"}


@pytest.mark.parametrize("path", TRACES, ids=[p.stem for p in TRACES])
def test_catalogue_is_silent_on_a_clean_unusual_run(path: Path) -> None:
    with TraceReader(str(path)) as r:
        run = r.run
        steps = list(r.steps())
    found = list(check_steps(steps, run))
    t_ne_k = run.config["verify_tokens"] != run.config["spec_steps"] + 1
    allowed = {"I7"} if t_ne_k else set()
    assert steps and [v.message for v in found if v.check_id not in allowed] == []
    assert all(v.severity.value == "warning" for v in found)
