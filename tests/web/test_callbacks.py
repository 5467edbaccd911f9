"""Callback tests: the real Dash app's callbacks called as Python functions inside its app context, and its HTTP
endpoints through Flask's test client."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

dash = pytest.importorskip("dash")

from dash import Dash  # noqa: E402
from plotly.utils import PlotlyJSONEncoder  # noqa: E402
from specscope.tracer.store import TraceReader  # noqa: E402
from specscope.ui.web import dashboard, explorer, ids, timeline  # noqa: E402
from specscope.ui.web.app import create_app, poll, render  # noqa: E402
from webfixtures import FAULT, PLAN  # noqa: E402


@pytest.fixture(scope="module")
def client() -> Dash:
    """The app of the fault sample (its callbacks are called directly, inside its app context)."""
    return create_app(FAULT)


NO_UPDATE = "<no update>"


def plain(x: object) -> object:
    """A callback output as the browser receives it: JSON (components, figures and patches serialized the way Dash
    does, through plotly's encoder); `NO_UPDATE` for dash.no_update."""
    if x is dash.no_update:
        return NO_UPDATE
    return json.loads(json.dumps(x, cls=PlotlyJSONEncoder))


def call(app: Dash, fn: Callable[..., object], *args: object, trigger: str | None = None) -> list[object]:
    """Callback `fn` of `app` called as a Python function (`trigger`: the id dash.ctx.triggered_id would name);
    its outputs as a list, each as `plain` makes it."""
    with app.server.app_context():
        out = fn(*args, trigger=trigger) if trigger is not None else fn(*args)
    return [plain(x) for x in (out if isinstance(out, tuple) else (out,))]


def page(app: Dash, pathname: object, search: object = "") -> object:
    """The page `render` draws for an address (as when the browser moves there)."""
    return call(app, render, pathname, search, 0, trigger=ids.URL)[0]


def texts(component: object) -> str:
    """All text inside a serialized Dash component tree."""
    return json.dumps(component, ensure_ascii=False)


def test_every_page_renders() -> None:
    c = create_app(FAULT)
    for path, marker in (("/", "timeline-page"), ("/step/3", "step-page"), ("/acceptance", "acceptance-page"),
                         ("/violations", "violations-page"), ("/compare", "cmp-none")):
        assert marker in texts(page(c, path)), path


def test_step_page_content_comes_from_the_trace(client: Dash) -> None:
    with TraceReader(FAULT) as r:
        s = r.step(20)
        n = r.num_steps()
    t = texts(page(client, "/step/20"))
    assert f"step 20 of {n}" in t and s.mode.value in t
    for req in s.requests:
        assert f"r{req.request_id}" in t


@pytest.mark.parametrize("path,search,message", [
    ("/step/99999", "", "no step 99999"), ("/step/abc", "", "no page"), ("/nothing", "", "no page"),
    ("/step/1", "?trace=b", "no trace"), ("/step/1", "?trace=../../etc/passwd", "no trace"),
    ("/step/1", "?row=-3", "non-negative integer"), (12, "", "malformed address"), ({"a": 1}, "", "malformed"),
])  # fmt: skip
def test_malformed_addresses_get_one_line(client: Dash, path: object, search: str, message: str) -> None:
    t = texts(page(client, path, search))
    assert "Cannot show this page" in t and message in t and "Traceback" not in t


def test_heatmap_click_shows_the_cell(client: Dash) -> None:
    with TraceReader(FAULT) as r:
        s = r.step(20)
    pt = s.array("page_table").values
    out = call(client, explorer.cell, {"points": [{"x": 1, "y": 0}]}, {"trace": "a", "step": 20})
    assert "physical page" in texts(out) and f'"{int(pt[0, 1])}"' in texts(out)


@pytest.mark.parametrize("click,where", [
    ({"points": [{"x": "1; rm -rf /", "y": 0}]}, {"trace": "a", "step": 20}),
    ({"points": []}, {"trace": "a", "step": 20}), ("junk", {"trace": "a", "step": 20}),
    ({"points": [{"x": 1, "y": 0}]}, {"trace": "/etc/passwd", "step": 1}),
    ({"points": [{"x": 1, "y": 0}]}, {"trace": "a", "step": 10**8}), ({"points": [{"x": 1, "y": 0}]}, None),
])  # fmt: skip
def test_malformed_callback_inputs_are_refused_with_a_message(client: Dash, click: object, where: object) -> None:
    out = call(client, explorer.cell, click, where)
    t = texts(out)
    assert "cell-detail" in t and "Traceback" not in t and "physical page" not in t


def window_call(app: Dash, range_value: object = None, click: object = None,
                boxes: tuple[object, object] = ("0", "19")) -> list[object]:
    """The timeline's window callback, as the slider (or a click on the overview) calls it; its 8 outputs."""
    trigger = ids.TL_OVERVIEW if click is not None else ids.TL_RANGE
    return call(app, timeline.window, range_value, 0, 0, click, boxes[0], boxes[1], trigger=trigger)


def test_range_slider_moves_the_window(client: Dash) -> None:
    out = window_call(client, [40, 59])
    gantt, overlap = out[0], out[1]  # type: ignore[index]
    steps = {cd[0] for tr in gantt["data"] for cd in tr["customdata"]}
    assert steps and min(steps) >= 40 and max(steps) <= 59
    assert all(40 <= x <= 59 for x in overlap["data"][-1]["x"])
    assert "steps 40–59" in texts(out[3])  # type: ignore[index]
    # The overview is patched, not sent again: only its shaded window moves.
    patch = texts(out[2])  # type: ignore[index]
    assert "__dash_patch_update" in patch and '"shapes"' in patch and '"data"' not in patch and len(patch) < 2000
    assert '"x0": 39.5' in patch and '"x1": 59.5' in patch
    out = window_call(client, "DROP")
    assert "two step indexes" in texts(out)


def test_unknown_callbacks_and_scripts_are_refused_without_traceback(client: Dash) -> None:
    client = client.server.test_client()  # type: ignore[attr-defined]
    r = client.post("/_dash-update-component", data="{not json", content_type="application/json")  # type: ignore[attr-defined]
    assert r.status_code in (400, 500) and "Traceback" not in r.get_data(as_text=True)
    for path in ("/_dash-component-suites/dash/../../../../etc/passwd", "/assets/../../pyproject.toml",
                 "/_dash-component-suites/nope/x.js", "/assets/app.py"):
        r = client.get(path)  # type: ignore[attr-defined]
        assert r.status_code == 404, path
        assert "[project]" not in r.get_data(as_text=True)


def test_live_poll_follows_a_growing_trace(tmp_path: object) -> None:
    from specscope.tracer.store import TraceWriter

    path = str(tmp_path / "live.db")  # type: ignore[operator]
    with TraceReader(PLAN) as src:
        w = TraceWriter(path, src.run)
        steps = list(src.steps(0, 30))
    for s in steps[:10]:
        w.write_step(s)
    w.flush()
    app = create_app(path)
    assert "10 steps (live)" in str(app.layout())  # type: ignore[operator]
    assert dashboard.of(app).needs_poll()
    for s in steps[10:]:
        w.write_step(s)
    w.flush()
    out = call(app, poll, 1)  # the version, the header's line, whether polling stops, the recording banner
    assert out[0] == 1 and "30 steps (live)" in out[1] and out[2] is False  # type: ignore[index]
    w.close()
    # The page keeps polling while the summaries of the new steps are still loading in the background (a loaded CI
    # machine can take more than one poll for that), and stops once the closed trace is fully loaded.
    deadline = time.monotonic() + 30
    for n in itertools.count(2):
        out = call(app, poll, n)
        assert "(live)" not in out[1]  # type: ignore[index]
        if out[2] is True or time.monotonic() > deadline:  # type: ignore[index]
            break
        assert "loaded)" in out[1]  # type: ignore[index] - still polling only because summaries are loading
        time.sleep(0.05)
    assert out[2] is True  # type: ignore[index]


def test_cli_refuses_bad_input_with_one_line(tmp_path: object) -> None:
    text = tmp_path / "notes.txt"  # type: ignore[operator]
    text.write_text("not a trace\n")
    for argv, msg in ((["web", "/nonexistent.db"], "no such file"), (["web", FAULT, "--port", "70000"], "TCP port"),
                      (["web", FAULT, "--compare", str(text)], "not a specscope trace")):
        p = subprocess.run([sys.executable, "-m", "specscope.ui.cli", *argv], capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 2, (argv, p.stderr)
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("specscope: error:") and msg in lines[0], p.stderr


def test_overview_click_recentres_the_window(client: Dash) -> None:
    out = window_call(client, [0, 19], {"points": [{"x": 120.4}]})
    assert out[5:] == [[110, 129], "110", "129"]
    for junk in ({"points": [{"x": "NaN"}]}, {"points": [{"x": float("nan")}]}, {"points": []}, "junk"):
        with pytest.raises(dash.exceptions.PreventUpdate):  # a click on no step changes nothing
            window_call(client, [0, 19], junk)


def test_stepping_forward_serves_pages_built_ahead_that_equal_fresh_ones() -> None:
    c = create_app(FAULT)
    fresh = create_app(FAULT)
    seq = [texts(page(c, f"/step/{i}")) for i in (20, 21, 22, 21)]  # 21 and 22 were built ahead, then back to 21
    assert seq == [texts(page(fresh, f"/step/{i}")) for i in (20, 21, 22, 21)]


def test_a_big_batch_gets_its_request_table_as_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(explorer, "MAX_HTML_ROWS", 1)  # the fault sample's batches are small: make 2 rows "big"
    with TraceReader(FAULT) as r:
        i = next(s.index for s in r.steps() if len(s.requests) >= 2)
        rids = [q.request_id for q in r.step(i, arrays=()).requests]
    out = page(create_app(FAULT), f"/step/{i}")
    t = texts(out)
    table = t[t.index('"request-table"'):t.index('"request-table"') + 100]
    assert '"type": "Pre"' in table, table
    assert all(f"  {rid}  " in t for rid in rids)


def _layout(app: Dash, referrer: str | None) -> object:
    """The app's layout (`app.layout`, a function) as built for a request from the page `referrer` names."""
    headers = {} if referrer is None else {"Referer": referrer}
    with app.server.test_request_context("/", headers=headers):
        return plain(app.layout())  # type: ignore[operator]


def test_the_first_layout_carries_the_page_of_the_address(client: Dash) -> None:
    # dash-renderer asks for the layout from the page itself: no callback round trip before its first figure.
    base = "http://localhost"
    lay = _layout(client, base + "/")
    assert "timeline-page" in texts(lay) and '"tl-gantt"' in texts(lay)
    assert '"pathname": "/"' in texts(lay)  # dcc.Location is where it is: `render` is not called on load
    t = texts(_layout(client, base + "/step/20?row=1"))
    assert "step-page" in t and '"search": "?row=1"' in t
    # A bad address gets the one-line panel; no Referer, or another site's, gets an empty page (`render` fills it).
    assert "no step 99999" in texts(_layout(client, base + "/step/99999"))
    for ref in (None, "http://elsewhere.example/step/20", "javascript:alert(1)"):
        t = texts(_layout(client, ref))
        assert "timeline-page" not in t and "step-page" not in t and "Cannot show" not in t, ref
        assert '"pathname"' not in t  # dcc.Location sets the address as it mounts, and `render` draws the page


def test_plotly_js_is_served_once_hinted_and_cached(client: Dash) -> None:
    from specscope.ui.web import scripts

    client = client.server.test_client()  # type: ignore[assignment]
    r = client.get(scripts.plotly_url())  # type: ignore[attr-defined]
    assert r.status_code == 200 and r.mimetype == "application/javascript"
    body = r.get_data()
    with open(scripts.choose_bundle().path, "rb") as f:
        assert body == scripts.HINT + f.read()
    assert "immutable" in r.headers["Cache-Control"]
    index = client.get("/").get_data(as_text=True)  # type: ignore[attr-defined]
    assert f'rel="preload" as="script" href="{scripts.plotly_url()}"' in index
    assert scripts.plotly_url() in index.split('id="_dash-renderer"')[1]  # the layout_pre hook loads it
    assert "/_dash-component-suites/plotly/package_data/plotly.min.js" not in index
    # A browser that takes gzip (one beyond an SSH tunnel) gets the copy made in the background once it is there.
    import gzip
    import time

    deadline = time.monotonic() + 30
    while True:
        r = client.get(scripts.plotly_url(), headers={"Accept-Encoding": "gzip, deflate"})  # type: ignore[attr-defined]
        if r.headers.get("Content-Encoding") == "gzip" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert r.headers.get("Content-Encoding") == "gzip" and gzip.decompress(r.get_data()) == body
    assert len(r.get_data()) < len(body) // 2
