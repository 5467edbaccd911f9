"""docs/checks.md is what the catalogue, the fault list and the committed detection tables make of it, and its
fact-coverage matrix has no empty cell without a reason."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "checks.md"
TABLES = [ROOT / "docs" / "detection-cpu.json", ROOT / "docs" / "detection-h200.json"]


def _script(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / name), *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def test_checks_doc_is_the_rendered_catalogue() -> None:
    """Regenerate with: python scripts/render_checks_doc.py docs/detection-cpu.json docs/detection-h200.json
    > docs/checks.md"""
    p = _script("render_checks_doc.py", *map(str, TABLES))
    assert p.returncode == 0, p.stderr
    assert p.stdout == DOC.read_text(), "docs/checks.md is stale: re-render it (see this test's docstring)"


def test_every_empty_coverage_cell_is_explained() -> None:
    p = _script("check_coverage.py", "--check")
    assert p.returncode == 0, p.stdout + p.stderr
    text = DOC.read_text()
    for inv in ("I36", "I37", "I38", "I39", "I40", "I41", "I42"):
        assert f"| {inv} |" in text  # in the catalogue table, and named in the matrix's cells
