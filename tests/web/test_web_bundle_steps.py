"""The dashboard on a bug-report bundle: /step/N serves the original trace's step N, prev / next cross the bundle's
gap, the timeline's range is of original numbers, and the violations link to the steps by those numbers."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("dash")

from specscope.tracer.store import TraceReader  # noqa: E402
from specscope.ui.cli import main  # noqa: E402
from specscope.ui.web import ids, violations  # noqa: E402
from specscope.ui.web.app import create_app  # noqa: E402
from test_callbacks import call, page, texts, window_call  # noqa: E402
from webfixtures import FAULT  # noqa: E402

START, STOP = 30, 50


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> str:
    """`specscope export FAULT --bundle t.zip --steps 30:50`, through the real command line."""
    out = tmp_path_factory.mktemp("web-bundle") / "t.zip"
    assert main(["export", FAULT, "--bundle", str(out), "--steps", f"{START}:{STOP}"]) == 0
    return str(out)


@pytest.fixture(scope="module")
def client(bundle: str) -> object:
    return create_app(bundle)


def _links(component: object) -> list[str]:
    return re.findall(r'"href": "(/step/\d+)[^"]*"', texts(component))


def test_step_urls_are_original_step_numbers(bundle: str, client: object) -> None:
    with TraceReader(bundle) as r:
        held = r.step_indexes()
        want = r.summary(40)
    captures = [i for i in held if i < START]
    assert captures and held[len(captures):] == list(range(START, STOP))
    t = texts(page(client, "/step/40"))
    assert "step 40 (" in t and want.mode.value in t and "no step" not in t
    assert f"of {len(held)}" in t  # its position among the bundle's steps
    links = _links(page(client, "/step/40"))
    assert "/step/39" in links and "/step/41" in links
    # Across the gap: the step before the range is the last capture it added.
    links = _links(page(client, f"/step/{START}"))
    assert f"/step/{captures[-1]}" in links and f"/step/{START + 1}" in links
    links = _links(page(client, f"/step/{captures[-1]}"))
    assert f"/step/{START}" in links
    # A step the bundle left out, or past its end: one line naming the steps it has.
    for missing in (20, START - 1, STOP, 5000):
        if missing in held:
            continue
        t = texts(page(client, f"/step/{missing}"))
        assert f"no step {missing}" in t and f"{START}–{STOP - 1}" in t


def test_timeline_and_violations_speak_of_original_numbers(bundle: str, client: object) -> None:
    with TraceReader(bundle) as r:
        held = r.step_indexes()
    t = texts(page(client, "/"))
    assert "t.zip" in t and "trace.db" not in t  # named as the user named it
    assert f'"min": {held[0]}' in t and f'"max": {held[-1]}' in t
    out = window_call(client, [START + 2, START + 9])
    steps = {cd[0] for tr in out[0]["data"] for cd in tr["customdata"]}  # type: ignore[index]
    assert steps and min(steps) >= START + 2 and max(steps) <= START + 9
    assert f"steps {START + 2}–{START + 9}" in texts(out[3])  # type: ignore[index]
    overview = json.loads(texts(page(client, "/")))  # the overview's x: the steps' own numbers
    xs = [x for tr in _figure(overview, "tl-overview")["data"] for x in tr["x"]]
    assert xs and min(xs) == held[0] and max(xs) == held[-1] and set(xs) <= set(held)
    vt = texts(page(client, "/violations"))
    assert "steps checked" in vt
    # The bundle carries its verdicts beside the trace, not in it: the dashboard's checker finds them, a poll at a
    # time, and each row links to its step by the original number.
    done, table = "", None
    for n in range(1, 200):
        out = violations_call(client, n)
        table, done = out[0], texts(out[3])  # type: ignore[index]
        if f"all {len(held)} of {len(held)} steps checked" in done:
            break
    assert f"all {len(held)} of {len(held)} steps checked" in done
    linked = {int(s.rsplit("/", 1)[1]) for s in _links(table)}
    assert linked and linked <= set(held) and max(linked) >= len(held)


def violations_call(app: object, poll: int) -> list[object]:
    """The violations page's callback as its poll calls it (no filter, the first page): table, count line, page,
    progress line, whether polling stops, the invariants."""
    return call(app, violations.update, [], "all", "all", None, None, None, None, None, None, poll, 0,  # type: ignore[arg-type]
                trigger=ids.VL_POLL)


def _figure(tree: object, gid: str) -> dict:
    """The figure of the dcc.Graph with id `gid` in a serialized component tree."""
    stack = [tree]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            props = x.get("props") if isinstance(x.get("props"), dict) else None
            if props is not None and props.get("id") == gid and "figure" in props:
                return props["figure"]
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    raise AssertionError(f"no graph {gid}")
