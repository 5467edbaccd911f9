"""Constants, helpers and fixtures of the dashboard tests. Not a conftest.py: tests/unit imports names from its
own conftest, and a second module called `conftest` would shadow it; test modules import these explicitly."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Iterator

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLES = os.path.join(ROOT, "samples", "traces")
FAULT = os.path.join(SAMPLES, "cpu-fault-stale-page-table.db")
PLAN = os.path.join(SAMPLES, "cpu-plan-stream-attention.db")
CHROMIUM = "/usr/bin/chromium"


def twin_command(trace: str, out: str) -> list[str]:
    """The command that recorded `trace`, without its --inject flags, writing to `out`: the clean twin."""
    from specscope.tracer.store import TraceReader

    with TraceReader(trace) as r:
        argv = shlex.split(r.run.command)
    assert argv[:2] == ["specscope", "run"], argv
    args, skip = [], False
    for a in argv[2:]:
        if skip:
            skip = False
            continue
        if a in ("--inject", "-o", "--output"):
            skip = True
            continue
        if a.startswith(("--inject=", "-o=", "--output=")) or a == "--overwrite":
            continue
        args.append(a)
    return [sys.executable, "-m", "specscope.ui.cli", "run", *args, "-o", out, "--overwrite"]


def screenshot_dir() -> str | None:
    """Where the browser tests save page screenshots (SPECSCOPE_SCREENSHOTS=docs/screenshots to refresh them)."""
    d = os.environ.get("SPECSCOPE_SCREENSHOTS")
    if not d:
        return None
    d = d if os.path.isabs(d) else os.path.join(ROOT, d)
    os.makedirs(d, exist_ok=True)
    return d


@pytest.fixture(scope="session", name="clean_twin")
def clean_twin_fixture(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A clean run with the fault sample's exact flags (recorded once per session on the CPU engine)."""
    pytest.importorskip("torch")
    out = str(tmp_path_factory.mktemp("twin") / "clean.db")
    p = subprocess.run(twin_command(FAULT, out), capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    return out


@pytest.fixture(scope="module", name="browser")
def browser_fixture() -> Iterator[object]:
    """Headless Debian chromium driven by Playwright (one per test module)."""
    sync_api = pytest.importorskip("playwright.sync_api")
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: CI installs Debian's chromium (.ci/run)")
    pw = sync_api.sync_playwright().start()
    b = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
    try:
        yield b
    finally:
        b.close()
        pw.stop()
