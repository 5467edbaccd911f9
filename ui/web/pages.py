"""Page layouts: Dash components built from the view models and figures. No callbacks here."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np
from dash import dcc, html
from dash.development.base_component import Component
from specscope.tracer.checks import BY_ID
from specscope.tracer.schema import ForwardMode, Step, Violation
from specscope.ui import views
from specscope.ui.recording_notes import replay_without_metadata

from . import figures, ids, models
from .routes import step_href
from .source import WAIT_S, Columns, TraceSource

if TYPE_CHECKING:
    from specscope.tracer.diff import Difference, DiffReport, StepDivergence

DEFAULT_WINDOW = 100  # steps in the timeline's first window
MAX_WINDOW = 300  # steps whose spans one Gantt shows; a wider window is drawn per bin of steps
WINDOW_BINS = 200  # bins of a window wider than MAX_WINDOW
GRAPH_CONFIG: dcc.Graph.Config = {"displaylogo": False, "responsive": True}
MAX_HTML_ROWS = 16  # request tables of bigger batches are aligned text (the browser builds 1 element, not 650)
MAX_CHAINS = 16  # draft chains drawn as token chips (the highlighted row's too); the request table has them all

_BOX = {"width": "90px"}  # a step-number box
Cell = str | int | float | Component | None  # what a table cell (a Dash child) can hold


class _IdProp(TypedDict, total=False):
    id: str


def _id(id: str | None) -> _IdProp:
    # No `id` prop at all without an id: an explicit None would still be sent to the browser as a null prop.
    return {"id": id} if id else {}


def table(header: Sequence[str], rows: Sequence[Sequence[Cell]], *, id: str | None = None,
          highlight: int | None = None, cls: str = "") -> html.Table:
    """A plain HTML table; row `highlight` gets the highlight class."""
    head = html.Thead(html.Tr([html.Th(h) for h in header]))
    body = html.Tbody([html.Tr([html.Td(c) for c in r], className="hl" if i == highlight else "")
                       for i, r in enumerate(rows)])
    return html.Table([head, body], className=f"tbl {cls}".strip(), **_id(id))


def text_table(header: Sequence[str], rows: Sequence[Sequence[object]], *, id: str | None = None,
               highlight: int | None = None) -> html.Pre:
    """A numeric table as aligned monospace text: one component instead of one per cell (a 64-row batch would
    otherwise cost the browser ~500 elements to build on every step); row `highlight` is marked."""
    cells = [[str(h) for h in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[j]) for r in cells if j < len(r)) for j in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=False)) for r in cells]
    if highlight is None or not 0 <= highlight < len(rows):
        return html.Pre("\n".join(lines) + "\n", className="text-table", **_id(id))
    k = highlight + 1
    return html.Pre(["\n".join(lines[:k]) + "\n", html.Span(lines[k], className="hl"),
                     "\n" + "\n".join(lines[k + 1:]) + "\n"], className="text-table", **_id(id))


def kv_table(rows: Sequence[tuple[str, str]], id: str | None = None) -> html.Table:
    """A two-column label/value table."""
    return html.Table(html.Tbody([html.Tr([html.Th(k), html.Td(v)]) for k, v in rows]), className="tbl kv",
                      **_id(id))


def error_panel(message: str) -> html.Div:
    """The page shown for a bad address or input: one line, no traceback."""
    return html.Div([html.H2("Cannot show this page"), html.P(message, id="error-message"),
                     dcc.Link("back to the timeline", href="/")], className="error-panel")


def graph(id: str, fig: figures.Figure | None) -> dcc.Graph:
    """A dcc.Graph with the dashboard's config."""
    return dcc.Graph(id=id, figure=fig, config=GRAPH_CONFIG)


def _ms(ns: int) -> str:
    return f"{ns / 1e6:,.2f} ms" if ns >= 1_000_000 else views.fmt_ns(ns)


def _fmt_share(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


# -- timeline ------------------------------------------------------------------------------------------------


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


def loading_note(*sources: TraceSource) -> list[html.Div]:
    """A banner while some trace's summaries are still loading (the page refreshes itself when they are in)."""
    out = []
    for src in sources:
        err = src.load_error()
        if err:
            out.append(html.Div(f"{src.key.upper()}: step summaries stopped loading after {src.loaded_steps():,} of "
                                f"{src.num_steps():,} steps: {err}", className="banner", id=f"loading-{src.key}"))
        elif src.loading():
            out.append(html.Div(f"{src.key.upper()}: step summaries of {src.loaded_steps():,} of {src.num_steps():,} "
                                "steps loaded so far; this page redraws when the rest is in",
                                className="banner", id=f"loading-{src.key}"))
    return out


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
                 ("plan stream busy", _ms(int(sb.busy_ns[plan].sum()))),
                 ("compute busy", _ms(int(sb.busy_ns[comp].sum()))),
                 ("plan hidden under compute, idle gaps", f"per step, for windows of at most {MAX_WINDOW} steps")]
        return {"gantt": figures.stream_bins_figure(sb), "overlap": figures.plan_bins_figure(sb),
                "overview": overview_fig, "window": figures.window_shape((lo, hi)),
                "stats": kv_table(stats, id="tl-window-stats"),
                "gaps": html.P(f"idle gaps are listed for windows of at most {MAX_WINDOW} steps", className="muted")}
    spans = src.spans(lo, hi)
    rows, gaps = models.step_streams(spans)
    tot = models.stream_totals(rows, gaps)
    stats = [
        ("window", f"steps {lo}–{hi - 1}"),
        ("plan hidden under compute", _fmt_share(tot["plan_hidden_share"])),
        ("compute busy", _ms(int(tot["compute_ns"]))),
        ("GPU idle gaps", f"{tot['gaps']} gaps, {_ms(int(tot['idle_ns']))} "
                          f"({_fmt_share(tot['idle_share'])} of compute time)"),
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
        "stats": kv_table(stats, id="tl-window-stats"),
        "gaps": table(["largest idle gaps (steps)", "idle"], gap_rows) if gap_rows else html.P("no compute idle gaps"),
    }


def timeline_page(src: TraceSource) -> html.Div:
    """Timeline: overview of every step (binned), a step-range slider, the Gantt and overlap of the window."""
    n = src.num_steps()
    if n == 0:
        return html.Div([html.H2("Timeline"), html.P("the trace has no steps yet", id="tl-empty")])
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
            dcc.Input(id=ids.TL_FROM, type="text", inputMode="numeric", value=str(lo), n_submit=0, style=_BOX),
            html.Span("to"),
            dcc.Input(id=ids.TL_TO, type="text", inputMode="numeric", value=str(max(lo, hi - 1)), n_submit=0,
                      style=_BOX),
            html.Span("(Enter applies; any width: wider than 300 steps is drawn per bin)", className="muted"),
        ], className="range-boxes"),
        html.Div(w["stats"], id="tl-stats"),
        graph("tl-gantt", w["gantt"]),
        graph("tl-overlap", w["overlap"]),
        html.Div(w["gaps"], id="tl-gaps"),
    ], id="timeline-page")


def _trace_line(src: TraceSource) -> str:
    run = src.run
    live = "live" if src.is_live() else src.end_state().label
    return (f"{os.path.basename(src.name)} · {src.num_steps()} steps{_of_steps(src)} ({live}) · {run.device} · "
            f"kernel {run.attention_kernel} · target {run.target_model} · draft {run.draft_model or '-'}")


def _of_steps(src: TraceSource) -> str:
    """` (steps 2, 5, 30–59)` for a trace whose indexes do not run 0..n-1 (a bundle's), else nothing."""
    return "" if src.positions.dense else f" ({src.steps_text()})"


# -- step explorer -------------------------------------------------------------------------------------------


def _draft_chain(step: Step, reqs: Sequence[views.RequestView], fmt: Callable[[Sequence[int]], str],
                 highlight: int | None) -> Component:
    if step.mode != ForwardMode.TARGET_VERIFY:
        return html.P(f"{step.mode.value}: no draft chain (drafts are verified in TARGET_VERIFY steps)",
                      className="muted")
    blocks: list[Component] = []
    shown = [r for k, r in enumerate(reqs) if k < MAX_CHAINS or r.row == highlight]
    for r in shown:
        chips = [html.Span("root", className="tok root")]
        for j, (t, ok) in enumerate(zip(r.draft_tokens, r.draft_accepted, strict=False)):
            chips.append(html.Span(fmt([t]), className="tok " + ("acc" if ok else "rej"),
                                   title=f"draft {j}: token {t} {'accepted' if ok else 'rejected'}"))
        if r.bonus is not None:
            chips.append(html.Span(fmt([r.bonus]), className="tok bonus",
                                   title=f"bonus token {r.bonus} (from the target)"))
        blocks.append(html.Div([html.Span(f"r{r.request_id}", className="chain-label"), *chips,
                                html.Span(f"accept length {r.accept_length}", className="muted")],
                               className="chain" + (" hl" if r.row == highlight else "")))
    if len(shown) < len(reqs):
        blocks.append(html.P(f"… {len(reqs) - len(shown)} more rows: their drafts and accepted tokens are in the "
                             "request table", className="muted"))
    return html.Div(blocks, id="draft-chain")


def highlight_row(step: Step, params: dict[str, int | str]) -> int | None:
    """The batch row a step URL asks to highlight (by `row`, or by `request`)."""
    if "row" in params:
        return int(params["row"])
    if "request" in params:
        for b, r in enumerate(step.requests):
            if r.request_id == params["request"]:
                return b
    return None


_PREFIX = re.compile(r"^step \d+ \([^)]*\)\s*(?::\s*)?")


def short_message(v: Violation) -> str:
    """A violation's message without its `step N (model MODE, graph, bs a/b)` prefix (the page's header says it)."""
    return _PREFIX.sub("", v.message, count=1)


def current_violation(found: Sequence[Violation], params: dict[str, int | str]) -> int | None:
    """Which of the step's violations the address points at: `v=K`, else the first of invariant `check` (at the
    `row` / `col` given), else none."""
    if "v" in params:
        k = int(params["v"])
        return k if 0 <= k < len(found) else None
    if "check" in params:
        hits = [k for k, v in enumerate(found) if v.check_id == params["check"]]
        exact = [k for k in hits if ("row" not in params or found[k].row == params["row"])
                 and ("col" not in params or found[k].col == params["col"])]
        return (exact or hits)[0] if hits else None
    return None


def violation_href(src: TraceSource, v: Violation, k: int, request_row: int | None = None) -> str:
    """The step page of violation `k` of its step, its cell marked (`v=`, plus `check=&row=&col=` for a reader)."""
    q = models.violation_target(v, None)
    if request_row is not None and "row" not in q:
        q["row"] = request_row
    return step_href(v.step, src.key, v=k, **q)


def violation_walk(src: TraceSource, i: int, found: Sequence[Violation], cur: int | None,
                   forward: bool) -> str | None:
    """The address `n` (forward) or `N` opens: the next / previous violation of this step, then the first / last
    one of the nearest step with violations; None when there is none."""
    if found:
        if cur is None and forward:
            return violation_href(src, found[0], 0)
        if cur is not None and 0 <= cur + (1 if forward else -1) < len(found):
            k = cur + (1 if forward else -1)
            return violation_href(src, found[k], k)
        if cur is None and not forward:
            pass  # before the first violation of this step: the step before
    j = src.violation_step(i, forward)
    if j is None:
        return None
    there = src.step_violations(j)
    if not there:
        return step_href(j, src.key)
    k = 0 if forward else len(there) - 1
    return violation_href(src, there[k], k)


def marked_kv_table(rows: Sequence[tuple[str, str]], marks: Mapping[str, Sequence[views.CellMark]],
                    id: str | None = None) -> html.Table:
    """The detail panel: a marked row carries its marks as text beside the value (`✗ I6: 4, expected 2`)."""
    body = []
    for k, v in rows:
        mk = marks.get(k)
        if mk:
            cls = "mk rel" if all(m.is_related for m in mk) else "mk"
            body.append(html.Tr([html.Th(k), html.Td([v, " ", html.Span(models.mark_text(mk), className=cls)])],
                                className="marked"))
        else:
            body.append(html.Tr([html.Th(k), html.Td(v)]))
    return html.Table(html.Tbody(body), className="tbl kv", **_id(id))


def marked_text_table(header: Sequence[str], rows: Sequence[Sequence[object]], marks: Mapping[int, str], *,
                      cells: Mapping[tuple[int, int], bool] | None = None, id: str | None = None,
                      highlight: int | None = None) -> html.Pre:
    """`text_table` with a last `marks` column (the marks of each row as text) and its marked cells boxed
    (`cells`: (row, column) -> is the related side)."""
    cells = cells or {}
    head = [*header, "marks"] if marks else list(header)
    table_rows = [[*map(str, r), marks.get(k, "")] if marks else list(map(str, r)) for k, r in enumerate(rows)]
    grid = [[str(h) for h in head]] + table_rows
    widths = [max(len(r[j]) for r in grid if j < len(r)) for j in range(len(head))]
    out: list[Component | str] = []
    text: list[str] = []
    for k, r in enumerate(grid):
        row_cls = "hl" if highlight is not None and k == highlight + 1 else ("mkrow" if k and marks.get(k - 1)
                                                                             else None)
        parts: list[Component | str] = []
        for j, (c, w) in enumerate(zip(r, widths, strict=False)):
            cell = (c.ljust(w) if j == len(head) - 1 and marks else c.rjust(w))
            sep = "  " if j else ""
            rel = cells.get((k - 1, j))
            if rel is not None:
                parts += [sep, html.Span(cell, className="mkcell rel" if rel else "mkcell")]
            else:
                parts.append(sep + cell)
        if row_cls is None and all(isinstance(p, str) for p in parts):
            text.append("".join(p for p in parts if isinstance(p, str)) + "\n")
            continue
        if text:
            out.append("".join(text))
            text = []
        out.append(html.Span([*parts, "\n"], className=row_cls or ""))
    if text:
        out.append("".join(text))
    return html.Pre(out, className="text-table", **_id(id))


MAX_LISTED = 16  # violations (and marks) of a step drawn as elements; the rest of them as one text block


def _violation_line(v: Violation, k: int | None = None) -> tuple[str, str, str]:
    """(what, message, related) of one violation: the cell with found vs expected, the message without its step
    prefix, and the related cells with their values."""
    cells = [views.cell_name(c.array, c.row, c.col) + ("" if c.value is None else f" = {c.value}")
             + ("" if c.step is None or c.step == v.step else f" (step {c.step})") for c in v.related]
    what = ""
    if v.array is not None:
        what = f"{views.cell_name(v.array, v.row, v.col)}: found {v.found}" + (
            "" if v.expected is None else f", expected {v.expected}")
    return what, short_message(v), "; ".join(cells)


def _violation_list(src: TraceSource, found: Sequence[Violation], cur: int | None,
                    rows_of: Mapping[int, int]) -> Component:
    """The step's violations, every one in full: MAX_LISTED of them (those around the current one) as links, the
    others as one block of text (a systematic bug at bs 64 gives a step hundreds, and an element each would cost
    the browser more than the rest of the page; `n` / `N` open each of them marked)."""
    if not found:
        return html.P("no violations at this step", id=ids.STEP_VIOLATIONS, className="muted")
    lo = 0 if cur is None else max(0, min(cur - MAX_LISTED // 2, len(found) - MAX_LISTED))
    hi = min(len(found), lo + MAX_LISTED)
    items = []
    for k in range(lo, hi):
        v = found[k]
        what, message, related = _violation_line(v)
        items.append(html.Li([
            dcc.Link(f"{v.check_id}", href=violation_href(src, v, k, rows_of.get(v.request_id or -1)),
                     className="viol-link"),
            html.Span(f" [{v.severity.value}] ", className="sev-" + v.severity.value),
            html.B(what) if what else "", " — " if what else "", message,
            *([html.Span(" · related: " + related, className="muted")] if related else []),
        ], className="cur" if k == cur else "", value=str(k + 1)))
    listed = html.Ol(items, id=ids.STEP_VIOLATIONS, className="viol-list", start=str(lo + 1))
    if hi - lo == len(found):
        return listed

    def line(k: int) -> str:
        what, message, related = _violation_line(found[k])
        return (f"{k + 1:>4}. {found[k].check_id} [{found[k].severity.value}] " + (f"{what} — " if what else "")
                + message + (f" · related: {related}" if related else ""))

    rest = [line(k) for k in range(len(found)) if not lo <= k < hi]
    return html.Div([
        listed,
        html.Details([html.Summary(f"the other {len(rest)} of this step's {len(found)} violations (n / N walk "
                                   "them, each opened with its cell marked)"),
                      html.Pre("\n".join(rest) + "\n", className="text-table viol-rest")],
                     id="step-violations-rest", open=len(rest) <= 4 * MAX_LISTED),
    ])


def _marks_table(marks: Sequence[views.CellMark]) -> Component:
    rows = [(m.check_id, views.cell_name(m.array, m.row, m.col), m.found or "-",
             "-" if m.expected is None else m.expected, "related" if m.is_related else "wrong value") for m in marks]
    head = ["check", "cell", "found", "expected", ""]
    if len(rows) > MAX_LISTED:  # aligned text: one element, not six per mark
        return text_table(head, rows, id=ids.STEP_MARKS)
    return table(head, rows, id=ids.STEP_MARKS, cls="marks")


# The step detail's scalar rows: label -> the recorded scalar's name.
_DETAIL_SCALARS = {"max_seq_len_q": "max_seq_len_q", "kernel q_len": "kernel_q_len", "max_seq_len_k": "max_seq_len_k"}


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
        ], className="banner notes", id=f"recording-notes-{key}"))
    return out


def step_page(src: TraceSource, i: int, params: dict[str, int | str]) -> html.Div:
    """Step explorer: the step's violations first, then each value they name marked where the page shows it
    (detail, seqlens, page table, request rows), then the detail, requests, page table and draft chain."""
    n = src.num_steps()
    step = src.step(i)
    key = src.key
    fmt = views.token_formatter(src.run)
    cap = src.capture_of(i)
    spans = [(s.stream, s.name, s.start_ns, s.end_ns) for s in step.spans]
    detail = views.step_detail(step, capture=cap, kernel=src.run.attention_kernel, spans=spans)
    reqs = views.request_views(step, fmt)
    found = src.step_violations(i)
    cur = current_violation(found, params)
    marks = views.step_marks(found, step)
    rows_of = {r.request_id: r.row for r in reqs}
    # A violation that names no cell but a request marks that request's row.
    for v in found:
        if v.array is None and v.request_id in rows_of:
            marks.append(views.CellMark(v.check_id, v.severity.value, "request", rows_of[v.request_id], None, None,
                                        None, False, v.message))
    where = models.mark_index(marks, step)
    for name, mk in where.scalars.items():  # scalars the detail has no row for are listed in it
        detail.append((name, _scalar_value(step, name)))
        where.detail[name] = mk
    notes = src.notes
    no_md = replay_without_metadata(notes, step.graph.value, [a.name for a in step.arrays], list(step.scalars))
    not_recorded = f"not recorded ({notes.replay_reason()})"
    # The graph computed a replay's metadata where Python never sees it; a field the backend does not have is
    # recorded absent. Either says so in place of a "-" that reads like a lost value.
    for k, (label, value) in enumerate(detail):
        if value == "-" and label in _DETAIL_SCALARS:
            if no_md and label in ("max_seq_len_q", "kernel q_len", "max_seq_len_k"):
                detail[k] = (label, not_recorded)
            elif notes.is_absent(_DETAIL_SCALARS[label]):
                detail[k] = (label, "(absent in this backend)")
    hl = highlight_row(step, params)
    cur_v = found[cur] if cur is not None else None
    if cur_v is not None and cur_v.row is not None and hl is None:
        hl = cur_v.row
    # A column is a logical page only for the page-table arrays; other arrays' cells highlight the whole row.
    col_param = params.get("col") if params.get("array") in (None, *models.GRID_ARRAYS) else None
    col = None if col_param is None else int(col_param)  # the route parsed it as an int already
    if cur_v is not None and cur_v.array in models.GRID_ARRAYS and cur_v.col is not None and col is None:
        col = cur_v.col
    grid = views.page_grid(step)
    # Neighbours by position: a bundle keeps the original run's step numbers, so the step before 30 can be 11.
    prev, nxt = src.neighbour(i, -1), src.neighbour(i, 1)
    pos = f"step {i} of {n}" if src.positions.dense else f"step {i} ({src.position(i) + 1} of {n})"
    v_prev, v_next = violation_walk(src, i, found, cur, False), violation_walk(src, i, found, cur, True)
    nav = html.Div([
        dcc.Link("◀ prev", id=ids.STEP_PREV, href=step_href(prev, key), className="btn"
                 + (" disabled" if prev >= i else "")),
        html.Span(pos, id="step-pos"),
        dcc.Link("next ▶", id=ids.STEP_NEXT, href=step_href(nxt, key), className="btn"
                 + (" disabled" if nxt <= i else "")),
        dcc.Link("◀ N violation", id=ids.VIOL_PREV, href=v_prev or step_href(i, key),
                 className="btn" + ("" if v_prev else " disabled")),
        dcc.Link("violation n ▶", id=ids.VIOL_NEXT, href=v_next or step_href(i, key),
                 className="btn" + ("" if v_next else " disabled")),
        html.Span(views.step_label(step), className="step-label"),
        *([dcc.Link(f"capture step {cap}", href=step_href(cap, key), className="btn")] if cap not in (None, i) else []),
        html.Span("keys: ← → step · n N violation", className="muted"),
    ], className="step-nav")
    banner = []
    if "check" in params or cur_v is not None:
        cid = str(params.get("check", cur_v.check_id if cur_v else ""))
        inv = BY_ID.get(cid)
        at = "" if hl is None else f" · row {hl}" + ("" if col is None else f", logical page {col}")
        num = "" if cur is None else f" ({cur + 1} of {len(found)} at this step)"
        banner.append(html.Div(f"Violation {cid}{num}{at}: {inv.description if inv else ''}",
                               className="banner", id="violation-banner"))
    big = len(reqs) > MAX_HTML_ROWS
    req_rows = [(r.row, r.request_id, r.slot, r.seq_len_before, r.seq_len_after, r.num_q_tokens,
                 r.accept_length if step.mode == ForwardMode.TARGET_VERIFY else "-", r.draft_text or "-",
                 r.accepted_text or "-") for r in reqs]
    req_head = ["row", "request", "slot", "S before", "S after", "q tokens", "accept", "drafts", "accepted"]
    req_marks = {b: models.mark_text(mk, with_cell=True) for b, mk in where.requests.items()}
    req_cells = {(m.row, models.REQUEST_COLUMNS[m.array]): m.is_related for mk in where.requests.values()
                 for m in mk if m.array in models.REQUEST_COLUMNS and m.row is not None}
    req_table: Component
    if big:  # a big batch as aligned text: one element, not ten per row
        req_table = marked_text_table(req_head, [[_one_line(c) for c in r] for r in req_rows], req_marks,
                                      cells=req_cells, id="request-table", highlight=hl)
    else:
        head = [*req_head, "marks"] if req_marks else req_head
        body = [[*r, req_marks.get(b, "")] if req_marks else r for b, r in enumerate(req_rows)]
        req_table = table(head, body, id="request-table", highlight=hl)
    if grid is not None:
        heat = graph(ids.STEP_HEATMAP, figures.heatmap_figure(grid, None if hl is None else (hl, col), where.grid))
        legend = html.Div([html.Span(f"{views.SYMBOLS[k] if views.SYMBOLS[k].strip() else '□'} {views.KIND_TEXT[k]}"
                                     f" ({grid.counts.get(k, 0)})", className="chip",
                                     style={"background": figures.KIND_COLORS[k],
                                            "color": "#fff" if k in figures.DARK_KINDS else "#000"})
                           for k in views.CellKind] + ([html.Span("▭ marked by a violation (found vs expected in "
                                                                  "the table above)", className="chip mkchip")]
                                                       if where.grid else []),
                          className="legend")
        seq_rows: list[Sequence[object]] = []
        for b in range(len(grid.cells)):
            seq_rows.append((b, grid.row_labels[b], _at(grid.cache_seqlens, b), _at(grid.cu_seqlens_q, b),
                             _at(grid.cu_seqlens_k, b), _arr_at(step, "seq_lens", b),
                             _arr_at(step, "req_pool_indices", b)))
        seq_rows.append(("end", "", "", _at(grid.cu_seqlens_q, len(grid.cells)), _at(grid.cu_seqlens_k,
                                                                                      len(grid.cells)), "", ""))
        seq_marks: dict[int, list[views.CellMark]] = {}
        for (r, _c), mk in where.seqlens.items():
            seq_marks.setdefault(r, []).extend(mk)
        seqs: Component = marked_text_table(
            ["row", "", "cache_seqlens", "cu_seqlens_q", "cu_seqlens_k", "seq_lens", "req_pool_indices"], seq_rows,
            {r: models.mark_text(mk, with_cell=True) for r, mk in seq_marks.items()},
            cells={rc: all(m.is_related for m in mk) for rc, mk in where.seqlens.items()}, id="seqlens-table",
            highlight=hl)
        grid_block = [heat, legend, html.Div("click a cell for its details", id=ids.STEP_CELL, className="cell-detail")]
    else:
        if no_md:
            grid_block = [html.P(f"{not_recorded}: page table, cache_seqlens, cu_seqlens (the step's header, "
                                 "requests and spans are recorded)", className="muted", id="step-not-recorded")]
            seqs = html.P(f"{not_recorded}: cache_seqlens, cu_seqlens", className="muted")
        else:
            grid_block = [html.P("this step recorded no page table", className="muted")]
            seqs = html.P("no seqlens recorded", className="muted")
    extra: list[Component] = []
    if step.errors:
        extra.append(table(["call", "error", "message"], [(e.call, e.error_type, e.message) for e in step.errors]))
    if step.waits:
        extra.append(table(["stream", "waited on"], [(w.stream, f"{w.on_stream}:{w.on_span}") for w in step.waits]))
    chain = _draft_chain(step, reqs, fmt, hl)
    return html.Div([
        dcc.Store(id=ids.STEP_INDEX, data={"trace": key, "step": i}),
        nav, *banner,
        html.Div([
            html.Div([html.H3(f"Violations ({len(found)})"), _violation_list(src, found, cur, rows_of), *extra],
                     className="col"),
            *([html.Div([html.H3("Marked values"), _marks_table(marks)], className="col")] if marks else []),
        ], className="row"),
        html.Div([
            html.Div([html.H3("Step"), marked_kv_table(detail, where.detail, id=ids.STEP_DETAIL)],
                     className="col narrow"),
            html.Div([html.H3("cache_seqlens and cu_seqlens"), seqs], className="col"),
        ], className="row"),
        html.H3("Page table"), *grid_block,
        html.H3(f"Requests ({len(reqs)})"), req_table,
        html.Details([html.Summary("Draft chain"), chain], open=not big, className="chain-block"),
    ], id="step-page")


def _scalar_value(step: Step, name: str) -> str:
    v = step.scalars.get(name)
    if v is None:
        v = getattr(step, name, None)
    return "-" if v is None else str(v)


def _one_line(x: object) -> str:
    return " ".join(str(x).split()) or "-"  # token text may hold newlines; a text table row must not


def _at(xs: Sequence[int], i: int) -> int | str:
    return xs[i] if 0 <= i < len(xs) else "-"


def _arr_at(step: Step, name: str, i: int) -> int | str:
    a = step.array(name)
    if a is None:
        return "-"
    flat = a.values.reshape(-1)
    return int(flat[i]) if i < len(flat) else "-"


def cell_detail(grid: views.PageGrid | None, row: int, col: int) -> html.Div:
    """The details of one heatmap cell."""
    cell = None if grid is None else grid.cell(row, col)
    if grid is None or cell is None:
        return html.Div(f"no page-table cell at row {row}, page {col}", className="cell-detail")
    rows = [
        ("cell", f"row {cell.row} ({grid.row_labels[cell.row]}), logical page {cell.col}"),
        ("physical page", str(cell.page)),
        ("kind", views.KIND_TEXT[cell.kind]),
        ("tokens", f"{cell.token_start}–{cell.token_end}"),
        ("owner", "padded row" if cell.owner is None else f"request {cell.owner}"),
        ("req_to_token gives", "-" if cell.expected_page is None else str(cell.expected_page)),
        ("shared with", ", ".join(f"request {x}" for x in cell.shared_with) or "-"),
    ]
    return html.Div(kv_table(rows, id="cell-table"), className="cell-detail")


# -- acceptance ----------------------------------------------------------------------------------------------

MAX_REQUEST_SCAN = 4000  # verify steps decoded for the per-request chart (the most recent ones)


def acceptance_stats_rows(stats: Mapping[str, views.AcceptanceStats]) -> tuple[list[str], list[list[Cell]]]:
    """Header and rows of the acceptance statistics table, one column per trace."""
    names = list(stats)
    fields: list[tuple[str, Callable[[views.AcceptanceStats], Cell]]] = [
        ("verify steps", lambda s: s.verify_steps), ("verify rows", lambda s: s.rows),
        ("mean accept length", lambda s: f"{s.mean_accept_length:.3f}"),
        ("tokens per verify step", lambda s: f"{s.tokens_per_verify_step:.2f}"),
        ("draft acceptance", lambda s: _fmt_share(s.draft_acceptance)),
        ("draft-token waste", lambda s: _fmt_share(s.draft_waste)),
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
    names = {k: _name(s) for k, s in sources.items()}
    cols = {k: s.columns() for k, s in sources.items()}
    stats = {names[k]: models.acceptance(cols[k]) for k in sources}
    note = loading_note(*sources.values())
    if not any(s.verify_steps for s in stats.values()):
        empty = "no TARGET_VERIFY steps loaded yet" if note else "no TARGET_VERIFY steps in this trace"
        return html.Div([html.H2("Acceptance"), *note, html.P(empty, id="acc-empty")])
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
        table(head, rows, id="acc-stats"),
        html.Div([graph("acc-position", figures.by_position_figure(stats)),
                  graph("acc-hist", figures.histogram_figure(stats))], className="row2"),
        graph("acc-time", figures.over_time_figure({names[k]: models.mean_accept_per_step(cols[k])
                                                    for k in sources})),
        html.Div([
            graph("acc-bs", figures.group_figure({names[k]: models.acceptance_by_batch_size(cols[k])
                                                  for k in sources}, "Against batch size", "batch size")),
            graph("acc-request", figures.group_figure(req, "Per request" + ("; ".join(notes) and " — "
                                                                             + "; ".join(notes)), "request")),
        ], className="row2"),
    ], id="acceptance-page")


def _name(src: TraceSource) -> str:
    return f"{src.key.upper()}: {os.path.basename(src.name)}"


# -- violations ----------------------------------------------------------------------------------------------


# -- compare -------------------------------------------------------------------------------------------------

MAX_COMPARE_STEPS = 2000  # step pairs tracer.diff decodes before it stops looking


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
                      step_href(div.a_step, "a"), className="btn", id=f"{id}-open-a"),
             dcc.Link(f"open B step {div.b_step}", href=_diff_link(div, first, "b") if first else
                      step_href(div.b_step, "b"), className="btn", id=f"{id}-open-b")]
    rows = []
    for d in diffs[:200]:
        where = "" if d.row is None else f"[{d.row}" + ("" if d.col is None else f", {d.col}") + "]"
        who = "" if d.request_id is None else f" (request {d.request_id})"
        rows.append((d.kind, f"{d.name}{where}{who}", _short(d.a), _short(d.b)))
    return html.Div([
        html.H3(f"{title}: A step {div.a_step} / B step {div.b_step} — {div.label}"),
        html.Div(links),
        table(["kind", "what", "A", "B"], rows, id=f"{id}-diffs"),
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
                                                    "traces", id="cmp-none")], id="compare-page")
    rep = report
    na, nb = _name(a), _name(b)
    faults = [("A", f"{a.name} ({a.num_steps()} steps; faults: {', '.join(rep.a_faults) or 'none'})"),
              ("B", f"{b.name} ({b.num_steps()} steps; faults: {', '.join(rep.b_faults) or 'none'})")]
    blocks = []
    if rep.first is not None:
        blocks.append(divergence_block("First diverging step", rep.first, "cmp-first"))
    if rep.first_forward is not None and rep.first_forward is not rep.first:
        blocks.append(divergence_block("First diverging forward (not a capture)", rep.first_forward,
                                       "cmp-forward"))
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
        html.H2("Compare"), *loading_note(a, b), kv_table(faults, id="cmp-traces"),
        html.P(rep.headline, id="cmp-verdict", className="banner"),
        html.P(note + " · " + outputs, className="muted"),
        *blocks,
        html.H3("Acceptance"), table(h, rows, id="cmp-acc"),
        html.Div([graph("cmp-position", figures.by_position_figure(stats)),
                  graph("cmp-hist", figures.histogram_figure(stats))], className="row2"),
        graph("cmp-time", figures.over_time_figure({na: models.mean_accept_per_step(ca),
                                                    nb: models.mean_accept_per_step(cb)})),
    ], id="compare-page")
