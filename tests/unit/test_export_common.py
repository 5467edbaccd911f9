"""Small CPU traces with recorded attention, recorded once per test session by the real `specscope run`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# --record-attention 1: every step keeps its attention call (N > 1 sampled nothing in an older engine).
COMMON = ["--device", "cpu", "--requests", "3", "--batch-size", "2", "--max-new-tokens", "6", "--verify-tokens", "2",
          "--record-attention", "1", "--plan-stream", "--quiet"]  # plan stream: the traces carry wait edges
FAULT = ["--inject", "max-seq-len-q-override"]
BF16 = ["--dtype", "bfloat16", "--verify-tokens", "3"]  # a bf16 pool as on a GPU; T = 3 runs a draft decode


def recorded(tmp_path_factory: pytest.TempPathFactory, name: str, extra: list[str]) -> str:
    """Path of `name`.db, recorded at the first request in this session."""
    folder = Path(tmp_path_factory.getbasetemp()) / "export-traces"
    folder.mkdir(exist_ok=True)
    out = folder / f"{name}.db"
    if not out.exists():
        p = subprocess.run([sys.executable, "-m", "specscope.ui.cli", "run", *COMMON, *extra, "-o", str(out)],
                           capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "2"})
        assert p.returncode == 0, p.stderr
    return str(out)
