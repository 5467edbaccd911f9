"""The partial plotly.js bundle: it registers every trace type the dashboard's figures emit, it is the bundle served
(with the full one as the fallback for another plotly.js version), and the build script's cut of plotly.js's
register list works on the installed plotly's real bundle."""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import os
import re
import sys
from typing import Any

import pytest

pytest.importorskip("dash")

from specscope.ui.web import dashboard, figures, scripts, timeline  # noqa: E402
from specscope.ui.web.app import create_app  # noqa: E402
from webfixtures import ROOT, SAMPLES  # noqa: E402

TRACE_RE = re.compile(rb'moduleType:"trace",name:"(\w+)"')


def _committed() -> str:
    found = glob.glob(os.path.join(scripts.STATIC, "plotly-*.min.js"))
    assert len(found) == 1, found  # one partial bundle is committed, for one plotly.js version
    return found[0]


def _build_script() -> Any:
    spec = importlib.util.spec_from_file_location("build_plotly_partial", os.path.join(ROOT, "scripts",
                                                                                      "build_plotly_partial.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_committed_bundle_registers_exactly_the_partial_traces() -> None:
    path = _committed()
    version = scripts.bundle_version(path)
    assert version is not None and os.path.basename(path) == scripts.partial_name(version)
    with open(path, "rb") as f:
        data = f.read()
    assert data.startswith(b"/**\n* plotly.js v" + version.encode()) and b"Licensed under the MIT license" in data[:200]
    assert set(m.decode() for m in TRACE_RE.findall(data)) == set(scripts.PARTIAL_TRACES)
    assert len(data) < 1_500_000  # the full bundle is 4.85 MB


def _figure_functions() -> list[str]:
    return sorted(n for n in dir(figures) if n.endswith("_figure") and callable(getattr(figures, n)))


def test_the_partial_traces_are_what_the_figure_functions_emit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every figure function's output while every page of every sample trace is built: the trace types in it are
    the partial bundle's (a figure with a new trace type fails here, not in a user's browser)."""
    emitted: dict[str, set[str]] = {n: set() for n in _figure_functions()}

    def recording(name: str, fn: Any) -> Any:
        def inner(*args: Any, **kw: Any) -> Any:
            fig = fn(*args, **kw)
            emitted[name].update(t.get("type", "scatter") for t in fig["data"])  # plotly's default type: scatter
            return fig

        return inner

    for name in emitted:
        monkeypatch.setattr(figures, name, recording(name, getattr(figures, name)))
    traces = sorted(glob.glob(os.path.join(SAMPLES, "*.db")))
    assert len(traces) >= 2
    for k, trace in enumerate(traces):
        app = create_app(trace, traces[(k + 1) % len(traces)])
        d = dashboard.of(app)
        for src in d.sources.values():
            src.wait_loaded(60)
        n = d.sources["a"].num_steps()
        for path in ("/", "/acceptance", "/violations", "/compare", "/step/0", f"/step/{n // 2}", f"/step/{n - 1}"):
            d.page(path, "")
        d.page("/step/0", "?trace=b")
        timeline.timeline_window(d.sources["a"], 0, n)  # the whole run: wider than a Gantt, drawn per bin
        for src in d.sources.values():
            src.close()
    called = {n for n, types in emitted.items() if types}
    assert called >= set(emitted) - {"empty_figure"}, f"figure functions no sample drew: {set(emitted) - called}"
    assert set().union(*emitted.values()) == set(scripts.PARTIAL_TRACES)


def test_the_partial_bundle_is_served_when_the_versions_match() -> None:
    version = scripts.bundle_version(_committed())
    b = scripts.choose_bundle(version)
    with open(_committed(), "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:12]
    stem = scripts.partial_name(version).removesuffix(".min.js")  # type: ignore[arg-type]
    assert b.partial and b.path == _committed() and b.url == f"/_specscope/{stem}-{digest}.min.js"


@pytest.mark.parametrize("case", ["other version installed", "bundle says another version", "no bundle"])
def test_another_plotly_js_version_falls_back_to_the_full_bundle(case: str, tmp_path: Any,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    committed = _committed()
    version = scripts.bundle_version(committed)
    assert version is not None
    static = scripts.STATIC
    if case == "other version installed":
        version = "99.0.0"
    elif case == "bundle says another version":
        with open(committed, "rb") as f:
            data = f.read()
        (tmp_path / os.path.basename(committed)).write_bytes(data.replace(b"plotly.js v" + version.encode(),
                                                                          b"plotly.js v0.0.1", 1))
        static = str(tmp_path)
    else:
        static = str(tmp_path / "missing")
    b = scripts.choose_bundle(version, static)
    assert not b.partial and b.path.endswith(os.path.join("package_data", "plotly.min.js"))
    assert b.url == f"/_specscope/plotly-{version}.min.js"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("specscope web: ") and "serving the full plotly.js bundle" in err[0]
    assert version in err[0]


def test_the_fallback_serves_the_installed_full_bundle(capsys: pytest.CaptureFixture[str]) -> None:
    app = create_app(os.path.join(SAMPLES, "cpu-default.db"), plotly=scripts.choose_bundle("99.0.0"))
    client = app.server.test_client()
    index = client.get("/").get_data(as_text=True)
    assert "/_specscope/plotly-99.0.0.min.js" in index and scripts.partial_name("99.0.0") not in index
    body = client.get("/_specscope/plotly-99.0.0.min.js").get_data()
    with open(scripts.full_bundle().path, "rb") as f:
        full = f.read()
    assert body.removeprefix(scripts.HINT) == full
    assert "serving the full plotly.js bundle" in capsys.readouterr().err
    dashboard.of(app).sources["a"].close()


def test_the_build_script_cuts_the_register_list_of_the_installed_bundle() -> None:
    build = _build_script()
    with open(build.installed_bundle(), encoding="utf-8") as f:
        src = f.read()
    out, version, dropped = build.partial_source(src, scripts.PARTIAL_TRACES)
    assert version == scripts.plotly_version()
    assert not {"bar", "heatmap"} & set(dropped) and {"box", "pie", "scatter3d", "calendars"} <= set(dropped)
    reg = re.findall(r"\.register\(\[([^\]]*)\]\)", out)
    assert len(reg) == 1 and reg[0].count("()") == len(scripts.PARTIAL_TRACES) - len(build.CORE_TRACES)
    assert out.count("/*@__PURE__*/") > 1000
    # A bundle whose register list is not of the known shape is refused, loudly.
    with pytest.raises(build.BuildError, match="register"):
        build.partial_source(src.replace(".register([", ".register( [", 1), scripts.PARTIAL_TRACES)
    with pytest.raises(build.BuildError, match="not in the bundle"):
        build.partial_source(src, ("bar", "nosuchtrace"))
    committed = _committed()
    if scripts.bundle_version(committed) == version:
        # The committed bundle was built from this very file.
        with open(committed, "rb") as f:
            head = f.read(2000)
        assert f"sha256 {hashlib.sha256(src.encode()).hexdigest()[:16]}".encode() in head
