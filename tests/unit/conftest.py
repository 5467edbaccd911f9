"""Shared fixtures for the tracer tests."""

from __future__ import annotations

import os

import pytest
from specscope.tracer.schema import Severity, Violation
from specscope.tracer.store import TraceWriter
from stepgen import make_request, make_run, make_step

NUM_STEPS = 12


def write_small_trace(path: str, num_steps: int = NUM_STEPS) -> str:
    """A closed trace with `num_steps` steps, 3 requests and one checker violation."""
    with TraceWriter(path, make_run()) as w:
        for i in range(num_steps):
            w.write_step(make_step(i))
        for r in range(3):
            w.write_request(make_request(r))
        w.add_violations([Violation("I16", Severity.ERROR, 4, "step 4: max_seq_len_q 4 != frozen 3", 1002)])
    return path


@pytest.fixture
def small_trace(tmp_path: os.PathLike[str]) -> str:
    """Path of a fresh closed trace with a few steps."""
    return write_small_trace(os.path.join(tmp_path, "small.db"))
