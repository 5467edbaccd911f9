"""The step page's marks and the violations page, through the page functions: every violation of the stale
page-table sample is reachable with one filter and opens its step with its cell marked; the #27495 sample's
verify step marks max_seq_len_q in place; n / N walk the violations."""

from __future__ import annotations

import json
import os
from urllib.parse import urlsplit

import pytest

pytest.importorskip("dash")

from specscope.tracer.query import ViolationFilter  # noqa: E402
from specscope.tracer.store import TraceReader  # noqa: E402
from specscope.ui import views  # noqa: E402
from specscope.ui.web import dashboard, violations  # noqa: E402
from specscope.ui.web.app import create_app  # noqa: E402
from specscope.ui.web.routes import InputError  # noqa: E402
from webfixtures import FAULT, SAMPLES  # noqa: E402

OVERRIDE = os.path.join(SAMPLES, "cpu-fault-max-seq-len-q-override.db")


def texts(component: object) -> str:
    return json.dumps(component.to_plotly_json() if hasattr(component, "to_plotly_json") else component,
                      default=lambda o: o.to_plotly_json() if hasattr(o, "to_plotly_json") else str(o),
                      ensure_ascii=False)


def find(component: object, want_id: str) -> object | None:
    """The component with this id inside a layout tree."""
    if getattr(component, "id", None) == want_id:
        return component
    kids = getattr(component, "children", None)
    for k in kids if isinstance(kids, (list, tuple)) else [kids] if kids is not None else []:
        got = find(k, want_id)
        if got is not None:
            return got
    return None


def links(component: object) -> list[str]:
    out = []
    if getattr(component, "href", None) is not None and type(component).__name__ == "Link":
        out.append(component.href)  # type: ignore[attr-defined]
    kids = getattr(component, "children", None)
    for k in kids if isinstance(kids, (list, tuple)) else [kids] if kids is not None else []:
        out += links(k)
    return out


@pytest.fixture(scope="module")
def fault_app() -> object:
    return create_app(FAULT)


def detail_rows(page: object) -> dict[str, str]:
    table = find(page, "step-detail")
    assert table is not None
    rows = {}
    for tr in table.children.children:  # type: ignore[attr-defined]
        th, td = tr.children
        rows[th.children] = texts(td)
    return rows


def test_the_first_violating_verify_step_marks_max_seq_len_q_in_place() -> None:
    d = dashboard.of(create_app(OVERRIDE))
    with TraceReader(OVERRIDE) as r:
        first = next(v.step for v in r.violations() if r.summary(v.step).mode.value == "TARGET_VERIFY")
    page = d.page(f"/step/{first}", "")
    rows = detail_rows(page)
    assert "I6: 4, expected 2" in rows["max_seq_len_q"] and "✗" in rows["max_seq_len_q"]
    assert "I6: 4, expected 2" in rows["kernel q_len"]
    assert "✗" not in rows["tokens"] and "≠" not in rows["tokens"]  # T ≠ K alone is no mark
    marks = texts(find(page, "step-marks"))
    assert '"max_seq_len_q"' in marks and '"4"' in marks and '"2"' in marks
    # the violations come first, in full
    body = texts(page)
    assert body.index('"step-violations"') < body.index('"step-detail"') < body.index('"step-heatmap"')


def test_every_violation_is_reachable_with_one_filter_and_opens_marked(fault_app: object) -> None:
    d = dashboard.of(fault_app)  # type: ignore[arg-type]
    src = d.sources["a"]
    src.wait_loaded(60)
    with TraceReader(FAULT) as r:
        every = r.violations()
    assert len(every) > 1000
    seen = set()
    for v in every:
        # One filter: the step the violation is at, in "from step"; its row is then on the first page.
        f = violations.parse_filter([], "all", "all", None, str(v.step), None, None)
        rows, total = src.violation_rows(f, 0, violations.PAGE_ROWS)
        assert v in rows, v
        href = links(violations.table_rows(src, [v])[0][0])[0]
        seen.add(href)
        u = urlsplit(href)
        page = texts(d.page(u.path, "?" + u.query))
        assert "violation-banner" in page and v.check_id in page
        if v.array is not None:
            assert views.cell_name(v.array, v.row, v.col) in page
            assert f"{v.check_id}: {v.found}, expected {v.expected}" in page
    assert len(seen) == len(every)  # one link per violation


def test_filters_combine_and_refuse_what_the_page_does_not_send(fault_app: object) -> None:
    src = dashboard.of(fault_app).sources["a"]  # type: ignore[arg-type]
    f = violations.parse_filter(["I19"], "error", "DRAFT_DECODE", "1", "20", "60", "replay prep")
    assert f == ViolationFilter(("I19",), "error", "DRAFT_DECODE", 1, 20, 61, "replay prep")
    rows, total = src.violation_rows(f, 0, 500)
    assert rows and total == len(rows)
    assert all(v.check_id == "I19" and v.request_id == 1 and 20 <= v.step <= 60 for v in rows)
    table, count, page = violations.body(src, ViolationFilter(), 10**6)  # past the end: the last page
    n = src.reader.count_violations()
    last = (n - 1) // violations.PAGE_ROWS
    assert page == last and count.endswith(f"of {n:,} violations · page {last + 1} of {last + 1}")
    for bad in ((["I1; drop"], "all", "all", None, None, None, None), ([], "fatal", "all", None, None, None, None),
                ([], "all", "all", "-1", None, None, None), ([], "all", "all", None, "1e9", None, None),
                ([], "all", "nope", None, None, None, None), ([], "all", "all", None, None, None, "x" * 500)):
        with pytest.raises(InputError):
            violations.parse_filter(*bad)


def test_n_and_shift_n_walk_violations_within_a_step_then_across(fault_app: object) -> None:
    d = dashboard.of(fault_app)  # type: ignore[arg-type]
    with TraceReader(FAULT) as r:
        every = r.violations()
    steps = sorted({v.step for v in every})
    a, b = steps[0], steps[1]
    here = [v for v in every if v.step == a]

    def walk(path: str, search: str, link_id: str) -> str:
        href = find(d.page(path, search), link_id).href  # type: ignore[union-attr]
        return href

    assert walk(f"/step/{a}", "", "viol-next").startswith(f"/step/{a}?v=0")
    href = f"/step/{a}?v=0"
    for k in range(1, len(here)):
        href = walk(f"/step/{a}", f"?v={k - 1}", "viol-next")
        assert href.startswith(f"/step/{a}?v={k}&check={here[k].check_id}")
    nxt = walk(f"/step/{a}", f"?v={len(here) - 1}", "viol-next")
    assert nxt.startswith(f"/step/{b}?v=0&")
    back = walk(f"/step/{b}", "?v=0", "viol-prev")
    assert back.startswith(f"/step/{a}?v={len(here) - 1}&")
    assert "disabled" in find(d.page(f"/step/{a}", "?v=0"), "viol-prev").className  # type: ignore[union-attr]
