"""The acceptance page (`/acceptance`): mean accept length, tokens per verify step, draft acceptance and waste; by
draft position, the histogram, over time, against batch size and per request, for each trace served. No callbacks:
the page redraws when a live trace grows (app.py's `render`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from dash import Dash, html
from dash.development.base_component import Component
from specscope.ui import views

from . import figures, ids, models
from .dashboard import Dashboard
from .pages import Cell, fmt_share, graph, loading_note, table, trace_name
from .routes import Route
from .source import Columns, TraceSource

MAX_REQUEST_SCAN = 4000  # verify steps decoded for the per-request chart (the most recent ones)


def acceptance_stats_rows(stats: Mapping[str, views.AcceptanceStats]) -> tuple[list[str], list[list[Cell]]]:
    """Header and rows of the acceptance statistics table, one column per trace."""
    names = list(stats)
    fields: list[tuple[str, Callable[[views.AcceptanceStats], Cell]]] = [
        ("verify steps", lambda s: s.verify_steps), ("verify rows", lambda s: s.rows),
        ("mean accept length", lambda s: f"{s.mean_accept_length:.3f}"),
        ("tokens per verify step", lambda s: f"{s.tokens_per_verify_step:.2f}"),
        ("draft acceptance", lambda s: fmt_share(s.draft_acceptance)),
        ("draft-token waste", lambda s: fmt_share(s.draft_waste)),
    ]  # fmt: skip
    return ["", *names], [[label, *(f(stats[n]) for n in names)] for label, f in fields]


def per_request(src: TraceSource, cols: Columns) -> tuple[list[models.GroupRow], str]:
    """Mean accept length per request, over (at most MAX_REQUEST_SCAN of the latest) verify steps in `cols` (the
    summary columns the rest of the page was built from), from the trace's per-step request rows: no step body is
    decoded."""
    idx = cols.index[models.verify_mask(cols)]  # step indexes, not rows
    if not len(idx):
        return [], ""
    note = ""
    if len(idx) > MAX_REQUEST_SCAN:
        note = f" (the last {MAX_REQUEST_SCAN} of {len(idx)} verify steps)"
        idx = idx[-MAX_REQUEST_SCAN:]
    with src.locked():
        got = src.reader.accept_lengths_by_request(int(idx[0]), int(idx[-1]) + 1)
    return [models.GroupRow(rid, n, n, total / n) for rid, (n, total) in sorted(got.items())], note


def acceptance_page(sources: dict[str, TraceSource]) -> html.Div:
    """Acceptance: statistics, rate by draft position, histogram, over time, against batch size, per request."""
    names = {k: trace_name(s) for k, s in sources.items()}
    cols = {k: s.columns() for k, s in sources.items()}
    stats = {names[k]: models.acceptance(cols[k]) for k in sources}
    note = loading_note(*sources.values())
    if not any(s.verify_steps for s in stats.values()):
        empty = "no TARGET_VERIFY steps loaded yet" if note else "no TARGET_VERIFY steps in this trace"
        return html.Div([html.H2("Acceptance"), *note, html.P(empty, id=ids.ACC_EMPTY)])
    head, rows = acceptance_stats_rows(stats)
    req: dict[str, list[models.GroupRow]] = {}
    notes = []
    for k, s in sources.items():
        r, scan_note = per_request(s, cols[k])
        req[names[k]] = r
        if scan_note:
            notes.append(names[k] + scan_note)
    return html.Div([
        html.H2("Acceptance"), *note,
        table(head, rows, id=ids.ACC_STATS),
        html.Div([graph(ids.ACC_POSITION, figures.by_position_figure(stats)),
                  graph(ids.ACC_HIST, figures.histogram_figure(stats))], className="row2"),
        graph(ids.ACC_TIME, figures.over_time_figure({names[k]: models.mean_accept_per_step(cols[k])
                                                    for k in sources})),
        html.Div([
            graph(ids.ACC_BS, figures.group_figure({names[k]: models.acceptance_by_batch_size(cols[k])
                                                  for k in sources}, "Against batch size", "batch size")),
            graph(ids.ACC_REQUEST, figures.group_figure(req, "Per request" + ("; ".join(notes) and " — "
                                                                             + "; ".join(notes)), "request")),
        ], className="row2"),
    ], id=ids.ACC_PAGE)




def layout(d: Dashboard, route: Route) -> Component:
    """The page at `/acceptance` (routes.PAGE_MODULES): every trace served, side by side."""
    return acceptance_page(d.sources)


def register(app: Dash) -> None:
    """The page has no callbacks of its own (app.py's `render` redraws it as a live trace grows)."""
