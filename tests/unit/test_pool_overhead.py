"""benchmarks/pool_overhead.py on the committed H200 results: every measured round pooled per cell, and one line
with exit 2 for a file that is not a tracer_overhead result."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pool_overhead
import pytest

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"

FILES = [RESULTS / "tracer_overhead.json", RESULTS / "tracer_overhead_8b.json"]


def test_every_measured_round_of_every_file_is_pooled(capsys: pytest.CaptureFixture[str]) -> None:
    docs = [json.loads(f.read_text()) for f in FILES]
    pooled = pool_overhead.pooled(docs)
    key = ("llama3-8b (random weights)", 16)
    want = [x for d in docs for r in d["rows"] if (r["model"], r["batch_size"]) == key
            for x in r["round_ratios"]["traced"]]
    assert len(want) == 8 + 24 and pooled[key] == want
    assert len(pooled[("tiny", 1)]) == 8  # only the first file has tiny cells
    d = pool_overhead.describe(pooled[key])
    assert d["median"] == statistics.median(want) and d["min"] <= d["q1"] <= d["median"] <= d["q3"] <= d["max"]
    assert pool_overhead.main([str(f) for f in FILES]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sum("rounds  median" in x for x in lines) == 6  # 3 tiny + 3 8B cells
    assert any(x.startswith("llama3-8b") and " 16 " in x and " 32 rounds" in x for x in lines)


def test_a_file_that_is_not_a_result_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "engine_speed.json"
    bad.write_text(json.dumps({"rows": [{"model": "tiny"}]}))
    assert pool_overhead.main([str(FILES[0]), str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a tracer_overhead.py result" in err[0]
