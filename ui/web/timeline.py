"""The timeline page (`/`): the overview of every step, a step window picked on a slider, in two boxes or by a click
on the overview, and the window's Gantt, plan/compute overlap, stats and idle gaps; with its callbacks."""

from __future__ import annotations

import os
from typing import Any, TypedDict

import dash
import numpy as np
from dash import Dash, Input, Output, State, dcc, html, no_update
from dash.development.base_component import Component
from specscope.ui import views

from . import figures, ids, models
from .dashboard import Dashboard, check_int, current, safe, trigger_id
from .pages import BOX, error_panel, fmt_share, graph, kv_table, loading_note, ms, table
from .routes import InputError, Route, step_href
from .source import WAIT_S, TraceSource

DEFAULT_WINDOW = 100  # steps in the timeline's first window
MAX_WINDOW = 300  # steps whose spans one Gantt shows; a wider window is drawn per bin of steps
WINDOW_BINS = 200  # bins of a window wider than MAX_WINDOW

# In the browser: a click on a Gantt bar (customdata[0]) or an overlap point (x) opens its step without a round trip
# (Dash would also call a server callback once for nothing when the timeline appears); anything else changes
# nothing. The step page checks the number.
OPEN_STEP_JS = """
function (gantt, overlap) {
  var nu = window.dash_clientside.no_update, ctx = window.dash_clientside.callback_context;
  var click = ctx && ctx.triggered_id === '@GANTT' ? gantt : overlap;
  var p = click && click.points && click.points[0];
  if (!p) return [nu, nu];
  var s = Array.isArray(p.customdata) && p.customdata.length ? p.customdata[0] : p.x;
  if (typeof s !== 'number' || !Number.isInteger(s) || s < 0) return [nu, nu];
  return ['/step/' + s, ''];
}
""".replace("@GANTT", ids.TL_GANTT)

def default_window(src: TraceSource) -> tuple[int, int]:
    """The first window [lo, hi) of step indexes: the first DEFAULT_WINDOW steps, or the last ones of a live trace
    (it follows). Counted in steps, not indexes: a bundle keeps the original run's numbers, which skip."""
    n = src.num_steps()
    if n == 0:
        return 0, 0
    if src.is_live():
        return src.index_at(n - DEFAULT_WINDOW), src.last_index() + 1
    # The run itself, not its warm-up: from the first step served (graph captures run before iteration 0, and
    # one of them can be a thousand steady steps long), as far as the summaries loaded so far say.
    cols = src.columns(0)
    served = np.flatnonzero(cols.iteration >= 0)
    at = src.position(int(cols.index[served[0]])) if len(served) else 0
    at = max(0, min(at, n - DEFAULT_WINDOW))
    return src.index_at(at), src.index_at(at + DEFAULT_WINDOW - 1) + 1


def clamp_window(lo: int, hi: int, n: int, src: TraceSource | None = None) -> tuple[int, int, int]:
    """[lo, hi) of step indexes clamped to the trace, and how many steps it holds. `n` is the number of steps;
    `src` (when given) knows the indexes a trace holds, which a bundle's make skip."""
    first, last = (0, n - 1) if src is None else (src.first_index(), src.last_index())
    lo = max(first, min(int(lo), max(last, first)))
    hi = max(lo + 1, min(int(hi), last + 1))
    if src is None:
        return lo, hi, hi - lo
    a, b = src.positions.first_at_or_after(lo), src.positions.first_at_or_after(hi)  # rows of the window
    return src.index_at(a), hi, b - a


class TimelineWindow(TypedDict):
    """What the timeline draws of one step window."""

    gantt: figures.Figure
    overlap: figures.Figure
    overview: figures.Figure | None
    window: dict[str, Any]  # the overview's shaded window (a layout shape)
    stats: html.Table
    gaps: Component


def timeline_window(src: TraceSource, lo: int, hi: int, wait: float = WAIT_S,
                    overview: bool = True) -> TimelineWindow:
    """Figures and texts of the timeline for the step window [lo, hi) (`wait`: for summaries still loading);
    without `overview`, its "window" entry is the shaded window's shape alone (the overview stays as drawn)."""
    n = src.num_steps()
    lo, hi, count = clamp_window(lo, hi, n, src)
    overview_fig = None
    if overview:
        cols = src.columns(wait)
        top, above = models.robust_range(cols)
        overview_fig = figures.overview_figure(models.step_durations(cols), (lo, hi), models.lanes(cols), top, above)
    if count > MAX_WINDOW:  # too wide for span by span: per bin of steps, aggregated in SQL
        sb = src.span_bins(lo, hi, WINDOW_BINS)
        comp = sb.stream == "compute"
        plan = sb.stream == "plan"
        stats = [("window", f"steps {lo}–{hi - 1} ({count:,} steps, in {len(sb.edges) - 1} bins)"),
                 ("plan stream busy", ms(int(sb.busy_ns[plan].sum()))),
                 ("compute busy", ms(int(sb.busy_ns[comp].sum()))),
                 ("plan hidden under compute, idle gaps", f"per step, for windows of at most {MAX_WINDOW} steps")]
        return {"gantt": figures.stream_bins_figure(sb), "overlap": figures.plan_bins_figure(sb),
                "overview": overview_fig, "window": figures.window_shape((lo, hi)),
                "stats": kv_table(stats, id=ids.TL_WINDOW_STATS),
                "gaps": html.P(f"idle gaps are listed for windows of at most {MAX_WINDOW} steps", className="muted")}
    spans = src.spans(lo, hi)
    rows, gaps = models.step_streams(spans)
    tot = models.stream_totals(rows, gaps)
    stats = [
        ("window", f"steps {lo}–{hi - 1}"),
        ("plan hidden under compute", fmt_share(tot["plan_hidden_share"])),
        ("compute busy", ms(int(tot["compute_ns"]))),
        ("GPU idle gaps", f"{tot['gaps']} gaps, {ms(int(tot['idle_ns']))} "
                          f"({fmt_share(tot['idle_share'])} of compute time)"),
    ]  # fmt: skip
    top_gaps = sorted(gaps, key=lambda g: g.start_ns - g.end_ns)[:8]
    gap_rows = [(dcc.Link(f"{g.after_step} → {g.before_step}" if g.after_step != g.before_step
                          else f"inside step {g.before_step}", href=step_href(g.before_step, src.key)),
                 views.fmt_ns(g.end_ns - g.start_ns)) for g in top_gaps]
    return {
        "gantt": figures.gantt_figure(spans),
        "overlap": figures.overlap_figure(rows),
        "overview": overview_fig,
        "window": figures.window_shape((lo, hi)),
        "stats": kv_table(stats, id=ids.TL_WINDOW_STATS),
        "gaps": table(["largest idle gaps (steps)", "idle"], gap_rows) if gap_rows else html.P("no compute idle gaps"),
    }


def timeline_page(src: TraceSource) -> html.Div:
    """Timeline: overview of every step (binned), a step-range slider, the Gantt and overlap of the window."""
    n = src.num_steps()
    if n == 0:
        return html.Div([html.H2("Timeline"), html.P("the trace has no steps yet", id=ids.TL_EMPTY)])
    lo, hi = default_window(src)
    w = timeline_window(src, lo, hi)
    # The slider runs over step indexes (a bundle's start late): its marks are the steps at its quarters.
    first, last = src.first_index(), src.last_index()
    marks = {j: str(j) for j in (src.index_at(round(k * (n - 1) / 4)) for k in range(5))}
    return html.Div([
        html.H2("Timeline"),
        html.P(_trace_line(src), className="muted"),
        *loading_note(src),
        dcc.Checklist(id=ids.TL_OUTLIERS, options=[{"label": " show warm-up and capture outliers (full host-time "
                                                             "scale)", "value": "all"}], value=[], inline=True),
        graph(ids.TL_OVERVIEW, w["overview"]),
        html.Div([
            html.Label("step range"),
            dcc.RangeSlider(id=ids.TL_RANGE, min=first, max=max(last, first + 1), step=1,
                            value=[lo, max(lo, hi - 1)], marks=marks, allowCross=False, updatemode="mouseup",
                            allow_direct_input=False,  # its own boxes commit on blur: ours below commit on Enter
                            tooltip={"placement": "bottom", "always_visible": False}),
        ], className="slider"),
        html.Div([
            html.Span("steps"),
            # Committed on Enter (n_submit), not on every keystroke or on leaving the box.
            dcc.Input(id=ids.TL_FROM, type="text", inputMode="numeric", value=str(lo), n_submit=0, style=BOX),
            html.Span("to"),
            dcc.Input(id=ids.TL_TO, type="text", inputMode="numeric", value=str(max(lo, hi - 1)), n_submit=0,
                      style=BOX),
            html.Span("(Enter applies; any width: wider than 300 steps is drawn per bin)", className="muted"),
        ], className="range-boxes"),
        html.Div(w["stats"], id=ids.TL_STATS),
        graph(ids.TL_GANTT, w["gantt"]),
        graph(ids.TL_OVERLAP, w["overlap"]),
        html.Div(w["gaps"], id=ids.TL_GAPS),
    ], id=ids.TL_PAGE)


def _trace_line(src: TraceSource) -> str:
    run = src.run
    live = "live" if src.is_live() else src.end_state().label
    return (f"{os.path.basename(src.name)} · {src.num_steps()} steps{_of_steps(src)} ({live}) · {run.device} · "
            f"kernel {run.attention_kernel} · target {run.target_model} · draft {run.draft_model or '-'}")


def _of_steps(src: TraceSource) -> str:
    """` (steps 2, 5, 30–59)` for a trace whose indexes do not run 0..n-1 (a bundle's), else nothing."""
    return "" if src.positions.dense else f" ({src.steps_text()})"



def layout(d: Dashboard, route: Route) -> Component:
    """The page at `/` (routes.PAGE_MODULES)."""
    return timeline_page(d.source(route.trace))


def _box(x: object, name: str, hi: int) -> int:
    """A step-range box's text: a step index in [0, hi]."""
    if not isinstance(x, str) or not x.strip().isdigit() or len(x.strip()) > 12:
        raise InputError(f"{name} must be a step index, not {str(x)[:40]!r}")
    return min(int(x.strip()), hi)


def _clicked_x(click: object) -> int:
    """The step nearest the x of the first point of an overview click (InputError for anything else)."""
    if not isinstance(click, dict) or not isinstance(click.get("points"), list) or not click["points"]:
        raise InputError("malformed click")
    p = click["points"][0]
    x = p.get("x") if isinstance(p, dict) else None
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not abs(x) <= 10**12:  # (not NaN)
        raise InputError("malformed click")
    return check_int(round(x), "step")


WindowOut = tuple[Any, Any, Any, Any, Any, Any, Any, Any]


def _window_error(m: str) -> WindowOut:
    return (figures.empty_figure(m),) * 3 + (error_panel(m), "", no_update, no_update, no_update)


@safe(_window_error)
def window(value: object, from_submits: object, to_submits: object, click: object, box_lo: object, box_hi: object,
           *, trigger: str | None = None) -> WindowOut:
    """The window's figures, stats and gaps, the overview's shaded window (patched) and the range controls, for a
    moved slider, a box committed with Enter or a click on the overview (`trigger`: which, for a direct call)."""
    src = current().source("a")
    first, last = src.first_index(), src.last_index()
    top = max(last + 1, 0)  # the slider runs over step indexes (a bundle's start late and skip)
    trig = trigger_id(trigger)
    if trig in (ids.TL_FROM, ids.TL_TO):
        lo, hi = _box(box_lo, "first step", top), _box(box_hi, "last step", top)
    elif trig == ids.TL_OVERVIEW:
        try:
            x = _clicked_x(click)
        except InputError:
            raise dash.exceptions.PreventUpdate from None  # a click on no step changes nothing
        width = DEFAULT_WINDOW
        if isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) for v in value):
            width = max(1, value[1] - value[0] + 1)
        lo = max(first, min(x - width // 2, last + 1 - width))
        hi = min(last, lo + width - 1)
    else:
        if not isinstance(value, list) or len(value) != 2:
            raise InputError("the step range must be two step indexes")
        lo, hi = check_int(value[0], "range start", 0, top), check_int(value[1], "range end", 0, top)
    lo, hi = min(lo, hi), max(lo, hi)
    w = timeline_window(src, lo, hi + 1, overview=False)
    shade = dash.Patch()  # only the shaded window moves: not the whole overview (~250 KB) again
    shade["layout"]["shapes"] = [w["window"]]
    rng = no_update if trig == ids.TL_RANGE else [lo, hi]  # the slider is where it was moved to
    return w["gantt"], w["overlap"], shade, w["stats"], w["gaps"], rng, str(lo), str(hi)


@safe(lambda m: no_update)
def outliers(value: object) -> Any:
    """The overview's host-time scale: the robust one (warm-up and capture outliers left out), or all of it."""
    show = isinstance(value, list) and "all" in value
    patch = dash.Patch()
    if show:
        patch["layout"]["yaxis"]["autorange"] = True
    else:
        top, _ = models.robust_range(current().source("a").columns())
        patch["layout"]["yaxis"]["autorange"] = False
        patch["layout"]["yaxis"]["range"] = [0, top]
    return patch


def register(app: Dash) -> None:
    """The page's callbacks, on `app`."""
    app.callback(Output(ids.TL_GANTT, "figure"), Output(ids.TL_OVERLAP, "figure"), Output(ids.TL_OVERVIEW, "figure"),
                 Output(ids.TL_STATS, "children"), Output(ids.TL_GAPS, "children"), Output(ids.TL_RANGE, "value"),
                 Output(ids.TL_FROM, "value"), Output(ids.TL_TO, "value"), Input(ids.TL_RANGE, "value"),
                 Input(ids.TL_FROM, "n_submit"), Input(ids.TL_TO, "n_submit"), Input(ids.TL_OVERVIEW, "clickData"),
                 State(ids.TL_FROM, "value"), State(ids.TL_TO, "value"), prevent_initial_call=True)(window)
    app.callback(Output(ids.TL_OVERVIEW, "figure", allow_duplicate=True), Input(ids.TL_OUTLIERS, "value"),
                 prevent_initial_call=True)(outliers)
    # Dash declares clientside_callback without annotations: the one untyped call of the page.
    app.clientside_callback(  # type: ignore[no-untyped-call]
        OPEN_STEP_JS, Output(ids.URL, "pathname"), Output(ids.URL, "search"),
        Input(ids.TL_GANTT, "clickData"), Input(ids.TL_OVERLAP, "clickData"), prevent_initial_call=True)
