"""Callback tests: the real Dash app behind Flask's test client, callbacks called the way the browser calls them."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time

import pytest

pytest.importorskip("dash")

from specscope.tracer.store import TraceReader  # noqa: E402
from specscope.ui.web.app import create_app  # noqa: E402
from webfixtures import FAULT, PLAN  # noqa: E402


@pytest.fixture(scope="module")
def client() -> object:
    app = create_app(FAULT)
    return app.server.test_client()


# The live poll's outputs: the version, the header's step count, whether polling stops, the recording banner.
POLL_OUTPUTS = [("version", "data"), ("live-status", "children"), ("live", "disabled"), ("recording-notes", "children")]


def call(client: object, outputs: list[tuple[str, str]], inputs: list[tuple[str, str, object]],
         state: list[tuple[str, str, object]] = (), changed: str | None = None) -> tuple[int, object]:  # type: ignore[assignment]
    """POST one callback like dash-renderer does; returns (status, the outputs' values or the body text)."""
    if len(outputs) == 1:
        out_id = f"{outputs[0][0]}.{outputs[0][1]}"
        outs: object = {"id": outputs[0][0], "property": outputs[0][1]}
    else:
        out_id = ".." + "...".join(f"{i}.{p}" for i, p in outputs) + ".."
        outs = [{"id": i, "property": p} for i, p in outputs]
    body = {
        "output": out_id, "outputs": outs,
        "inputs": [{"id": i, "property": p, "value": v} for i, p, v in inputs],
        "state": [{"id": i, "property": p, "value": v} for i, p, v in state],
        "changedPropIds": [changed or f"{inputs[0][0]}.{inputs[0][1]}"],
    }  # fmt: skip
    r = client.post("/_dash-update-component", json=body)  # type: ignore[attr-defined]
    if r.status_code != 200:
        return r.status_code, r.get_data(as_text=True)
    resp = r.get_json()["response"]
    return 200, [resp.get(i, {}).get(p, NO_UPDATE) for i, p in outputs]


NO_UPDATE = "<no update>"


def page(client: object, pathname: object, search: object = "") -> object:
    status, out = call(client, [("page", "children")], [("url", "pathname", pathname), ("url", "search", search),
                                                        ("version", "data", 0)])
    assert status == 200, out
    return out[0]  # type: ignore[index]


def texts(component: object) -> str:
    """All text inside a serialized Dash component tree."""
    return json.dumps(component, ensure_ascii=False)


def test_every_page_renders() -> None:
    c = create_app(FAULT).server.test_client()
    for path, marker in (("/", "timeline-page"), ("/step/3", "step-page"), ("/acceptance", "acceptance-page"),
                         ("/violations", "violations-page"), ("/compare", "cmp-none")):
        assert marker in texts(page(c, path)), path


def test_step_page_content_comes_from_the_trace(client: object) -> None:
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
def test_malformed_addresses_get_one_line(client: object, path: object, search: str, message: str) -> None:
    t = texts(page(client, path, search))
    assert "Cannot show this page" in t and message in t and "Traceback" not in t


def test_heatmap_click_shows_the_cell(client: object) -> None:
    with TraceReader(FAULT) as r:
        s = r.step(20)
    pt = s.array("page_table").values
    status, out = call(client, [("step-cell", "children")], [("step-heatmap", "clickData",
                       {"points": [{"x": 1, "y": 0}]})], [("step-index", "data", {"trace": "a", "step": 20})])
    assert status == 200
    assert "physical page" in texts(out) and f'"{int(pt[0, 1])}"' in texts(out)


@pytest.mark.parametrize("click,where", [
    ({"points": [{"x": "1; rm -rf /", "y": 0}]}, {"trace": "a", "step": 20}),
    ({"points": []}, {"trace": "a", "step": 20}), ("junk", {"trace": "a", "step": 20}),
    ({"points": [{"x": 1, "y": 0}]}, {"trace": "/etc/passwd", "step": 1}),
    ({"points": [{"x": 1, "y": 0}]}, {"trace": "a", "step": 10**8}), ({"points": [{"x": 1, "y": 0}]}, None),
])  # fmt: skip
def test_malformed_callback_inputs_are_refused_with_a_message(client: object, click: object, where: object) -> None:
    status, out = call(client, [("step-cell", "children")], [("step-heatmap", "clickData", click)],
                       [("step-index", "data", where)])
    assert status == 200, out
    t = texts(out)
    assert "cell-detail" in t and "Traceback" not in t and "physical page" not in t


WINDOW_OUT = [("tl-gantt", "figure"), ("tl-overlap", "figure"), ("tl-overview", "figure"), ("tl-stats", "children"),
              ("tl-gaps", "children"), ("tl-range", "value"), ("tl-from", "value"), ("tl-to", "value")]
WINDOW_IN = [("tl-range", "value"), ("tl-from", "n_submit"), ("tl-to", "n_submit"), ("tl-overview", "clickData")]


def window_call(client: object, range_value: object = None, click: object = None,
                boxes: tuple[object, object] = ("0", "19")) -> tuple[int, object]:
    """The timeline's window callback, as the slider (or a click on the overview) calls it."""
    vals = {"tl-range": range_value, "tl-overview": click}
    return call(client, WINDOW_OUT, [(i, p, vals.get(i)) for i, p in WINDOW_IN],
                [("tl-from", "value", boxes[0]), ("tl-to", "value", boxes[1])],
                changed="tl-overview.clickData" if click is not None else "tl-range.value")


def test_range_slider_moves_the_window(client: object) -> None:
    status, out = window_call(client, [40, 59])
    assert status == 200
    gantt, overlap = out[0], out[1]  # type: ignore[index]
    steps = {cd[0] for tr in gantt["data"] for cd in tr["customdata"]}
    assert steps and min(steps) >= 40 and max(steps) <= 59
    assert all(40 <= x <= 59 for x in overlap["data"][-1]["x"])
    assert "steps 40–59" in texts(out[3])  # type: ignore[index]
    # The overview is patched, not sent again: only its shaded window moves.
    patch = texts(out[2])  # type: ignore[index]
    assert "__dash_patch_update" in patch and '"shapes"' in patch and '"data"' not in patch and len(patch) < 2000
    assert '"x0": 39.5' in patch and '"x1": 59.5' in patch
    status, out = window_call(client, "DROP")
    assert status == 200 and "two step indexes" in texts(out)


def test_unknown_callbacks_and_scripts_are_refused_without_traceback(client: object) -> None:
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
    c = app.server.test_client()
    assert "10 steps (live)" in str(app.layout())
    for s in steps[10:]:
        w.write_step(s)
    w.flush()
    status, out = call(c, POLL_OUTPUTS,
                       [("live", "n_intervals", 1)])
    assert status == 200 and out[0] == 1 and "30 steps (live)" in out[1] and out[2] is False  # type: ignore[index]
    w.close()
    # The page keeps polling while the summaries of the new steps are still loading in the background (a loaded CI
    # machine can take more than one poll for that), and stops once the closed trace is fully loaded.
    deadline = time.monotonic() + 30
    for n in itertools.count(2):
        status, out = call(c, POLL_OUTPUTS,
                           [("live", "n_intervals", n)])
        assert status == 200 and "(live)" not in out[1]  # type: ignore[index]
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


def test_overview_click_recentres_the_window(client: object) -> None:
    status, out = window_call(client, [0, 19], {"points": [{"x": 120.4}]})
    assert status == 200 and out[5:] == [[110, 129], "110", "129"]  # type: ignore[index]
    status, out = window_call(client, [0, 19], {"points": [{"x": "NaN"}]})
    assert status == 204 or out == [NO_UPDATE] * len(WINDOW_OUT)


def test_stepping_forward_serves_pages_built_ahead_that_equal_fresh_ones() -> None:
    c = create_app(FAULT).server.test_client()
    fresh = create_app(FAULT).server.test_client()
    seq = [texts(page(c, f"/step/{i}")) for i in (20, 21, 22, 21)]  # 21 and 22 were built ahead, then back to 21
    assert seq == [texts(page(fresh, f"/step/{i}")) for i in (20, 21, 22, 21)]


def test_a_big_batch_gets_its_request_table_as_text(monkeypatch: pytest.MonkeyPatch) -> None:
    from specscope.ui.web import pages as web_pages

    monkeypatch.setattr(web_pages, "MAX_HTML_ROWS", 1)  # the fault sample's batches are small: make 2 rows "big"
    with TraceReader(FAULT) as r:
        i = next(s.index for s in r.steps() if len(s.requests) >= 2)
        ids = [q.request_id for q in r.step(i, arrays=()).requests]
    c = create_app(FAULT).server.test_client()
    out = page(c, f"/step/{i}")
    t = texts(out)
    table = t[t.index('"request-table"'):t.index('"request-table"') + 100]
    assert '"type": "Pre"' in table, table
    assert all(f"  {rid}  " in t for rid in ids)


def _layout(client: object, referrer: str | None) -> object:
    headers = {} if referrer is None else {"Referer": referrer}
    r = client.get("/_dash-layout", headers=headers)  # type: ignore[attr-defined]
    assert r.status_code == 200
    return r.get_json()


def test_the_first_layout_carries_the_page_of_the_address(client: object) -> None:
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


def test_plotly_js_is_served_once_hinted_and_cached(client: object) -> None:
    from specscope.ui.web import scripts

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
