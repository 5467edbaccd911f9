"""The checker never crashes on a readable trace: real steps with arrays truncated, emptied, reshaped or filled
with wild values, fed through `Checker.feed` (a seeded, reproducible fuzz)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("torch")

from checkgen import base_run  # noqa: E402
from specscope.tracer.checks import Checker  # noqa: E402
from specscope.tracer.schema import ArraySnapshot  # noqa: E402


def _mutate(a: ArraySnapshot, rng: np.random.Generator) -> ArraySnapshot:
    v = a.values
    k = rng.integers(0, 6)
    if k == 0 and v.size:
        v = v.reshape(-1)[: rng.integers(0, v.size)]  # truncated (and flattened)
    elif k == 1:
        v = v[:0]  # empty
    elif k == 2 and v.ndim == 1:
        v = np.concatenate([v, v[:3]])  # too long
    elif k == 3:
        v = rng.integers(-2**31, 2**31 - 1, v.shape).astype(v.dtype) if v.dtype.kind == "i" else v * np.nan
    elif k == 4 and v.ndim == 2:
        v = v.T.copy()
    else:
        v = v.reshape(-1).copy()[::-1]
    return ArraySnapshot(a.name, a.dtype, tuple(v.shape), a.data_ptr, np.ascontiguousarray(v))


def test_checker_survives_inconsistent_arrays() -> None:
    run, steps = base_run()
    rng = np.random.default_rng(0)
    flagged = 0
    for trial in range(100):
        checker = Checker(run)
        for s in steps[: 12 + trial % 25]:
            if rng.random() < 0.3 and s.arrays:
                arrays = list(s.arrays)
                for i in rng.choice(len(arrays), size=rng.integers(1, 4)):
                    arrays[i] = _mutate(arrays[i], rng)
                s = dataclasses.replace(s, arrays=tuple(arrays))
            vs = checker.feed(s)  # must not raise
            flagged += any(v.check_id in ("I1", "I2") for v in vs)
    assert flagged > 20
