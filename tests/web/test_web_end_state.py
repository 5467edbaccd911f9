"""The dashboard's trace line says how the run behind a trace ended: a run cut short names its end and the step it
ended at instead of "closed"."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("dash")

from specscope.ui.web.app import create_app  # noqa: E402
from stepgen import write_ended_trace  # noqa: E402
from test_callbacks import page, texts  # noqa: E402

NUM_STEPS = 30


def _trace(path: Path, end: tuple[str, str] | None) -> str:
    return write_ended_trace(str(path), NUM_STEPS, end)


@pytest.mark.parametrize(("end", "label"), [
    (None, "(closed)"),
    (("interrupted", "SIGINT"), f"(interrupted (SIGINT) at step {NUM_STEPS - 1})"),
    (("engine_ended", ""), "(interrupted (the engine process ended))"),
    (("cuda_error", "CUDA error: an illegal memory access"), f"(ended by a CUDA error at step {NUM_STEPS - 1})"),
])
def test_the_trace_line_names_how_the_run_ended(tmp_path: Path, end: tuple[str, str] | None, label: str) -> None:
    client = create_app(_trace(tmp_path / "t.db", end))
    text = texts(page(client, "/"))
    assert f"t.db · {NUM_STEPS} steps {label} · " in text, text[:600]
