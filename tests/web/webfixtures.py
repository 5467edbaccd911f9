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


def twin_command(trace: str, out: str, keep_faults: bool = False) -> list[str]:
    """The command that recorded `trace`, writing to `out`: without its --inject flags (the clean twin), or with
    them (the same fault recorded by today's engine)."""
    from specscope.tracer.store import TraceReader

    with TraceReader(trace) as r:
        argv = shlex.split(r.run.command)
    assert argv[:2] == ["specscope", "run"], argv
    args, skip = [], False
    for a in argv[2:]:
        if skip:
            skip = False
            continue
        if a in ("-o", "--output") or (a == "--inject" and not keep_faults):
            skip = True
            continue
        if a.startswith(("-o=", "--output=")) or a == "--overwrite" or (a.startswith("--inject=") and not keep_faults):
            continue
        args.append(a)
    return [sys.executable, "-m", "specscope.ui.cli", "run", *args, "-o", out, "--overwrite"]


def partial_bundle() -> object:
    """The committed partial plotly.js bundle, whichever plotly is installed: the browser tests run on it."""
    from specscope.ui.web import scripts

    names = sorted(f for f in os.listdir(scripts.STATIC) if f.startswith("plotly-") and f.endswith(".min.js"))
    assert len(names) == 1, names
    bundle = scripts.choose_bundle(scripts.bundle_version(os.path.join(scripts.STATIC, names[0])))
    assert bundle.partial, bundle
    return bundle


BROWSER_TIMEOUT_MS = 20_000  # the default for every wait of a page `open_page` makes


def serve(trace: str) -> Iterator[str]:
    """Serve `trace` on the partial plotly.js bundle for a module's tests; yields the base URL."""
    from specscope.ui.web.app import create_app
    from specscope.ui.web.server import serve_in_thread

    srv, url = serve_in_thread(create_app(trace, plotly=partial_bundle()))  # type: ignore[arg-type]
    try:
        yield url
    finally:
        srv.shutdown()


def open_page(browser: object, url: str) -> tuple[object, object, list[str]]:
    """A fresh context and page on `url`, and the list its console errors, page errors and HTTP errors go to."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000}, base_url=url)  # type: ignore[attr-defined]
    p = ctx.new_page()
    problems: list[str] = []
    p.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    p.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    p.on("response", lambda r: problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)
    p.set_default_timeout(BROWSER_TIMEOUT_MS)
    return ctx, p, problems


def screenshot_dir() -> str | None:
    """Where the browser tests save page screenshots (SPECSCOPE_SCREENSHOTS=docs/screenshots to refresh them)."""
    d = os.environ.get("SPECSCOPE_SCREENSHOTS")
    if not d:
        return None
    d = d if os.path.isabs(d) else os.path.join(ROOT, d)
    os.makedirs(d, exist_ok=True)
    return d


@pytest.fixture(scope="session", name="twins")
def twins_fixture(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """(fault, clean): the fault sample's command recorded now with and without its fault (in parallel, once per
    session, on the CPU engine), so the two differ only by the fault whatever engine recorded the sample."""
    pytest.importorskip("torch")
    d = tmp_path_factory.mktemp("twins")
    fault, clean = str(d / "fault.db"), str(d / "clean.db")
    procs = [subprocess.Popen(twin_command(FAULT, out, keep), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, cwd=ROOT) for out, keep in ((fault, True), (clean, False))]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    return fault, clean


@pytest.fixture(scope="session", name="clean_twin")
def clean_twin_fixture(twins: tuple[str, str]) -> str:
    """The clean run with the fault sample's exact flags."""
    return twins[1]


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
