"""Plotly figures of the dashboard: pure functions from view models (models.py, ui/views.py) to figure dicts.

Figures are plain `{"data": [...], "layout": {...}}` dicts, the JSON plotly.js draws: building a `go.Figure`
validates and deep-copies every property (and the template) on each call, which cost more than the rest of a
step page together. Numbers travel as numpy arrays, which Dash's encoder passes through without walking them.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from specscope.tracer.query import SpanBins
from specscope.tracer.schema import SpanRow
from specscope.ui.views import SYMBOLS, AcceptanceStats, CellKind, CellMark, PageCell, PageGrid, bin_columns

from .models import GroupRow, Lanes, Series, StepStreams

MODE_COLORS = {
    "EXTEND": "#8c564b", "DECODE": "#7f7f7f", "DRAFT_DECODE": "#1f77b4", "TARGET_VERIFY": "#d62728",
    "DRAFT_EXTEND": "#2ca02c",
}  # fmt: skip
KIND_COLORS = {
    CellKind.OUT_OF_RANGE: "#7b0000", CellKind.STALE: "#e6550d", CellKind.SHARED: "#9467bd",
    CellKind.PADDED: "#bdbdbd", CellKind.FRESH: "#31a354", CellKind.OK: "#9ecae1", CellKind.UNREAD: "#f0f0f0",
}  # fmt: skip
KINDS = list(CellKind)
DARK_KINDS = (CellKind.OUT_OF_RANGE, CellKind.STALE, CellKind.SHARED, CellKind.FRESH)  # white text on these
LANES = ["host", "plan", "compute"]
MAX_HEATMAP_COLS = 256  # wider page tables are shown binned (views.bin_columns keeps the most notable kind)
MAX_ROW_LABELS = 16  # batch-row labels on the page-table grid's axis (every k-th row, and every marked row)
_GAPPED_CELLS = 32 * 32  # page-table grids up to this many cells are drawn with a gap between cells
Figure = dict[str, Any]

# The look of plotly's "plotly_white" template, spelled out: sending the template itself would add ~10 KB to
# every figure.
_GRID = "#EBF0F8"
_AXIS = {"gridcolor": _GRID, "linecolor": _GRID, "zerolinecolor": _GRID, "zerolinewidth": 2, "automargin": True,
         "ticks": "", "title": {"standoff": 15}}
# The timeline's figures (the first a browser draws) have fixed margins wide enough for their labels: with
# automargin, plotly.js measures the labels, widens a margin and draws each figure a second time (a third of a
# first draw's time).
_FIXED = {"automargin": False}
_TIMELINE_MARGIN = {"l": 72, "r": 20, "t": 62, "b": 56}
_COLORWAY = ["#636efa", "#EF553B", "#00cc96", "#ab63fa", "#FFA15A", "#19d3f3", "#FF6692", "#B6E880"]


def axis(title: str | None = None, /, **kw: Any) -> dict[str, Any]:
    """An axis in the dashboard's style (`title` as its title text; every keyword is an axis property)."""
    out: dict[str, Any] = {**_AXIS, **kw}
    if title is not None:
        out["title"] = {"text": title, "standoff": 15}
    return out


def _figure(data: list[dict[str, Any]], title: str, height: int = 320, **layout: Any) -> Figure:
    layout.setdefault("margin", {"l": 60, "r": 20, "t": 62, "b": 40})
    layout.setdefault("xaxis", axis())
    layout.setdefault("yaxis", axis())
    # Title in the top margin's upper half, legend in its lower half just above the plot: a legend below the
    # plot collides with the x axis title.
    base = {"title": {"text": title, "x": 0.01, "y": 1.0, "yref": "container", "yanchor": "top", "pad": {"t": 8},
                      "font": {"size": 14}},
            "height": height, "paper_bgcolor": "white", "plot_bgcolor": "white", "font": {"color": "#2a3f5f"},
            "colorway": _COLORWAY, "hovermode": "closest",
            "legend": {"orientation": "h", "x": 0, "xanchor": "left", "y": 1.0, "yanchor": "bottom"}}
    return {"data": data, "layout": {**base, **layout}}


def empty_figure(message: str, height: int = 200) -> Figure:
    """A blank figure that says why it is blank."""
    return _figure([], "", height, xaxis={"visible": False}, yaxis={"visible": False},
                   annotations=[{"text": message, "showarrow": False, "x": 0.5, "y": 0.5, "xref": "paper",
                                 "yref": "paper"}])


# -- timeline ------------------------------------------------------------------------------------------------


# The overview's lanes, bottom to top, as (axis, domain): violations, graph phase, batch size, host time.
_LANE_DOMAINS = {"yaxis4": [0.0, 0.08], "yaxis3": [0.13, 0.25], "yaxis2": [0.3, 0.44], "yaxis": [0.5, 1.0]}


def overview_figure(durations: dict[str, Series], window: tuple[int, int] | None = None, lanes: Lanes | None = None,
                    y_top: float | None = None, above: int = 0) -> Figure:
    """The whole run: host time per step, one colour per mode (binned series: mean with a min–max band), over
    lanes for batch size, captures / replays and violations. `y_top` is the top of the host-time scale (a robust
    one, `models.robust_range`; None: every value shown), `above` the steps above it. The selected step window is
    shaded (the figure's first shape)."""
    data: list[dict[str, Any]] = []
    binned = any(s.binned for s in durations.values())
    for mode, s in durations.items():
        color = MODE_COLORS.get(mode, "#333")
        if s.binned:
            data.append({"type": "scatter", "x": s.x, "y": s.y_max, "mode": "lines", "showlegend": False,
                         "line": {"width": 0, "color": color}, "hoverinfo": "skip", "legendgroup": mode})
            data.append({"type": "scatter", "x": s.x, "y": s.y_min, "mode": "lines", "fill": "tonexty",
                         "line": {"width": 0, "color": color}, "opacity": 0.3, "showlegend": False,
                         "hoverinfo": "skip", "legendgroup": mode})
            data.append({"type": "scatter", "x": s.x, "y": s.y, "mode": "lines", "name": mode,
                         "line": {"color": color, "width": 1}, "legendgroup": mode,
                         "customdata": np.column_stack([s.y_min, s.y_max, s.count]).astype(np.float32),
                         "hovertemplate": f"{mode}<br>step ≈ %{{x:.0f}}<br>mean %{{y:.1f}} µs"
                                          "<br>min %{customdata[0]:.1f} · max %{customdata[1]:.1f}"
                                          "<br>%{customdata[2]} steps<extra></extra>"})
        else:
            data.append({"type": "scatter", "x": s.x, "y": s.y, "mode": "markers", "name": mode,
                         "marker": {"color": color, "size": 5},
                         "hovertemplate": f"{mode}<br>step %{{x}}<br>%{{y:.1f}} µs<extra></extra>"})
    shapes = [] if window is None else [window_shape(window)]
    title = "Host time per step" + (" (binned: mean, min–max band)" if binned else "")
    if y_top is not None and above:
        title += f" · {above} warm-up / capture steps above the scale"
    layout: dict[str, Any] = {}
    if lanes is not None and len(lanes.x):
        data += _lane_traces(lanes)
        layout = {
            "yaxis2": axis("bs", domain=_LANE_DOMAINS["yaxis2"], rangemode="tozero", **_FIXED),
            "yaxis3": axis(domain=_LANE_DOMAINS["yaxis3"], type="category", categoryorder="array",
                           categoryarray=["replay", "capture"], **_FIXED),
            "yaxis4": axis(domain=_LANE_DOMAINS["yaxis4"], type="category", categoryarray=["violations"],
                           **_FIXED),
        }  # fmt: skip
    yaxis = axis("µs", domain=_LANE_DOMAINS["yaxis"] if layout else [0, 1], **_FIXED)
    yaxis.update({"range": [0, y_top], "autorange": False} if y_top is not None else {"rangemode": "tozero"})
    xaxis = axis("step", **_FIXED, **({"anchor": "y4"} if layout else {}))  # ticks under the lowest lane
    return _figure(data, title, 420 if layout else 260, xaxis=xaxis, yaxis=yaxis, shapes=shapes,
                   margin=_TIMELINE_MARGIN, **layout)


def _lane_traces(ln: Lanes) -> list[dict[str, Any]]:
    """Batch size (range per bin), captures and replays, and violations as marks on the overview's lanes."""
    what = "steps %{customdata[0]}–%{customdata[1]}" if ln.binned else "step %{customdata[0]}"
    span = np.column_stack([ln.lo, ln.hi]).astype(np.int64)
    out: list[dict[str, Any]] = [
        {"type": "scatter", "x": ln.x, "y": ln.bs_max, "yaxis": "y2", "mode": "lines", "name": "batch size",
         "line": {"color": "#455a64", "width": 1, "shape": "hv"}, "showlegend": False,
         "customdata": np.column_stack([span, ln.bs_min, ln.bs_max]),
         "hovertemplate": what + "<br>batch size %{customdata[2]}–%{customdata[3]}<extra></extra>"},
    ]
    for name, counts, color, symbol in (("capture", ln.captures, "#6a1b9a", "diamond"),
                                        ("replay", ln.replays, "#90a4ae", "line-ns-open")):
        m = counts > 0
        if m.any():
            out.append({"type": "scatter", "x": ln.x[m], "y": [name] * int(m.sum()), "yaxis": "y3",
                        "mode": "markers", "name": name, "showlegend": False,
                        "marker": {"color": color, "symbol": symbol, "size": 7},
                        "customdata": np.column_stack([span[m], counts[m]]),
                        "hovertemplate": what + f"<br>%{{customdata[2]}} {name} steps<extra></extra>"})
    for name, counts, color, symbol in (("errors", ln.errors, "#d50000", "x"),
                                        ("warnings", ln.warnings, "#ef6c00", "triangle-up")):
        m = counts > 0
        if m.any():
            out.append({"type": "scatter", "x": ln.x[m], "y": ["violations"] * int(m.sum()), "yaxis": "y4",
                        "mode": "markers", "name": f"violations ({name})", "showlegend": False,
                        "marker": {"color": color, "symbol": symbol, "size": 8},
                        "customdata": np.column_stack([span[m], counts[m]]),
                        "hovertemplate": what + f"<br>%{{customdata[2]}} {name}<extra></extra>"})
    return out


def window_shape(window: tuple[int, int]) -> dict[str, Any]:
    """The shaded step window [lo, hi) of the overview."""
    return {"type": "rect", "xref": "x", "yref": "paper", "x0": window[0] - 0.5, "x1": window[1] - 0.5, "y0": 0,
            "y1": 1, "fillcolor": "#ffd54f", "opacity": 0.25, "line": {"width": 0}, "layer": "below"}


def gantt_figure(spans: Sequence[SpanRow], highlight_step: int | None = None) -> Figure:
    """Gantt of plan / compute / host spans (µs from the first span), one bar per span coloured by the mode
    of its step; clicking a bar gives its step in `customdata[0]`."""
    if not spans:
        return empty_figure("no stream spans recorded for these steps", 260)
    t0 = min(s.start_ns for s in spans)
    by_mode: dict[str, list[SpanRow]] = {}
    for s in spans:
        by_mode.setdefault(s.mode.value, []).append(s)
    data = []
    for mode, rows in by_mode.items():
        data.append({
            "type": "bar", "orientation": "h", "y": [s.stream for s in rows],
            "x": np.array([(s.end_ns - s.start_ns) / 1e3 for s in rows]),
            "base": np.array([(s.start_ns - t0) / 1e3 for s in rows]), "name": mode,
            "marker": {"color": MODE_COLORS.get(mode, "#333"),
                       "line": {"width": [2 if s.step == highlight_step else 0 for s in rows], "color": "#000"}},
            "customdata": [[s.step, s.name, s.model, (s.end_ns - s.start_ns) / 1e3] for s in rows],
            "hovertemplate": "step %{customdata[0]} (%{customdata[2]} " + mode + ")<br>%{y}: %{customdata[1]}"
                             "<br>start %{base:.1f} µs, %{customdata[3]:.1f} µs<extra></extra>",
        })  # fmt: skip
    lanes = [lane for lane in LANES if any(s.stream == lane for s in spans)]
    lanes += sorted({s.stream for s in spans} - set(lanes))
    return _figure(data, "Streams (click a bar to open its step)", 280, barmode="overlay", bargap=0.35,
                   xaxis=axis("µs from the first span in the window", **_FIXED),
                   yaxis=axis(categoryorder="array", categoryarray=lanes, **_FIXED), margin=_TIMELINE_MARGIN)


def overlap_figure(rows: Sequence[StepStreams]) -> Figure:
    """Per step: share of plan-stream time hidden under compute, and the compute-stream idle gap before it."""
    if not rows:
        return empty_figure("no steps in the window", 220)
    data = []
    plan = [r for r in rows if r.plan_ns]
    if plan:
        data.append({"type": "bar", "x": [r.step for r in plan], "y": [100 * (r.hidden_share or 0) for r in plan],
                     "name": "plan hidden under compute (%)", "marker": {"color": "#6baed6"},
                     "customdata": [[r.plan_ns / 1e3, r.plan_hidden_ns / 1e3] for r in plan],
                     "hovertemplate": "step %{x}<br>%{y:.0f}% hidden<br>plan %{customdata[0]:.1f} µs, hidden "
                                      "%{customdata[1]:.1f} µs<extra></extra>"})
    data.append({"type": "scatter", "x": [r.step for r in rows], "y": [r.idle_before_ns / 1e3 for r in rows],
                 "yaxis": "y2", "mode": "lines+markers", "name": "GPU idle before step (µs)", "marker": {"size": 4},
                 "line": {"color": "#e6550d", "width": 1},
                 "hovertemplate": "step %{x}<br>compute idle %{y:.1f} µs before it<extra></extra>"})
    title = "Plan under compute per step" + ("" if plan else " (no plan-stream spans: plan stream off)")
    return _figure(data, title, 240, xaxis=axis("step", **_FIXED), yaxis=axis("% hidden", range=[0, 105], **_FIXED),
                   yaxis2=axis("idle µs", overlaying="y", side="right", rangemode="tozero", showgrid=False, **_FIXED),
                   margin={**_TIMELINE_MARGIN, "r": 72})


def stream_bins_figure(sb: SpanBins) -> Figure:
    """A window too wide to draw span by span: per bin of steps, the busy time of each stream (summed spans)."""
    if not len(sb.bin):
        return empty_figure("no stream spans recorded for these steps", 260)
    lo, hi = sb.edges[:-1], sb.edges[1:] - 1
    data = []
    lanes = [lane for lane in LANES if (sb.stream == lane).any()] + sorted(set(sb.stream.tolist()) - set(LANES))
    for k, lane in enumerate(lanes):
        m = sb.stream == lane
        b = sb.bin[m]
        data.append({"type": "bar", "x": (lo[b] + hi[b]) / 2, "y": sb.busy_ns[m] / 1e3, "name": lane,
                     "marker": {"color": _COLORWAY[k % len(_COLORWAY)]}, "width": np.maximum(hi[b] - lo[b], 1) * 0.9,
                     "customdata": np.column_stack([lo[b], hi[b], sb.count[m], sb.max_ns[m] / 1e3]),
                     "hovertemplate": "steps %{customdata[0]}–%{customdata[1]}<br>" + lane + " busy %{y:.1f} µs in "
                                      "%{customdata[2]} spans (longest %{customdata[3]:.1f} µs)<extra></extra>"})
    return _figure(data, "Stream busy time per bin of steps (select ≤ 300 steps for the spans themselves)", 280,
                   barmode="group", xaxis=axis("step", **_FIXED), yaxis=axis("µs", rangemode="tozero", **_FIXED),
                   margin=_TIMELINE_MARGIN)


def plan_bins_figure(sb: SpanBins) -> Figure:
    """A wide window: plan-stream time against compute time per bin of steps (the share hidden under compute is
    per step, for windows of at most 300 steps)."""
    plan, comp = sb.stream == "plan", sb.stream == "compute"
    if not comp.any():
        return empty_figure("no compute spans recorded for these steps", 220)
    lo, hi = sb.edges[:-1], sb.edges[1:] - 1
    busy = np.zeros(len(lo))
    busy[sb.bin[comp]] = sb.busy_ns[comp]
    b = sb.bin[plan]
    share = 100 * sb.busy_ns[plan] / np.maximum(busy[b], 1)
    data = [{"type": "bar", "x": (lo[b] + hi[b]) / 2, "y": share, "name": "plan time / compute time (%)",
             "marker": {"color": "#6baed6"}, "width": np.maximum(hi[b] - lo[b], 1) * 0.9,
             "customdata": np.column_stack([lo[b], hi[b]]),
             "hovertemplate": "steps %{customdata[0]}–%{customdata[1]}<br>plan %{y:.0f}% of compute time"
                              "<extra></extra>"}]
    title = "Plan against compute per bin" + ("" if plan.any() else " (no plan-stream spans: plan stream off)")
    return _figure(data, title, 240, xaxis=axis("step", **_FIXED), yaxis=axis("%", rangemode="tozero", **_FIXED),
                   margin=_TIMELINE_MARGIN)


# -- step explorer -------------------------------------------------------------------------------------------


KIND_SHORT = {
    CellKind.OUT_OF_RANGE: "outside the KV pool", CellKind.STALE: "stale", CellKind.SHARED: "shared",
    CellKind.PADDED: "padded row", CellKind.FRESH: "written this step", CellKind.OK: "ok",
    CellKind.UNREAD: "not read",
}  # fmt: skip


# plotly.js's names of the dtypes a typed array spec may carry (little-endian, as every host plotly.js runs on).
_DTYPES = {"int8": "i1", "uint8": "u1", "int16": "i2", "uint16": "u2", "int32": "i4", "uint32": "u4",
           "float32": "f4", "float64": "f8"}


def typed_array(a: np.ndarray) -> dict[str, str]:
    """`a` (any shape up to 3-D; a dtype of `_DTYPES`) as plotly.js's typed array spec `{dtype, bdata, shape}`:
    base64 of the raw bytes, which plotly.js decodes into typed arrays instead of parsing and walking nested JSON
    lists (a bs-64 page table is ~12k numbers a step)."""
    code = _DTYPES[a.dtype.name]
    raw = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")).tobytes()
    return {"dtype": code, "bdata": base64.b64encode(raw).decode("ascii"), "shape": ",".join(map(str, a.shape))}


def from_typed_array(spec: Mapping[str, str]) -> np.ndarray:
    """The array a `typed_array` spec holds (what plotly.js draws), for reading a figure back."""
    dtype = np.dtype({v: k for k, v in _DTYPES.items()}[spec["dtype"]]).newbyteorder("<")
    shape = tuple(int(x) for x in str(spec["shape"]).split(",") if x)
    return np.frombuffer(base64.b64decode(spec["bdata"]), dtype=dtype).reshape(shape)


def _hover(c: PageCell) -> str:
    # A healthy cell says its request in short (the axis labels only every few rows of a big batch).
    if c.kind in (CellKind.OK, CellKind.UNREAD) and c.owner is not None:
        return f"r{c.owner} · {KIND_SHORT[c.kind]}"
    who = "padded row" if c.owner is None else f"request {c.owner}"
    text = f"{who} · {KIND_SHORT[c.kind]}"
    if c.expected_page is not None and c.expected_page != c.page:
        text += f" (req_to_token gives {c.expected_page})"
    if c.shared_with:
        text += f" with {', '.join(map(str, c.shared_with))}"
    return text


def heatmap_figure(grid: PageGrid, highlight: tuple[int, int | None] | None = None,
                   marks: Sequence[CellMark] = ()) -> Figure:
    """The page table, request (row) × logical page (column), coloured by cell kind with its symbol; hover
    shows the physical page, token range and owner. `highlight` (row, col or None) is outlined.

    Per-cell numbers travel as one int32 array ([page, first token, end token], or [lowest page, highest page,
    first logical page] when binned) and the owner / kind as one short string, to keep big grids light."""
    rows = len(grid.cells)
    binned = grid.num_cols > MAX_HEATMAP_COLS
    z, text, custom, hover = [], [], [], []
    if binned:
        for r, bins in enumerate(bin_columns(grid, MAX_HEATMAP_COLS)):
            z.append([KINDS.index(c.kind) for c in bins])
            text.append([SYMBOLS[c.kind] for c in bins])
            custom.append([[min(c.pages), max(c.pages), c.col_lo, c.col_hi] for c in bins])
            hover.append([f"{grid.row_labels[r]} · {KIND_SHORT[c.kind]}" for c in bins])
        template = ("row %{y} · logical pages %{customdata[2]}–%{customdata[3]}<br>physical pages "
                    "%{customdata[0]}…%{customdata[1]}<br>%{hovertext}<extra></extra>")
    else:
        for row in grid.cells:
            z.append([KINDS.index(c.kind) for c in row])
            text.append([f"{c.page}{SYMBOLS[c.kind].strip()}" for c in row])
            custom.append([[c.page, c.token_start, c.token_end] for c in row])
            hover.append([_hover(c) for c in row])
        template = ("row %{y} · logical page %{x}<br>physical page %{customdata[0]}<br>tokens %{customdata[1]}–"
                    "%{customdata[2]}<br>%{hovertext}<extra></extra>")
    n = len(KINDS)
    scale = []
    for i, k in enumerate(KINDS):
        scale += [[i / n, KIND_COLORS[k]], [(i + 1) / n, KIND_COLORS[k]]]
    width = len(z[0]) if z else 0
    # Gaps between cells make plotly.js paint each cell as a rectangle of its own, where a gapless grid is one
    # image: at bs 64 x 64 pages that is ~50 ms of every step change (benchmarks/web.py), for gaps a cell of ~10 px
    # hardly shows. A small grid keeps them, and its page numbers printed in the cells.
    gap = 1 if rows * width <= _GAPPED_CELLS else 0
    trace: dict[str, Any] = {
        "type": "heatmap", "z": typed_array(np.array(z, np.int8)), "hovertext": hover,
        "customdata": typed_array(np.array(custom, np.int32)), "zmin": -0.5, "zmax": n - 0.5, "colorscale": scale,
        "xgap": gap, "ygap": gap, "showscale": False, "y": np.arange(rows), "x": np.arange(width),
        "hovertemplate": template,
    }  # fmt: skip
    if not binned and gap:  # cells big enough to print page number and symbol
        trace["text"] = text
        trace["texttemplate"] = "%{text}"
    per = max(1, -(-grid.num_cols // MAX_HEATMAP_COLS)) if binned else 1  # logical pages per shown column

    def box(r: int, c: int | None, line: dict[str, Any]) -> dict[str, Any]:
        x0, x1 = (-0.5, width - 0.5) if c is None else (c // per - 0.5, c // per + 0.5)
        return {"type": "rect", "xref": "x", "yref": "y", "x0": x0, "x1": x1, "y0": r - 0.5, "y1": r + 0.5,
                "line": line}

    shapes = []
    for m in marks:
        if m.row is None or not 0 <= m.row < rows:
            continue
        shapes.append(box(m.row, m.col, {"color": "#2962ff", "width": 2, "dash": "dash"} if m.is_related
                          else {"color": "#d50000", "width": 3}))
        if m.col is not None and not binned and 0 <= m.col < width:
            hover[m.row][m.col] += "<br>" + ("◇ " if m.is_related else "✗ ") + m.text
    if highlight is not None:
        r, c = highlight
        shapes.append(box(r, None if binned else c, {"color": "#000", "width": 3}))
    # Rows are short in a big batch, so the grid stays a screen tall; a narrow table gets integer ticks only.
    row_px = 26 if rows <= 16 else max(10, 640 // rows)
    height = max(150, min(900, 90 + row_px * rows))
    title = f"Page table: {grid.batch_size} live rows of {rows}, {grid.num_cols} of {grid.full_cols} columns recorded"
    xticks: dict[str, Any] = {"tickmode": "linear", "tick0": 0, "dtick": max(1, -(-width // 16))}
    if binned:
        xticks = {"tickmode": "array", "tickvals": list(range(0, width, max(1, width // 8))),
                  "ticktext": [str(v * per) for v in range(0, width, max(1, width // 8))]}
    # plotly.js measures every tick label it draws; a label a row at bs 64 cost ~50 ms a step change, and rows of
    # ~10 px could not show them all anyway. The marked rows are always labelled.
    every = max(1, -(-rows // MAX_ROW_LABELS))
    labelled = sorted(set(range(0, rows, every)) | {m.row for m in marks if m.row is not None and 0 <= m.row < rows})
    return _figure([trace], title, height, margin={"l": 70, "r": 20, "t": 70, "b": 20}, shapes=shapes,
                   yaxis=axis("batch row", autorange="reversed", tickmode="array", tickvals=labelled,
                              ticktext=[grid.row_labels[r] for r in labelled]),
                   xaxis=axis("logical page" + (" (binned)" if binned else ""), side="top", **xticks))


# -- acceptance ----------------------------------------------------------------------------------------------


def by_position_figure(stats: dict[str, AcceptanceStats]) -> Figure:
    """Acceptance rate by draft position, one bar group per trace."""
    data = [{"type": "bar", "x": list(range(len(s.by_position))), "y": [100 * r for r in s.by_position], "name": name,
             "hovertemplate": "draft token %{x}<br>%{y:.1f}% accepted<extra>" + name + "</extra>"}
            for name, s in stats.items()]
    return _figure(data, "Acceptance by draft position", 280, xaxis=axis("draft position", dtick=1),
                   yaxis=axis("% of verify rows", range=[0, 100]))


def histogram_figure(stats: dict[str, AcceptanceStats]) -> Figure:
    """Accept-length histogram (share of verify rows), one bar group per trace."""
    data = []
    for name, s in stats.items():
        total = sum(s.histogram) or 1
        data.append({"type": "bar", "x": list(range(len(s.histogram))), "y": [100 * c / total for c in s.histogram],
                     "name": name, "customdata": list(s.histogram),
                     "hovertemplate": "accept length %{x}<br>%{y:.1f}% (%{customdata} rows)<extra>" + name
                                      + "</extra>"})
    return _figure(data, "Accept-length histogram", 280, xaxis=axis("accept length (bonus included)", dtick=1),
                   yaxis=axis("% of verify rows"))


def over_time_figure(series: dict[str, Series]) -> Figure:
    """Mean accept length per verify step over the trace (binned: mean with min–max band)."""
    data: list[dict[str, Any]] = []
    for k, (name, s) in enumerate(series.items()):
        color = _COLORWAY[k % len(_COLORWAY)]
        if s.binned:
            data.append({"type": "scatter", "x": s.x, "y": s.y_max, "mode": "lines", "showlegend": False,
                         "line": {"width": 0, "color": color}, "hoverinfo": "skip"})
            data.append({"type": "scatter", "x": s.x, "y": s.y_min, "mode": "lines", "fill": "tonexty",
                         "line": {"width": 0, "color": color}, "opacity": 0.3, "showlegend": False,
                         "hoverinfo": "skip"})
        data.append({"type": "scatter", "x": s.x, "y": s.y, "mode": "lines" if s.binned else "lines+markers",
                     "name": name, "marker": {"size": 4, "color": color}, "line": {"color": color},
                     "hovertemplate": "step %{x:.0f}<br>mean accept length %{y:.2f}<extra>" + name + "</extra>"})
    binned = any(s.binned for s in series.values())
    return _figure(data, "Acceptance over time" + (" (binned)" if binned else ""), 260, xaxis=axis("step"),
                   yaxis=axis("mean accept length", rangemode="tozero"))


def group_figure(rows: Mapping[str, Sequence[GroupRow]], title: str, xtitle: str) -> Figure:
    """Mean accept length per group (batch size or request), one bar group per trace."""
    data = [{"type": "bar", "x": [r.key for r in rs], "y": [r.mean_accept_length for r in rs], "name": name,
             "customdata": [[r.steps, r.rows] for r in rs],
             "hovertemplate": xtitle + " %{x}<br>mean accept length %{y:.2f}<br>%{customdata[0]} steps, "
                                       "%{customdata[1]} rows<extra>" + name + "</extra>"}
            for name, rs in rows.items()]
    return _figure(data, title, 260, xaxis=axis(xtitle, type="category"),
                   yaxis=axis("mean accept length", rangemode="tozero"))
