"""The compare page (`/compare`, with `--compare TRACE_B`): the first diverging step of the two traces
(tracer.diff), what differs there with links into both, and both traces' acceptance. No callbacks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dash import Dash, dcc, html
from dash.development.base_component import Component

from . import figures, ids, models
from .acceptance import acceptance_stats_rows
from .dashboard import MAX_COMPARE_STEPS, Dashboard
from .pages import graph, kv_table, loading_note, table, trace_name
from .routes import Route, step_href
from .source import TraceSource

if TYPE_CHECKING:
    from specscope.tracer.diff import Difference, DiffReport, StepDivergence

__all__ = ["MAX_COMPARE_STEPS", "compare_page", "divergence_block", "layout"]



def _diff_link(div: StepDivergence, d: Difference, key: str) -> str:
    step = div.a_step if key == "a" else div.b_step
    q: dict[str, int | str] = {}
    if d.row is not None:
        q["row"] = int(d.row)
        if d.col is not None:
            q["col"] = int(d.col)
    elif d.request_id is not None:
        q["request"] = int(d.request_id)
    return step_href(step, key, **q)


def divergence_block(title: str, div: StepDivergence, id: str) -> html.Div:
    """One diverging step pair of a `tracer.diff.DiffReport`: where, links into both traces, what differs."""
    diffs = div.differences
    first = diffs[0] if diffs else None
    links = [dcc.Link(f"open A step {div.a_step}", href=_diff_link(div, first, "a") if first else
                      step_href(div.a_step, "a"), className="btn", id=ids.divergence(id, "open-a")),
             dcc.Link(f"open B step {div.b_step}", href=_diff_link(div, first, "b") if first else
                      step_href(div.b_step, "b"), className="btn", id=ids.divergence(id, "open-b"))]
    rows = []
    for d in diffs[:200]:
        where = "" if d.row is None else f"[{d.row}" + ("" if d.col is None else f", {d.col}") + "]"
        who = "" if d.request_id is None else f" (request {d.request_id})"
        rows.append((d.kind, f"{d.name}{where}{who}", _short(d.a), _short(d.b)))
    return html.Div([
        html.H3(f"{title}: A step {div.a_step} / B step {div.b_step} — {div.label}"),
        html.Div(links),
        table(["kind", "what", "A", "B"], rows, id=ids.divergence(id, "diffs")),
    ], id=id)


def _short(v: object, limit: int = 16) -> str:
    if isinstance(v, (list, tuple)):
        body = ", ".join(str(x) for x in v[:limit])
        return f"[{body}{', …' if len(v) > limit else ''}]"
    return str(v)


def compare_page(a: TraceSource, b: TraceSource | None, report: DiffReport | None) -> html.Div:
    """Compare: the first diverging step (tracer.diff), its metadata differences, acceptance of both traces."""
    if b is None or report is None:
        return html.Div([html.H2("Compare"), html.P("start the dashboard with --compare TRACE_B to compare two "
                                                    "traces", id=ids.CMP_NONE)], id=ids.CMP_PAGE)
    rep = report
    na, nb = trace_name(a), trace_name(b)
    faults = [("A", f"{a.name} ({a.num_steps()} steps; faults: {', '.join(rep.a_faults) or 'none'})"),
              ("B", f"{b.name} ({b.num_steps()} steps; faults: {', '.join(rep.b_faults) or 'none'})")]
    blocks = []
    if rep.first is not None:
        blocks.append(divergence_block("First diverging step", rep.first, ids.CMP_FIRST))
    if rep.first_forward is not None and rep.first_forward is not rep.first:
        blocks.append(divergence_block("First diverging forward (not a capture)", rep.first_forward,
                                       ids.CMP_FORWARD))
    limit = rep.steps_compared >= MAX_COMPARE_STEPS and rep.first_forward is None
    note = f"{rep.steps_compared} step pairs compared" + (f" (the first {MAX_COMPARE_STEPS} only)" if limit else "")
    o = rep.outputs
    outputs = f"outputs: {o['identical']} of {o['requests_compared']} requests identical"
    if o["differing"]:
        f = o["differing"][0]
        outputs += f"; first difference: request {f['request_id']} at output token {f['position']}"
    ca, cb = a.columns(), b.columns()
    stats = {na: models.acceptance(ca), nb: models.acceptance(cb)}
    h, rows = acceptance_stats_rows(stats)
    return html.Div([
        html.H2("Compare"), *loading_note(a, b), kv_table(faults, id=ids.CMP_TRACES),
        html.P(rep.headline, id=ids.CMP_VERDICT, className="banner"),
        html.P(note + " · " + outputs, className="muted"),
        *blocks,
        html.H3("Acceptance"), table(h, rows, id=ids.CMP_ACC),
        html.Div([graph(ids.CMP_POSITION, figures.by_position_figure(stats)),
                  graph(ids.CMP_HIST, figures.histogram_figure(stats))], className="row2"),
        graph(ids.CMP_TIME, figures.over_time_figure({na: models.mean_accept_per_step(ca),
                                                    nb: models.mean_accept_per_step(cb)})),
    ], id=ids.CMP_PAGE)


def layout(d: Dashboard, route: Route) -> Component:
    """The page at `/compare` (routes.PAGE_MODULES): a hint when the dashboard serves one trace."""
    if "b" not in d.sources:
        return compare_page(d.source(route.trace), None, None)
    return compare_page(d.sources["a"], d.sources["b"], d.divergence())


def register(app: Dash) -> None:
    """The page has no callbacks of its own (app.py's `render` redraws it as a live trace grows)."""
