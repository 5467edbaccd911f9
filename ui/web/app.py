"""The dashboard app factory: `create_app(trace, compare=None)` opens the named traces and wires the callbacks.

Callbacks only validate their inputs and call the page / figure / view-model functions; anything that goes
wrong inside one becomes a one-line message on the page (and on stderr), never a traceback in the browser.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import dash
from dash import Dash, Input, Output, State, dcc, html, no_update
from specscope.tracer.errors import TraceError
from specscope.ui import views

from . import figures, ids, models, pages, scripts, violations
from .routes import InputError, RouteError, parse_route, step_href
from .source import TraceSource

if TYPE_CHECKING:
    from specscope.tracer.diff import DiffReport

_HERE = os.path.dirname(os.path.abspath(__file__))
# Dash serves its assets folder from disk; point it at a folder that does not exist, so no request path is ever
# joined to a directory of ours. The page's CSS and key handling are inline in the index page below.
_NO_ASSETS = os.path.join(_HERE, "_no_assets_")

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#222;background:#fafafa}
header{display:flex;gap:18px;align-items:center;padding:8px 16px;background:#263238;color:#fff}
header a{color:#cfd8dc;text-decoration:none;font-weight:600} header a:hover{color:#fff}
header .title{font-weight:700;margin-right:12px} #live-status{margin-left:auto;font-size:13px;color:#b0bec5}
main{padding:8px 16px} h2{margin:8px 0} h3{margin:12px 0 6px;font-size:15px}
.muted{color:#777;font-size:13px} .tbl{border-collapse:collapse;font-size:13px;margin:4px 0}
.tbl th,.tbl td{border:1px solid #ddd;padding:2px 6px;text-align:left;font-variant-numeric:tabular-nums}
.text-table{font-size:12px;line-height:1.35;margin:4px 0;background:#fff;border:1px solid #ddd;padding:4px 6px;
 display:inline-block} .text-table .hl{background:#fff59d}
.tbl thead th{background:#eceff1} .tbl.kv th{background:#f5f5f5;font-weight:600} tr.hl td{background:#fff59d}
.row{display:flex;gap:24px;flex-wrap:wrap} .col{flex:1;min-width:320px} .col.narrow{flex:0 0 340px}
.row2{display:grid;grid-template-columns:1fr 1fr;gap:12px}
.btn{display:inline-block;padding:3px 10px;border:1px solid #90a4ae;border-radius:4px;background:#fff;
 text-decoration:none;color:#263238;margin-right:6px} .btn.disabled{opacity:.4;pointer-events:none}
.step-nav{display:flex;gap:12px;align-items:center;margin:6px 0} .step-label{font-weight:600}
.banner{background:#ffe0b2;border-left:4px solid #e65100;padding:6px 10px;margin:6px 0}
.banner.notes{margin:0;font-size:13px} .banner.notes summary{cursor:pointer;font-weight:600}
.banner.notes ul{margin:4px 0;padding-left:20px}
.legend{display:flex;flex-wrap:wrap;gap:6px;font-size:12px;margin:4px 0}
.chip{padding:1px 6px;border-radius:3px;border:1px solid #ccc}
.chain{margin:2px 0;font-family:ui-monospace,monospace;font-size:13px} .chain.hl{background:#fff59d}
.chain-label{display:inline-block;width:44px;font-weight:600}
.tok{display:inline-block;padding:0 4px;margin:0 2px;border-radius:3px;border:1px solid #ccc;white-space:pre}
.tok.root{background:#eceff1} .tok.acc{background:#c8e6c9} .tok.rej{background:#ffcdd2;text-decoration:line-through}
.tok.bonus{background:#bbdefb} .cell-detail{margin:4px 0;font-size:13px}
.error-panel{padding:16px;border:1px solid #e57373;background:#ffebee;margin:16px 0}
.slider{margin:4px 24px 12px} .viol-group summary{cursor:pointer;font-weight:600;margin:6px 0}
.viol-group li{font-size:13px;margin:2px 0} #step-violations{font-size:13px;padding-left:22px;margin:4px 0}
.viol-list li{margin:2px 0;padding:1px 4px} .viol-list li.cur{background:#fff59d;outline:2px solid #f9a825}
.sev-error{color:#b71c1c;font-weight:600} .sev-warning{color:#e65100;font-weight:600}
.mk{color:#b71c1c;font-weight:700;white-space:nowrap} .mk.rel{color:#1a47c7;font-weight:600}
tr.marked th,tr.marked td{background:#ffebee} .mkcell{outline:2px solid #d50000;font-weight:700;background:#ffebee}
.mkcell.rel{outline:2px dashed #2962ff;background:#e3f2fd} .text-table .mkrow{background:#fff3f3}
.tbl.marks td{font-family:ui-monospace,monospace} .mkchip{border:2px solid #d50000;background:#fff}
.filters{display:flex;flex-wrap:wrap;gap:10px 18px;align-items:center;margin:6px 0;font-size:13px}
.filters input{width:90px;padding:2px 4px} .filters input.wide{width:220px} .viol-table td{white-space:nowrap}
.viol-table td:last-child{white-space:normal}
.filters label{margin-right:6px} .pager{display:flex;gap:10px;align-items:center;margin:6px 0}
.range-boxes{display:flex;gap:8px;align-items:center;font-size:13px;margin:0 24px}
.range-boxes input{width:90px}
"""

# Arrow keys step through the explorer and n / N walk its violations, by clicking the page's links (ignored while
# typing in a field).
KEYS_JS = """
document.addEventListener('keydown', function (e) {
  var t = e.target; if (t && (t.tagName === 'INPUT' || t.tagName === 'TEXTAREA' || t.isContentEditable)) return;
  if (e.altKey || e.ctrlKey || e.metaKey) return;
  var id = {ArrowLeft: 'step-prev', '[': 'step-prev', ArrowRight: 'step-next', ']': 'step-next',
            n: 'viol-next', N: 'viol-prev'}[e.key] || null;
  if (!id) return; var a = document.getElementById(id);
  if (a && !a.classList.contains('disabled')) { e.preventDefault(); a.click(); }
});
"""

# The step of a clicked Gantt bar (customdata[0]) or overlap point (x); anything else changes nothing.
OPEN_STEP_JS = """
function (gantt, overlap) {
  var nu = window.dash_clientside.no_update, ctx = window.dash_clientside.callback_context;
  var click = ctx && ctx.triggered_id === 'tl-gantt' ? gantt : overlap;
  var p = click && click.points && click.points[0];
  if (!p) return [nu, nu];
  var s = Array.isArray(p.customdata) && p.customdata.length ? p.customdata[0] : p.x;
  if (typeof s !== 'number' || !Number.isInteger(s) || s < 0) return [nu, nu];
  return ['/step/' + s, ''];
}
"""
def _index(head: str) -> str:
    return ("""<!DOCTYPE html>
<html><head>{%metas%}<title>{%title%}</title>{%favicon%}{%css%}""" + head + "<style>" + CSS + """</style></head>
<body>{%app_entry%}<footer>{%config%}{%scripts%}{%renderer%}</footer>
<script>""" + KEYS_JS + """</script></body></html>""")


def _log(message: str) -> None:
    print(f"specscope web: {' '.join(message.split())}", file=sys.stderr)


def _safe(fallback: Callable[[str], Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Turn any exception in a callback into `fallback(message)` (one line, no traceback to the browser)."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def inner(*args: Any) -> Any:
            try:
                return fn(*args)
            except dash.exceptions.PreventUpdate:
                raise
            except (RouteError, InputError, TraceError) as e:
                return fallback(str(e))
            except Exception as e:  # noqa: BLE001 - a page must never show a traceback
                _log(f"{fn.__name__}: {type(e).__name__}: {e}")
                return fallback(f"internal error ({type(e).__name__}: {e})")

        return inner

    return wrap


def _int(x: object, name: str, lo: int = 0, hi: int = 10**9) -> int:
    """A callback input that must be an integer in [lo, hi]."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or x != int(x) or not lo <= int(x) <= hi:
        raise InputError(f"{name} must be an integer in [{lo}, {hi}], not {str(x)[:40]!r}")
    return int(x)


def _box(x: object, name: str, hi: int) -> int:
    """A step-range box's text: a step index in [0, hi]."""
    if not isinstance(x, str) or not x.strip().isdigit() or len(x.strip()) > 12:
        raise InputError(f"{name} must be a step index, not {str(x)[:40]!r}")
    return min(int(x.strip()), hi)


def _clicked_step(click: object) -> int:
    """The step index in a Plotly clickData (customdata[0] of the first point)."""
    if not isinstance(click, dict) or not isinstance(click.get("points"), list) or not click["points"]:
        raise InputError("malformed click")
    p = click["points"][0]
    cd = p.get("customdata") if isinstance(p, dict) else None
    if isinstance(cd, list) and cd:
        return _int(cd[0], "step")
    return _int(p.get("x") if isinstance(p, dict) else None, "step")


class Dashboard:
    """The opened traces and the caches the callbacks share."""

    def __init__(self, trace: str, compare_with: str | None = None) -> None:
        self.sources: dict[str, TraceSource] = {"a": TraceSource(trace, "a")}
        if compare_with is not None:
            self.sources["b"] = TraceSource(compare_with, "b")
        self.version = 0
        self._lock = threading.Lock()
        self._divergence: tuple[tuple[int, int], DiffReport] | None = None
        # The step page after the one just served, built ahead while the browser draws (stepping with → is the
        # explorer's hot path): {(trace, step, trace length): components}, and the thread building it.
        self._ahead: dict[tuple[str, int, int], Any] = {}
        self._ahead_lock = threading.Lock()
        self._ahead_thread: threading.Thread | None = None
        self._ahead_building: tuple[str, int, int] | None = None  # the page that thread builds

    def refresh(self) -> bool:
        """Load the steps live traces gained; True when any did."""
        grew = False
        for s in self.sources.values():
            grew = s.refresh() or grew
        if grew:
            self.version += 1
        return grew

    def needs_poll(self) -> bool:
        """True while a trace is being written or its summaries are still loading (the page polls)."""
        return any(s.is_live() or s.loading() for s in self.sources.values())

    def source(self, key: str) -> TraceSource:
        """The trace with this key (only the ones named on the command line exist)."""
        if key not in self.sources:
            raise RouteError(f"no trace {key!r}")
        return self.sources[key]

    def divergence(self) -> DiffReport:
        """The A/B `tracer.diff.DiffReport` (cached per pair of trace lengths)."""
        from specscope.tracer.diff import diff_traces

        a, b = self.sources["a"], self.sources["b"]
        key = (a.num_steps(), b.num_steps())
        with self._lock:
            if self._divergence is None or self._divergence[0] != key:
                with a.locked(), b.locked():
                    rep = diff_traces(a.reader, b.reader, max_steps=pages.MAX_COMPARE_STEPS)
                self._divergence = (key, rep)
            return self._divergence[1]

    def page(self, pathname: object, search: object) -> Any:
        """The components of the page at this address."""
        r = parse_route(pathname, search, tuple(self.sources))
        src = self.source(r.trace)
        if r.page == "step":
            # /step/N names the step by its index: a bundle keeps the original run's numbers (they skip).
            if r.step is None or not src.has(r.step):
                raise RouteError(f"no step {r.step}: the trace has {src.num_steps()} steps ({src.steps_text()})")
            if r.params:
                return pages.step_page(src, r.step, r.params)
            return self.step_page(src, r.step)
        if r.page == "acceptance":
            return pages.acceptance_page(self.sources)
        if r.page == "violations":
            return violations.page(src)
        if r.page == "compare":
            if "b" not in self.sources:
                return pages.compare_page(src, None, None)
            return pages.compare_page(self.sources["a"], self.sources["b"], self.divergence())
        return pages.timeline_page(src)


    def step_page(self, src: TraceSource, i: int) -> Any:
        """Step page i (no highlight): built ahead if it was the next one, and then the one after it is."""
        key = (src.key, i, src.num_steps())
        with self._ahead_lock:
            page = self._ahead.pop(key, None)
            running = self._ahead_thread if self._ahead_building == key else None
        if page is None:
            if running is not None:
                running.join()  # it is building this very page
                with self._ahead_lock:
                    page = self._ahead.pop(key, None)
            if page is None:
                page = pages.step_page(src, i, {})
        nxt = src.neighbour(i, 1)
        if nxt > i:
            self._build_ahead(src, nxt)
        return page

    def _build_ahead(self, src: TraceSource, i: int) -> None:
        key = (src.key, i, src.num_steps())

        def build() -> None:
            try:
                page = pages.step_page(src, i, {})
            except Exception:  # noqa: BLE001 - the page is built again on request, and reports its error then
                return
            with self._ahead_lock:
                self._ahead = {key: page}  # only the latest guess is worth keeping

        with self._ahead_lock:
            if self._ahead_thread is not None and self._ahead_thread.is_alive():
                return
            t = threading.Thread(target=build, name="specscope-web-ahead", daemon=True)
            self._ahead_thread, self._ahead_building = t, key
        t.start()


def _nav(d: Dashboard) -> html.Header:
    links = [dcc.Link("Timeline", href="/", id="nav-timeline"), dcc.Link("Acceptance", href="/acceptance",
             id="nav-acceptance"), dcc.Link("Violations", href="/violations", id="nav-violations")]
    if "b" in d.sources:
        links.append(dcc.Link("Compare", href="/compare", id="nav-compare"))
    a = d.sources["a"]
    return html.Header([html.Span("specscope", className="title"), *links,
                        dcc.Link(f"step {a.first_index()} of {os.path.basename(a.name)}",
                                 href=step_href(a.first_index()), id="nav-step"),
                        html.Span(_live_text(d), id="live-status")])


def _live_text(d: Dashboard) -> str:
    parts = []
    for k, s in d.sources.items():
        text = f"{k.upper()}: {s.num_steps()} steps{' (live)' if s.is_live() else ''}"
        if s.loading():
            text += f" (summaries {100 * s.loaded_steps() // max(1, s.num_steps())}% loaded)"
        parts.append(text)
    return " · ".join(parts)


def create_app(trace: str, compare_with: str | None = None, *, live_interval_ms: int = 1000,
               plotly: scripts.Bundle | None = None) -> Dash:
    """A Dash app that serves `trace` (and `compare_with` for the Compare page) and nothing else; `plotly` is the
    plotly.js served (default: scripts.choose_bundle(), the partial bundle).

    Raises TraceError when a trace cannot be read."""
    import flask

    d = Dashboard(trace, compare_with)
    bundle = plotly or scripts.choose_bundle()
    plotly_path = bundle.url
    # Our own Flask server: no static folder (Flask's /static route would map request paths to files), and an
    # explicit root path (Flask cannot infer one for a module of the `specscope` namespace package).
    server = flask.Flask("specscope_web", root_path=_HERE, instance_path=_NO_ASSETS, static_folder=None)
    app = Dash(
        "specscope_web", server=server,  # type: ignore[arg-type]  # Dash documents a Flask instance; its hint omits it
        title="specscope", assets_folder=_NO_ASSETS, include_assets_files=False,
        suppress_callback_exceptions=True, index_string=_index(scripts.preload_links(plotly_path)),
        update_title=None,  # type: ignore[arg-type]  # Dash documents None (keep the title); its hint says str
        serve_locally=True, enable_mcp=False, use_pages=False,
        eager_loading=False,  # Dash's async bundles on demand; plotly.js is ours (scripts.py)
        hooks={"layout_pre": scripts.layout_pre_hook(plotly_path)},
    )  # fmt: skip
    scripts.register(server, bundle)

    def layout() -> html.Div:
        # A function: each page load gets the current step count and polls only while something can change; and
        # the page at the browser's address, so that no callback round trip stands before its first figure.
        # dcc.Location given the address it is at changes nothing as it mounts, so `render` (prevent_initial_call)
        # is not called for the page already there; without a route it sets the address, and `render` draws it.
        # Whether to poll is asked before the page is built: summaries that finish loading in between must still
        # be polled for, or a page built from part of them would keep its "loading" banner.
        version, poll = d.version, d.needs_poll()
        route = _first_route()
        where = {} if route is None else {"pathname": route[0], "search": route[1]}
        children = None if route is None else _safe(pages.error_panel)(d.page)(*route)
        return html.Div([
            dcc.Location(id="url", refresh=False, **where),
            dcc.Interval(id="live", interval=live_interval_ms, disabled=not poll),
            dcc.Store(id="version", data=version),
            _nav(d),
            html.Div(pages.recording_banner(d.sources), id="recording-notes"),
            html.Main(html.Div(children, id="page")),
        ])

    app.layout = layout
    app.dashboard = d  # type: ignore[attr-defined]  # our handles on the app (tests read them): not Dash attributes
    app.plotly_bundle = bundle  # type: ignore[attr-defined]  # as above
    app.server.register_error_handler(Exception, _http_error)
    _register(app, d)
    return app


def _first_route() -> tuple[str, str] | None:
    """The (path, query string) of the page whose layout is asked for: dash-renderer fetches the layout from that
    page, which the request's Referer names. None when it names no page of this server (the browser then asks
    `render` for it, as for any later change of address)."""
    from urllib.parse import urlsplit

    from flask import has_request_context, request

    if not has_request_context():
        return None
    ref = request.referrer
    if not ref or len(ref) > 1024:
        return None
    try:
        u = urlsplit(ref)
    except ValueError:
        return None
    if u.scheme not in ("http", "https") or u.netloc != request.host:
        return None
    return u.path or "/", f"?{u.query}" if u.query else ""


def _http_error(e: Exception) -> Any:
    """Flask's last word on a request that failed: a short text reply, one line on stderr, no traceback."""
    from flask import request
    from werkzeug.exceptions import HTTPException

    if isinstance(e, HTTPException):
        return e
    if isinstance(e, dash.exceptions.DependencyException):  # a script path Dash does not serve
        return "not found\n", 404, {"Content-Type": "text/plain"}
    _log(f"{request.method} {request.path[:80]}: {type(e).__name__}: {str(e)[:200]}")
    return "specscope web: the request failed (see the server's stderr)\n", 500, {"Content-Type": "text/plain"}


def _register(app: Dash, d: Dashboard) -> None:
    @app.callback(Output("page", "children"), Input("url", "pathname"), Input("url", "search"),
                  Input("version", "data"), prevent_initial_call=True)
    @_safe(pages.error_panel)
    def render(pathname: object, search: object, _version: object) -> Any:
        trig = dash.ctx.triggered_id
        if trig == "version" and isinstance(pathname, str) and pathname.startswith("/step/"):
            raise dash.exceptions.PreventUpdate  # a growing trace does not change a step already shown
        return d.page(pathname, search)

    @app.callback(Output("version", "data"), Output("live-status", "children"), Output("live", "disabled"),
                  Output("recording-notes", "children"), Input("live", "n_intervals"), prevent_initial_call=True)
    def poll(_n: object) -> Any:
        try:
            grew = d.refresh()
        except TraceError as e:
            return no_update, f"cannot read the trace: {e}", True, no_update
        notes = pages.recording_banner(d.sources) if grew else no_update  # a live recording's problems grow
        return (d.version if grew else no_update), _live_text(d), not d.needs_poll(), notes

    @app.callback(Output(ids.TL_GANTT, "figure"), Output(ids.TL_OVERLAP, "figure"), Output(ids.TL_OVERVIEW, "figure"),
                  Output(ids.TL_STATS, "children"), Output(ids.TL_GAPS, "children"), Output(ids.TL_RANGE, "value"),
                  Output(ids.TL_FROM, "value"), Output(ids.TL_TO, "value"), Input(ids.TL_RANGE, "value"),
                  Input(ids.TL_FROM, "n_submit"), Input(ids.TL_TO, "n_submit"), Input(ids.TL_OVERVIEW, "clickData"),
                  State(ids.TL_FROM, "value"), State(ids.TL_TO, "value"), prevent_initial_call=True)
    @_safe(lambda m: (figures.empty_figure(m),) * 3 + (pages.error_panel(m), "", no_update, no_update, no_update))
    def window(value: object, _from_n: object, _to_n: object, click: object, box_lo: object, box_hi: object) -> Any:
        src = d.source("a")
        first, last = src.first_index(), src.last_index()
        top = max(last + 1, 0)  # the slider runs over step indexes (a bundle's start late and skip)
        trig = dash.ctx.triggered_id
        if trig in (ids.TL_FROM, ids.TL_TO):
            lo, hi = _box(box_lo, "first step", top), _box(box_hi, "last step", top)
        elif trig == ids.TL_OVERVIEW:
            try:
                x = _clicked_step({"points": [{"x": round(click["points"][0]["x"])}]} if isinstance(click, dict)
                                  and click.get("points") and isinstance(click["points"][0], dict)
                                  and isinstance(click["points"][0].get("x"), (int, float)) else click)
            except InputError:
                raise dash.exceptions.PreventUpdate from None  # a click on no step changes nothing
            width = pages.DEFAULT_WINDOW
            if isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) for v in value):
                width = max(1, value[1] - value[0] + 1)
            lo = max(first, min(x - width // 2, last + 1 - width))
            hi = min(last, lo + width - 1)
        else:
            if not isinstance(value, list) or len(value) != 2:
                raise InputError("the step range must be two step indexes")
            lo, hi = _int(value[0], "range start", 0, top), _int(value[1], "range end", 0, top)
        lo, hi = min(lo, hi), max(lo, hi)
        w = pages.timeline_window(src, lo, hi + 1, overview=False)
        shade = dash.Patch()  # only the shaded window moves: not the whole overview (~250 KB) again
        shade["layout"]["shapes"] = [w["window"]]
        rng = no_update if trig == ids.TL_RANGE else [lo, hi]  # the slider is where it was moved to
        return w["gantt"], w["overlap"], shade, w["stats"], w["gaps"], rng, str(lo), str(hi)

    @app.callback(Output(ids.TL_OVERVIEW, "figure", allow_duplicate=True), Input(ids.TL_OUTLIERS, "value"),
                  prevent_initial_call=True)
    @_safe(lambda m: no_update)
    def outliers(value: object) -> Any:
        show = isinstance(value, list) and "all" in value
        patch = dash.Patch()
        if show:
            patch["layout"]["yaxis"]["autorange"] = True
        else:
            top, _ = models.robust_range(d.source("a").columns())
            patch["layout"]["yaxis"]["autorange"] = False
            patch["layout"]["yaxis"]["range"] = [0, top]
        return patch

    # In the browser: a click on a Gantt bar or an overlap point opens its step without a round trip (Dash would
    # also call a server callback once for nothing when the timeline appears). The step page checks the number.
    app.clientside_callback(OPEN_STEP_JS, Output("url", "pathname"), Output("url", "search"),
                            Input("tl-gantt", "clickData"), Input("tl-overlap", "clickData"), prevent_initial_call=True)

    @app.callback(Output("step-cell", "children"), Input("step-heatmap", "clickData"), State("step-index", "data"),
                  prevent_initial_call=True)
    @_safe(lambda m: html.Div(m, className="cell-detail"))
    def cell(click: object, where: object) -> Any:
        if not isinstance(where, dict):
            raise InputError("malformed step reference")
        src = d.source(str(where.get("trace")))
        i = _int(where.get("step"), "step", 0, max(0, src.last_index()))
        if not src.has(i):
            raise InputError(f"no step {i} (the trace has {src.steps_text()})")
        if not isinstance(click, dict) or not isinstance(click.get("points"), list) or not click["points"]:
            raise InputError("malformed click")
        p = click["points"][0]
        row, col = _int(p.get("y"), "row"), _int(p.get("x"), "column")
        return pages.cell_detail(views.page_grid(src.step(i)), row, col)

    violations.register(app, d.source, _safe)
