"""The step explorer (`/step/N`): a step's violations first, each value they name marked where the page shows it,
then its detail, seqlens, page-table heatmap, requests and draft chain; with its callback (a heatmap cell's
details). Stepping forward is the hot path: the next step's page is built ahead while the browser draws."""

from __future__ import annotations

from collections.abc import Sequence

from dash import Dash, Input, Output, State, dcc, html
from dash.development.base_component import Component
from specscope.tracer.checks import BY_ID
from specscope.tracer.schema import ForwardMode, Step, Violation
from specscope.ui import views
from specscope.ui.recording_notes import replay_without_metadata

from . import figures, ids, models
from .dashboard import Dashboard, check_int, current, safe
from .explorer_parts import (
    draft_chain,
    marked_kv_table,
    marked_text_table,
    marks_table,
    violation_list,
    violation_walk,
)
from .pages import graph, kv_table, table
from .routes import InputError, Route, RouteError, step_href
from .source import TraceSource

MAX_HTML_ROWS = 16  # request tables of bigger batches are aligned text (the browser builds 1 element, not 650)


def layout(d: Dashboard, route: Route) -> Component:
    """The page at `/step/N` (routes.PAGE_MODULES): built ahead when it was the next one, and then the one after it
    is. /step/N names the step by its index: a bundle keeps the original run's numbers (they skip)."""
    src = d.source(route.trace)
    i = route.step
    if i is None or not src.has(i):
        raise RouteError(f"no step {i}: the trace has {src.num_steps()} steps ({src.steps_text()})")
    if route.params:
        return step_page(src, i, route.params)
    page = d.ahead.take((src.key, i, src.num_steps()), lambda: step_page(src, i, {}))
    nxt = src.neighbour(i, 1)
    if nxt > i:
        d.ahead.start((src.key, nxt, src.num_steps()), lambda: step_page(src, nxt, {}))
    return page


def highlight_row(step: Step, params: dict[str, int | str]) -> int | None:
    """The batch row a step URL asks to highlight (by `row`, or by `request`)."""
    if "row" in params:
        return int(params["row"])
    if "request" in params:
        for b, r in enumerate(step.requests):
            if r.request_id == params["request"]:
                return b
    return None




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




_DETAIL_SCALARS = {"max_seq_len_q": "max_seq_len_q", "kernel q_len": "kernel_q_len", "max_seq_len_k": "max_seq_len_k"}


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
        html.Span(pos, id=ids.STEP_POS),
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
                               className="banner", id=ids.VIOLATION_BANNER))
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
                                      cells=req_cells, id=ids.REQUEST_TABLE, highlight=hl)
    else:
        head = [*req_head, "marks"] if req_marks else req_head
        body = [[*r, req_marks.get(b, "")] if req_marks else r for b, r in enumerate(req_rows)]
        req_table = table(head, body, id=ids.REQUEST_TABLE, highlight=hl)
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
            cells={rc: all(m.is_related for m in mk) for rc, mk in where.seqlens.items()}, id=ids.SEQLENS_TABLE,
            highlight=hl)
        grid_block = [heat, legend, html.Div("click a cell for its details", id=ids.STEP_CELL, className="cell-detail")]
    else:
        if no_md:
            grid_block = [html.P(f"{not_recorded}: page table, cache_seqlens, cu_seqlens (the step's header, "
                                 "requests and spans are recorded)", className="muted", id=ids.STEP_NOT_RECORDED)]
            seqs = html.P(f"{not_recorded}: cache_seqlens, cu_seqlens", className="muted")
        else:
            grid_block = [html.P("this step recorded no page table", className="muted")]
            seqs = html.P("no seqlens recorded", className="muted")
    extra: list[Component] = []
    if step.errors:
        extra.append(table(["call", "error", "message"], [(e.call, e.error_type, e.message) for e in step.errors]))
    if step.waits:
        extra.append(table(["stream", "waited on"], [(w.stream, f"{w.on_stream}:{w.on_span}") for w in step.waits]))
    chain = draft_chain(step, reqs, fmt, hl)
    return html.Div([
        dcc.Store(id=ids.STEP_INDEX, data={"trace": key, "step": i}),
        nav, *banner,
        html.Div([
            html.Div([html.H3(f"Violations ({len(found)})"), violation_list(src, found, cur, rows_of), *extra],
                     className="col"),
            *([html.Div([html.H3("Marked values"), marks_table(marks)], className="col")] if marks else []),
        ], className="row"),
        html.Div([
            html.Div([html.H3("Step"), marked_kv_table(detail, where.detail, id=ids.STEP_DETAIL)],
                     className="col narrow"),
            html.Div([html.H3("cache_seqlens and cu_seqlens"), seqs], className="col"),
        ], className="row"),
        html.H3("Page table"), *grid_block,
        html.H3(f"Requests ({len(reqs)})"), req_table,
        html.Details([html.Summary("Draft chain"), chain], open=not big, className="chain-block"),
    ], id=ids.STEP_PAGE)


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
    return html.Div(kv_table(rows, id=ids.CELL_TABLE), className="cell-detail")




@safe(lambda m: html.Div(m, className="cell-detail"))
def cell(click: object, where: object) -> Component:
    """The details of the heatmap cell clicked (`where`: the page's {"trace", "step"} store)."""
    if not isinstance(where, dict):
        raise InputError("malformed step reference")
    src = current().source(str(where.get("trace")))
    i = check_int(where.get("step"), "step", 0, max(0, src.last_index()))
    if not src.has(i):
        raise InputError(f"no step {i} (the trace has {src.steps_text()})")
    if not isinstance(click, dict) or not isinstance(click.get("points"), list) or not click["points"]:
        raise InputError("malformed click")
    p = click["points"][0]
    if not isinstance(p, dict):
        raise InputError("malformed click")
    row, col = check_int(p.get("y"), "row"), check_int(p.get("x"), "column")
    return cell_detail(views.page_grid(src.step(i)), row, col)


def register(app: Dash) -> None:
    """The page's callback, on `app`."""
    app.callback(Output(ids.STEP_CELL, "children"), Input(ids.STEP_HEATMAP, "clickData"),
                 State(ids.STEP_INDEX, "data"), prevent_initial_call=True)(cell)
