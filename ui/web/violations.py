"""The violations page: every violation of the trace, filtered and paged on the server (SQL over the trace's
violations table, `TraceReader.violations_page`), each row opening its step with the cell marked; and its callbacks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import dash
from dash import Dash, Input, Output, State, dcc, html
from dash.development.base_component import Component
from specscope.tracer.checks import BY_ID
from specscope.tracer.query import ViolationFilter
from specscope.tracer.schema import Violation
from specscope.ui import views

from . import ids
from .dashboard import Dashboard, current, safe, trigger_id
from .explorer_parts import short_message, violation_href
from .pages import BOX, error_panel, table
from .routes import InputError, Route
from .source import MODES, TraceSource

PAGE_ROWS = 50  # violations per page of the table
ALL = "all"
CHECK_BUDGET_S = 0.25  # checker time per poll of a trace that stores no verdicts (the page stays responsive)
_HEAD = ["step", "check", "severity", "mode", "request", "cell", "found", "expected", "message"]


def parse_filter(checks: object, severity: object, mode: object, request: object, lo: object, hi: object,
                 text: object) -> ViolationFilter:
    """The filter of the page's controls (InputError for a value the page does not send)."""
    if checks is None:
        checks = []
    if not isinstance(checks, list) or not all(isinstance(c, str) and c in BY_ID or isinstance(c, str) and
                                               c.isalnum() and len(c) <= 8 for c in checks):
        raise InputError("the invariants must be a list of check ids")
    if severity not in (None, ALL, "error", "warning"):
        raise InputError("severity must be error or warning")
    if mode not in (None, ALL, *MODES):
        raise InputError("unknown forward mode")

    def num(x: object, name: str) -> int | None:
        if isinstance(x, str):
            x = x.strip()
            if not x:
                return None
            if not x.isdigit() or len(x) > 12:
                raise InputError(f"{name} must be a non-negative integer, not {x[:20]!r}")
            return int(x)
        if x is None:
            return None
        if isinstance(x, bool) or not isinstance(x, (int, float)) or x != int(x) or not 0 <= x <= 10**12:
            raise InputError(f"{name} must be a non-negative integer")
        return int(x)

    if text is not None and (not isinstance(text, str) or len(text) > 200):
        raise InputError("the text filter must be a short text")
    start, stop = num(lo, "the first step"), num(hi, "the last step")
    return ViolationFilter(check_ids=tuple(checks), severity=None if severity in (None, ALL) else str(severity),
                           mode=None if mode in (None, ALL) else str(mode), request_id=num(request, "request"),
                           start=start, stop=None if stop is None else stop + 1, text=(text or "").strip() or None)


def table_rows(src: TraceSource, rows: Sequence[Violation]) -> list[list[Any]]:
    """The table's rows: each links to its step with its cell marked (`v=` is its place among the step's)."""
    at: dict[int, list[Violation]] = {}
    out = []
    cols = src.cols
    for v in rows:
        if v.step not in at:
            at[v.step] = src.step_violations(v.step)
        same = at[v.step]
        k = next((j for j, w in enumerate(same) if w == v), 0)
        r = cols.rows(v.step, v.step + 1)
        mode = MODES[int(cols.mode[r.start])] if r.stop > r.start else "-"
        cell = "-" if v.array is None else views.cell_name(v.array, v.row, v.col)
        out.append([dcc.Link(f"step {v.step}", href=violation_href(src, v, k), className="viol-link"), v.check_id,
                    v.severity.value, mode, "-" if v.request_id is None else v.request_id, cell, v.found or "-",
                    v.expected or "-", short_message(v)])
    return out


def progress_text(src: TraceSource, check_s: float = 0.0) -> tuple[str, bool]:
    """What the page says about where its violations come from, and whether they are complete (`check_s`: how
    long the dashboard's checker may run on first, for a trace that stores no verdicts)."""
    st = src.violation_state(budget_s=check_s)
    done = st.checked_steps >= st.num_steps
    where = ("stored in the trace" if st.source == "trace"
             else "found by the checker in this dashboard (the trace stores none)")
    return (f"{sum(src.violation_counts().values())} violations, {where}; " + ("all " if done else "")
            + f"{st.checked_steps} of {st.num_steps} steps checked"), done


def body(src: TraceSource, f: ViolationFilter, page: int) -> tuple[Component, str, int]:
    """The table of page `page` (0-based, clamped) of the violations matching `f`, its count line, and the page."""
    rows, total = src.violation_rows(f, max(0, page) * PAGE_ROWS, PAGE_ROWS)
    last = max(0, (total - 1) // PAGE_ROWS)
    if page > last:
        page = last
        rows, total = src.violation_rows(f, page * PAGE_ROWS, PAGE_ROWS)
    if not total:
        return html.P("no violations match" if f != ViolationFilter() else "no violations", id=ids.VL_NONE), \
            "0 violations", 0
    a = page * PAGE_ROWS
    count = f"{a + 1:,}–{a + len(rows):,} of {total:,} violations · page {page + 1} of {last + 1}"
    return table(_HEAD, table_rows(src, rows), cls="viol-table"), count, page


def invariants(src: TraceSource) -> Component:
    """One line per invariant that fired: id, severity, what it checks, how often."""
    counts = src.violation_counts()
    rows = []
    for cid in sorted(counts, key=views.check_key):
        inv = BY_ID.get(cid)
        rows.append((cid, inv.severity.value if inv else "-", inv.description if inv else "", counts[cid]))
    return table(["check", "severity", "checks that", "violations"], rows, id=ids.VL_INVARIANTS)


def page(src: TraceSource) -> html.Div:
    """The violations page: filters, the first page of the table, the invariants that fired."""
    text, done = progress_text(src)
    counts = src.violation_counts()
    f = ViolationFilter()
    tbl, count, _ = body(src, f, 0)
    modes = [m for m in MODES if (src.cols.mode == MODES.index(m)).any()] or list(MODES)
    return html.Div([
        html.H2("Violations"),
        html.P(text, id=ids.VL_PROGRESS),
        dcc.Interval(id=ids.VL_POLL, interval=400, disabled=done),
        html.Div([
            html.Span("invariant", className="muted"),
            dcc.Checklist(id=ids.VL_CHECKS, options=[{"label": f" {c} ({counts[c]:,})", "value": c}
                                                     for c in sorted(counts, key=views.check_key)],
                          value=[], inline=True, labelStyle={"marginRight": "10px"}),
        ], className="filters"),
        html.Div([
            html.Span("severity", className="muted"),
            dcc.RadioItems(id=ids.VL_SEVERITY, options=[ALL, "error", "warning"], value=ALL, inline=True),
            html.Span("mode", className="muted"),
            dcc.RadioItems(id=ids.VL_MODE, options=[ALL, *modes], value=ALL, inline=True),
        ], className="filters"),
        html.Div([
            # debounce: a box commits on Enter (or on leaving it), not on every keystroke
            dcc.Input(id=ids.VL_REQUEST, type="text", inputMode="numeric", style=BOX, placeholder="request",
                      debounce=True),
            dcc.Input(id=ids.VL_FROM, type="text", inputMode="numeric", style=BOX, placeholder="from step",
                      debounce=True),
            dcc.Input(id=ids.VL_TO, type="text", inputMode="numeric", style=BOX, placeholder="to step",
                      debounce=True),
            dcc.Input(id=ids.VL_TEXT, type="text", placeholder="message contains", debounce=True,
                      style={"width": "220px"}),
            html.Span("(Enter applies a box)", className="muted"),
        ], className="filters"),
        html.Div([html.Button("◀ previous", id=ids.VL_PREV, className="btn"), html.Span(count, id=ids.VL_COUNT),
                  html.Button("next ▶", id=ids.VL_NEXT, className="btn"), dcc.Store(id=ids.VL_PAGE, data=0)],
                 className="pager"),
        html.Div(tbl, id=ids.VL_TABLE),
        html.H3("Invariants that fired"), html.Div(invariants(src), id=ids.VL_BODY),
    ], id=ids.VL_PAGE_ROOT)


def layout(d: Dashboard, route: Route) -> Component:
    """The page at `/violations` (routes.PAGE_MODULES)."""
    return page(d.source(route.trace))


UpdateOut = tuple[Any, Any, Any, Any, Any, Any]


@safe(lambda m: (error_panel(m), "", 0, dash.no_update, True, dash.no_update))
def update(checks: object, severity: object, mode: object, request: object, lo: object, hi: object, text: object,
           prev_clicks: object, next_clicks: object, polls: object, at: object, *,
           trigger: str | None = None) -> UpdateOut:
    """The table, its count line and page, the progress line, whether to poll on, and (on a poll) the invariants,
    for any filter or pager change or a poll of the checker (`trigger`: which, for a direct call)."""
    src = current().source("a")
    f = parse_filter(checks, severity, mode, request, lo, hi, text)
    trig = trigger_id(trigger)
    progress, done = progress_text(src, CHECK_BUDGET_S if trig == ids.VL_POLL else 0.0)
    n = at if isinstance(at, int) and not isinstance(at, bool) and 0 <= at < 10**9 else 0
    want = n - 1 if trig == ids.VL_PREV else n + 1 if trig == ids.VL_NEXT else n if trig == ids.VL_POLL else 0
    tbl, count, got = body(src, f, max(0, want))
    return tbl, count, got, progress, done, invariants(src) if trig == ids.VL_POLL else dash.no_update


def register(app: Dash) -> None:
    """The page's callback, on `app`: any filter or pager change redraws the table from the server."""
    app.callback(Output(ids.VL_TABLE, "children"), Output(ids.VL_COUNT, "children"), Output(ids.VL_PAGE, "data"),
                 Output(ids.VL_PROGRESS, "children"), Output(ids.VL_POLL, "disabled"), Output(ids.VL_BODY, "children"),
                 Input(ids.VL_CHECKS, "value"), Input(ids.VL_SEVERITY, "value"), Input(ids.VL_MODE, "value"),
                 Input(ids.VL_REQUEST, "value"), Input(ids.VL_FROM, "value"), Input(ids.VL_TO, "value"),
                 Input(ids.VL_TEXT, "value"), Input(ids.VL_PREV, "n_clicks"), Input(ids.VL_NEXT, "n_clicks"),
                 Input(ids.VL_POLL, "n_intervals"), State(ids.VL_PAGE, "data"), prevent_initial_call=True)(update)
