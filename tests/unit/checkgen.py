"""Real steps for the checker tests: one small CPU run of the embedded models per test session, plus helpers to
change one recorded value and push the steps through the public writer and reader before checking them."""

from __future__ import annotations

import dataclasses
import functools
import os
import tempfile
from collections.abc import Callable

import numpy as np
from specscope.tracer.checks import check_steps
from specscope.tracer.schema import ArraySnapshot, ForwardMode, GraphPhase, RunInfo, Step, Violation
from specscope.tracer.store import TraceReader, TraceWriter

BASE = dict(model="tiny", draft="tiny-draft", device="cpu", dtype="float32", batch_size=4, num_requests=6,
            max_new_tokens=12, spec_steps=3, seed=0, prompt_len=(20, 70), page_size=16, plan_stream=True)


@functools.cache
def base_run(**overrides: object) -> tuple[RunInfo, tuple[Step, ...]]:
    """The run record and every step of a clean CPU run (cached for the session)."""
    from specscope.backend.engine_config import EngineConfig
    from specscope.backend.session import run_session

    cfg = {**BASE, **overrides}
    path = os.path.join(tempfile.mkdtemp(prefix="specscope-checks-"), "base.db")
    run_session(EngineConfig(**cfg), path, command="tests checkgen")
    with TraceReader(path) as r:
        return r.run, tuple(r.steps())


def roundtrip(path: str, run: RunInfo, steps: list[Step] | tuple[Step, ...]) -> tuple[RunInfo, list[Step]]:
    """Write `steps` with the public writer, read them back."""
    with TraceWriter(path, run, overwrite=True) as w:
        for s in steps:
            w.write_step(s)
    with TraceReader(path) as r:
        return r.run, list(r.steps())


def check(path: str, run: RunInfo, steps: list[Step] | tuple[Step, ...]) -> list[Violation]:
    """Every violation of `steps` after a round trip through a trace file."""
    run, back = roundtrip(path, run, steps)
    return list(check_steps(back, run))


def ids(vs: list[Violation]) -> set[str]:
    """The check ids that fired."""
    return {v.check_id for v in vs}


def find(steps: tuple[Step, ...], pred: Callable[[Step], bool]) -> int:
    """Index (into `steps`) of the first step matching `pred`."""
    return next(i for i, s in enumerate(steps) if pred(s))


def verify_replay(s: Step, rows: int = 2, pages: int = 2) -> bool:
    """A target-verify replay with at least `rows` live rows, each reading at least `pages` pages."""
    cs = s.array("cache_seqlens")
    return (s.mode == ForwardMode.TARGET_VERIFY and s.graph == GraphPhase.REPLAY and s.batch_size >= rows
            and cs is not None and all(-(-int(x) // s.page_size) >= pages for x in cs.values[: s.batch_size]))


def set_cells(step: Step, name: str, edit: Callable[[np.ndarray], None]) -> Step:
    """A copy of `step` whose array `name` was changed in place by `edit` (on a copy)."""
    arrays = []
    for a in step.arrays:
        if a.name == name:
            v = a.values.copy()
            edit(v)
            a = ArraySnapshot(a.name, a.dtype, a.shape if v.shape == a.values.shape else tuple(v.shape), a.data_ptr, v)
        arrays.append(a)
    return dataclasses.replace(step, arrays=tuple(arrays))


def replace_step(steps: tuple[Step, ...], i: int, new: Step) -> list[Step]:
    """`steps` with step i replaced."""
    out = list(steps)
    out[i] = new
    return out


def set_request(step: Step, row: int, **fields: object) -> Step:
    """A copy of `step` with request row `row` changed."""
    reqs = list(step.requests)
    reqs[row] = dataclasses.replace(reqs[row], **fields)
    return dataclasses.replace(step, requests=tuple(reqs))
