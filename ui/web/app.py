"""The dashboard app factory: `create_app(trace, compare=None)` opens the named traces, lays out the shell every
page shares (header, live poll, recording banner) and registers each page module's callbacks (routes.PAGE_MODULES).

Callbacks only validate their inputs and call the page / figure / view-model functions; anything that goes
wrong inside one becomes a one-line message on the page (and on stderr), never a traceback in the browser.
Every callback is a plain module-level function: Dash calls it, and so can a test (inside the app's context).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import dash
from dash import Dash, Input, Output, dcc, html, no_update
from specscope.tracer.errors import TraceError

from . import ids, pages, scripts
from .dashboard import Dashboard, current, log, safe, trigger_id
from .routes import PAGE_MODULES, step_href

_HERE = os.path.dirname(os.path.abspath(__file__))
# Dash serves its assets folder from disk; point it at a folder that does not exist, so no request path is ever
# joined to a directory of ours. The page's CSS and key handling are inline in the index page below.
_NO_ASSETS = os.path.join(_HERE, "_no_assets_")

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#222;background:#fafafa}
header{display:flex;gap:18px;align-items:center;padding:8px 16px;background:#263238;color:#fff}
header a{color:#cfd8dc;text-decoration:none;font-weight:600} header a:hover{color:#fff}
header .title{font-weight:700;margin-right:12px} #@LIVE_STATUS{margin-left:auto;font-size:13px;color:#b0bec5}
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
.viol-group li{font-size:13px;margin:2px 0} #@STEP_VIOLATIONS{font-size:13px;padding-left:22px;margin:4px 0}
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
""".replace("@LIVE_STATUS", ids.LIVE_STATUS).replace("@STEP_VIOLATIONS", ids.STEP_VIOLATIONS)

# Arrow keys step through the explorer and n / N walk its violations, by clicking the page's links (ignored while
# typing in a field).
KEYS_JS = """
document.addEventListener('keydown', function (e) {
  var t = e.target; if (t && (t.tagName === 'INPUT' || t.tagName === 'TEXTAREA' || t.isContentEditable)) return;
  if (e.altKey || e.ctrlKey || e.metaKey) return;
  var id = {ArrowLeft: '@PREV', '[': '@PREV', ArrowRight: '@NEXT', ']': '@NEXT',
            n: '@VNEXT', N: '@VPREV'}[e.key] || null;
  if (!id) return; var a = document.getElementById(id);
  if (a && !a.classList.contains('disabled')) { e.preventDefault(); a.click(); }
});
"""
for _mark, _id in (("@PREV", ids.STEP_PREV), ("@NEXT", ids.STEP_NEXT), ("@VNEXT", ids.VIOL_NEXT),
                  ("@VPREV", ids.VIOL_PREV)):
    KEYS_JS = KEYS_JS.replace(_mark, _id)


def _index(head: str) -> str:
    return ("""<!DOCTYPE html>
<html><head>{%metas%}<title>{%title%}</title>{%favicon%}{%css%}""" + head + "<style>" + CSS + """</style></head>
<body>{%app_entry%}<footer>{%config%}{%scripts%}{%renderer%}</footer>
<script>""" + KEYS_JS + """</script></body></html>""")


def _nav(d: Dashboard) -> html.Header:
    links = [dcc.Link("Timeline", href="/", id=ids.NAV_TIMELINE),
             dcc.Link("Acceptance", href="/acceptance", id=ids.NAV_ACCEPTANCE),
             dcc.Link("Violations", href="/violations", id=ids.NAV_VIOLATIONS)]
    if "b" in d.sources:
        links.append(dcc.Link("Compare", href="/compare", id=ids.NAV_COMPARE))
    a = d.sources["a"]
    return html.Header([html.Span("specscope", className="title"), *links,
                        dcc.Link(f"step {a.first_index()} of {os.path.basename(a.name)}",
                                 href=step_href(a.first_index()), id=ids.NAV_STEP),
                        html.Span(live_text(d), id=ids.LIVE_STATUS)])


def live_text(d: Dashboard) -> str:
    """The header's line: each trace's step count, whether it is live, how far its summaries loaded."""
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
    plotly.js served (default: scripts.choose_bundle(), the partial bundle). `dashboard.of(app)` is its
    `Dashboard`.

    Raises TraceError when a trace cannot be read."""
    import flask

    d = Dashboard(trace, compare_with)
    bundle = d.plotly = plotly or scripts.choose_bundle()
    # Our own Flask server: no static folder (Flask's /static route would map request paths to files), and an
    # explicit root path (Flask cannot infer one for a module of the `specscope` namespace package).
    server = flask.Flask("specscope_web", root_path=_HERE, instance_path=_NO_ASSETS, static_folder=None)
    d.install(server)
    app = Dash(
        "specscope_web", server=server,  # type: ignore[arg-type]  # Dash documents a Flask instance; its hint omits it
        title="specscope", assets_folder=_NO_ASSETS, include_assets_files=False,
        suppress_callback_exceptions=True, index_string=_index(scripts.preload_links(bundle.url)),
        update_title=None,  # type: ignore[arg-type]  # Dash documents None (keep the title); its hint says str
        serve_locally=True, enable_mcp=False, use_pages=False,
        eager_loading=False,  # Dash's async bundles on demand; plotly.js is ours (scripts.py)
        hooks={"layout_pre": scripts.layout_pre_hook(bundle.url)},
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
        children = None if route is None else safe(pages.error_panel)(d.page)(*route)
        return html.Div([
            dcc.Location(id=ids.URL, refresh=False, **where),
            dcc.Interval(id=ids.LIVE, interval=live_interval_ms, disabled=not poll),
            dcc.Store(id=ids.VERSION, data=version),
            _nav(d),
            html.Div(pages.recording_banner(d.sources), id=ids.RECORDING_NOTES),
            html.Main(html.Div(children, id=ids.PAGE)),
        ])

    app.layout = layout
    app.server.register_error_handler(Exception, _http_error)
    register(app)
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
    log(f"{request.method} {request.path[:80]}: {type(e).__name__}: {str(e)[:200]}")
    return "specscope web: the request failed (see the server's stderr)\n", 500, {"Content-Type": "text/plain"}


@safe(pages.error_panel)
def render(pathname: object, search: object, version: object, *, trigger: str | None = None) -> Any:
    """The page at the address the browser moved to, or the page shown again when a live trace grew (`version`;
    `trigger`: which of them fired, for a direct call). A step already shown does not change as a trace grows."""
    if trigger_id(trigger) == ids.VERSION and isinstance(pathname, str) and pathname.startswith("/step/"):
        raise dash.exceptions.PreventUpdate
    return current().page(pathname, search)


def poll(intervals: object) -> tuple[Any, Any, Any, Any]:
    """The live poll: load what the traces gained; the version (when they grew), the header's line, whether to
    stop polling, and the recording banner (a live recording's problems grow)."""
    d = current()
    try:
        grew = d.refresh()
    except TraceError as e:
        return no_update, f"cannot read the trace: {e}", True, no_update
    notes = pages.recording_banner(d.sources) if grew else no_update
    return (d.version if grew else no_update), live_text(d), not d.needs_poll(), notes


def register(app: Dash) -> None:
    """The shell's callbacks and every page module's, on `app`."""
    app.callback(Output(ids.PAGE, "children"), Input(ids.URL, "pathname"), Input(ids.URL, "search"),
                 Input(ids.VERSION, "data"), prevent_initial_call=True)(render)
    app.callback(Output(ids.VERSION, "data"), Output(ids.LIVE_STATUS, "children"), Output(ids.LIVE, "disabled"),
                 Output(ids.RECORDING_NOTES, "children"), Input(ids.LIVE, "n_intervals"),
                 prevent_initial_call=True)(poll)
    for module in dict.fromkeys(PAGE_MODULES.values()):
        importlib.import_module(f"{__package__}.{module}").register(app)
