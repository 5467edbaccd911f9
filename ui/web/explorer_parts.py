"""The parts of the step explorer that show what is wrong with a step: its violations (each linked, marked and
walked with n / N), the detail and seqlens tables with their marked cells, and the draft chain."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

from dash import dcc, html
from dash.development.base_component import Component
from specscope.tracer.schema import ForwardMode, Step, Violation
from specscope.ui import views

from . import ids, models
from .pages import id_prop, table, text_table
from .routes import step_href
from .source import TraceSource

MAX_LISTED = 16  # violations (and marks) of a step drawn as elements; the rest of them as one text block
MAX_CHAINS = 16  # draft chains drawn as token chips (the highlighted row's too); the request table has them all


def draft_chain(step: Step, reqs: Sequence[views.RequestView], fmt: Callable[[Sequence[int]], str],
                 highlight: int | None) -> Component:
    """The draft chain of a verify step: per request, its drafts as accepted / rejected chips and the bonus token."""
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
    return html.Div(blocks, id=ids.DRAFT_CHAIN)




_PREFIX = re.compile(r"^step \d+ \([^)]*\)\s*(?::\s*)?")


def short_message(v: Violation) -> str:
    """A violation's message without its `step N (model MODE, graph, bs a/b)` prefix (the page's header says it)."""
    return _PREFIX.sub("", v.message, count=1)




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
    return html.Table(html.Tbody(body), className="tbl kv", **id_prop(id))


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
    return html.Pre(out, className="text-table", **id_prop(id))




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


def violation_list(src: TraceSource, found: Sequence[Violation], cur: int | None,
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
                     id=ids.STEP_VIOLATIONS_REST, open=len(rest) <= 4 * MAX_LISTED),
    ])


def marks_table(marks: Sequence[views.CellMark]) -> Component:
    """Every value the step's violations mark: check, cell, found, expected, and whether it is the related side."""
    rows = [(m.check_id, views.cell_name(m.array, m.row, m.col), m.found or "-",
             "-" if m.expected is None else m.expected, "related" if m.is_related else "wrong value") for m in marks]
    head = ["check", "cell", "found", "expected", ""]
    if len(rows) > MAX_LISTED:  # aligned text: one element, not six per mark
        return text_table(head, rows, id=ids.STEP_MARKS)
    return table(head, rows, id=ids.STEP_MARKS, cls="marks")


# The step detail's scalar rows: label -> the recorded scalar's name.
