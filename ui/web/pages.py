"""Building blocks every page module uses: tables, graphs, the error panel and the banners of a trace still loading
or of a recording that could not record everything. No callbacks, no page of its own (those are the page modules
routes.PAGE_MODULES lists)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TypedDict

from dash import dcc, html
from dash.development.base_component import Component
from specscope.ui import views

from . import figures, ids
from .source import TraceSource

GRAPH_CONFIG: dcc.Graph.Config = {"displaylogo": False, "responsive": True}
BOX = {"width": "90px"}  # a number box
Cell = str | int | float | Component | None  # what a table cell (a Dash child) can hold


class _IdProp(TypedDict, total=False):
    id: str


def id_prop(id: str | None) -> _IdProp:
    """`{"id": id}`, or no `id` prop at all without an id (an explicit None would still reach the browser)."""
    return {"id": id} if id else {}


def table(header: Sequence[str], rows: Sequence[Sequence[Cell]], *, id: str | None = None,
          highlight: int | None = None, cls: str = "") -> html.Table:
    """A plain HTML table; row `highlight` gets the highlight class."""
    head = html.Thead(html.Tr([html.Th(h) for h in header]))
    body = html.Tbody([html.Tr([html.Td(c) for c in r], className="hl" if i == highlight else "")
                       for i, r in enumerate(rows)])
    return html.Table([head, body], className=f"tbl {cls}".strip(), **id_prop(id))


def text_table(header: Sequence[str], rows: Sequence[Sequence[object]], *, id: str | None = None,
               highlight: int | None = None) -> html.Pre:
    """A numeric table as aligned monospace text: one component instead of one per cell (a 64-row batch would
    otherwise cost the browser ~500 elements to build on every step); row `highlight` is marked."""
    cells = [[str(h) for h in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[j]) for r in cells if j < len(r)) for j in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=False)) for r in cells]
    if highlight is None or not 0 <= highlight < len(rows):
        return html.Pre("\n".join(lines) + "\n", className="text-table", **id_prop(id))
    k = highlight + 1
    return html.Pre(["\n".join(lines[:k]) + "\n", html.Span(lines[k], className="hl"),
                     "\n" + "\n".join(lines[k + 1:]) + "\n"], className="text-table", **id_prop(id))


def kv_table(rows: Sequence[tuple[str, str]], id: str | None = None) -> html.Table:
    """A two-column label/value table."""
    return html.Table(html.Tbody([html.Tr([html.Th(k), html.Td(v)]) for k, v in rows]), className="tbl kv",
                      **id_prop(id))


def error_panel(message: str) -> html.Div:
    """The page shown for a bad address or input: one line, no traceback."""
    return html.Div([html.H2("Cannot show this page"), html.P(message, id=ids.ERROR_MESSAGE),
                     dcc.Link("back to the timeline", href="/")], className="error-panel")


def graph(id: str, fig: figures.Figure | None) -> dcc.Graph:
    """A dcc.Graph with the dashboard's config."""
    return dcc.Graph(id=id, figure=fig, config=GRAPH_CONFIG)


def _ms(ns: int) -> str:
    return f"{ns / 1e6:,.2f} ms" if ns >= 1_000_000 else views.fmt_ns(ns)


def _fmt_share(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def ms(ns: int) -> str:
    """A duration for the stats tables (ms above a millisecond)."""
    return f"{ns / 1e6:,.2f} ms" if ns >= 1_000_000 else views.fmt_ns(ns)


def fmt_share(x: float | None) -> str:
    """A share as a percentage ("-" for none)."""
    return "-" if x is None else f"{100 * x:.1f}%"


def trace_name(src: TraceSource) -> str:
    """`A: run.db`: a trace as the pages that show both name it."""
    return f"{src.key.upper()}: {os.path.basename(src.name)}"


def loading_note(*sources: TraceSource) -> list[html.Div]:
    """A banner while some trace's summaries are still loading (the page refreshes itself when they are in)."""
    out = []
    for src in sources:
        err = src.load_error()
        if err:
            out.append(html.Div(f"{src.key.upper()}: step summaries stopped loading after {src.loaded_steps():,} of "
                                f"{src.num_steps():,} steps: {err}", className="banner", id=ids.loading(src.key)))
        elif src.loading():
            out.append(html.Div(f"{src.key.upper()}: step summaries of {src.loaded_steps():,} of {src.num_steps():,} "
                                "steps loaded so far; this page redraws when the rest is in",
                                className="banner", id=ids.loading(src.key)))
    return out


def recording_banner(sources: Mapping[str, TraceSource]) -> list[Component]:
    """What each trace says its recording could not record: a one-line summary that opens to the full text (one
    fact a line), for every page; nothing for a trace that recorded everything."""
    out: list[Component] = []
    for key, src in sources.items():
        notes = src.notes
        if not notes:
            continue
        who = f" ({key.upper()})" if len(sources) > 1 else ""
        out.append(html.Details([
            html.Summary(f"⚠ recording{who}: " + " · ".join(notes.parts())),
            html.Ul([html.Li(line) for line in notes.lines()]),
        ], className="banner notes", id=ids.recording_notes(key)))
    return out


