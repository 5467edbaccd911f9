"""First divergence of two traces of the same workload (e.g. a fault run against its clean run). Torch-free.

Steps are paired by index (a bundle keeps the original run's indexes, so a bundle pairs with the trace it was cut
from; steps only one side holds are left out). A pair differs in its header (mode, model, draft step, bs, padded bs,
graph, T, K), its scalars (max_seq_len_q, kernel_q_len, ...), its metadata arrays (values, not device addresses), or its
requests (ids, seq lens, draft tokens, accepted tokens, accept length). The report names the first diverging
step, the first diverging forward that is not a graph capture, what differs there, and the acceptance of each
trace overall — one screen to paste into an issue.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .reader import TraceReader
from .schema import GraphPhase, Step

METADATA_ARRAYS = ("cache_seqlens", "cu_seqlens_q", "cu_seqlens_k", "page_table", "seq_lens", "req_pool_indices",
                   "out_cache_loc", "positions", "req_to_token_page_starts")
HEADER_FIELDS = ("mode", "model", "step_id", "batch_size", "padded_batch_size", "graph", "tokens_per_request",
                 "num_draft_tokens", "page_size")
# Scalars a kernel consumes come first in a headline; the rest follow in name order.
KERNEL_SCALARS = ("kernel_q_len", "max_seq_len_q", "captured_max_seq_len_q", "max_seq_len_k", "max_context_len")
REQUEST_FIELDS = ("request_id", "slot", "seq_len_before", "seq_len_after", "num_q_tokens", "draft_tokens",
                  "accepted_tokens", "accept_length")
_KIND_ORDER = {"header": 0, "scalar": 1, "array": 2, "request": 3}


@dataclass(frozen=True)
class Difference:
    """One value that differs between the paired steps."""

    kind: str  # "header", "scalar", "array", "request"
    name: str  # field, scalar or array name
    a: Any
    b: Any
    row: int | None = None
    col: int | None = None
    request_id: int | None = None

    def text(self, a_label: str = "A", b_label: str = "B") -> str:
        """E.g. `kernel_q_len = 4 (A) vs 2 (B)` or `page_table[1, 2] = 7 vs 3`."""
        where = "" if self.row is None else f"[{self.row}" + ("" if self.col is None else f", {self.col}") + "]"
        who = "" if self.request_id is None else f" (request {self.request_id})"
        return f"{self.name}{where}{who} = {_fmt(self.a)} ({a_label}) vs {_fmt(self.b)} ({b_label})"


@dataclass
class StepDivergence:
    """A diverging step pair."""

    a_step: int
    b_step: int
    label: str  # "target TARGET_VERIFY replay, iteration 3"
    differences: list[Difference]


@dataclass
class DiffReport:
    """What `specscope diff` prints."""

    a: str
    b: str
    a_faults: list[str]
    b_faults: list[str]
    steps_compared: int
    a_steps: int
    b_steps: int
    first: StepDivergence | None = None
    first_forward: StepDivergence | None = None  # first diverging step that is not a capture
    structure_diverged_at: int | None = None  # pair index where headers stop lining up (compare ends there)
    acceptance: dict[str, Any] = field(default_factory=dict)
    outputs: dict[str, Any] = field(default_factory=dict)
    headline: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return {k: _jsonable(v) for k, v in asdict(self).items()}


def _fmt(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(map(str, v)) + "]"
    return str(v)


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    return x


def step_label(s: Step) -> str:
    """`target TARGET_VERIFY replay, iteration 3` (draft steps name their draft step)."""
    sid = "" if s.step_id is None else f" {s.step_id}"
    it = "" if s.iteration < 0 else f", iteration {s.iteration}"
    return f"{s.model} {s.mode.value}{sid} {s.graph.value}{it}"


def compare_steps(a: Step, b: Step) -> list[Difference]:
    """Every difference of two paired steps, header first, then scalars, arrays and requests."""
    out: list[Difference] = []
    ha, hb = a.header_dict(), b.header_dict()
    for f in HEADER_FIELDS:
        if ha[f] != hb[f]:
            out.append(Difference("header", f, ha[f], hb[f]))
    keys = [k for k in KERNEL_SCALARS if k in a.scalars or k in b.scalars]
    keys += sorted((set(a.scalars) | set(b.scalars)) - set(KERNEL_SCALARS))
    for k in keys:
        va, vb = a.scalars.get(k), b.scalars.get(k)
        if va != vb:
            out.append(Difference("scalar", k, va, vb))
    for name in METADATA_ARRAYS:
        x, y = a.array(name), b.array(name)
        if x is None or y is None:
            if (x is None) != (y is None):
                out.append(Difference("array", name, "absent" if x is None else "present",
                                      "absent" if y is None else "present"))
            continue
        d = _array_difference(name, x.values, y.values, tuple(x.shape), tuple(y.shape))
        if d is not None:
            out.append(d)
    for row, (ra, rb) in enumerate(zip(a.requests, b.requests, strict=False)):
        for f in REQUEST_FIELDS:
            va, vb = getattr(ra, f), getattr(rb, f)
            if va != vb:
                out.append(Difference("request", f, list(va) if isinstance(va, tuple) else va,
                                      list(vb) if isinstance(vb, tuple) else vb, row=row, request_id=ra.request_id))
    if len(a.requests) != len(b.requests):
        out.append(Difference("request", "count", len(a.requests), len(b.requests)))
    return out


def _array_difference(name: str, x: np.ndarray, y: np.ndarray, sx: tuple[int, ...],
                      sy: tuple[int, ...]) -> Difference | None:
    if sx != sy:
        return Difference("array", f"{name}.shape", list(sx), list(sy))
    if x.shape != y.shape:
        return Difference("array", f"{name} (recorded part).shape", list(x.shape), list(y.shape))
    if np.array_equal(x, y):
        return None
    idx = tuple(int(i) for i in np.argwhere(x != y)[0])
    row = idx[0] if idx else None
    col = idx[1] if len(idx) > 1 else None
    if x.ndim == 1:
        lo = max(0, idx[0] - 2)
        return Difference("array", name, x[lo:lo + 6].tolist(), y[lo:lo + 6].tolist(), row=row)
    return Difference("array", name, x[idx].item(), y[idx].item(), row=row, col=col)


def _acceptance(r: TraceReader) -> dict[str, Any]:
    hist = r.accept_histogram()
    rows = sum(hist)
    mean = (sum(n * c for n, c in enumerate(hist)) / rows) if rows else None
    return {"verify_rows": rows, "mean_accept_length": mean, "histogram": hist}


def _outputs(ra: TraceReader, rb: TraceReader) -> dict[str, Any]:
    a = {x.request_id: x.output_tokens for x in ra.requests()}
    b = {x.request_id: x.output_tokens for x in rb.requests()}
    first: list[dict[str, Any]] = []
    same = 0
    for rid in sorted(set(a) & set(b)):
        ta, tb = a[rid], b[rid]
        if ta == tb:
            same += 1
            continue
        pos = next((i for i, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y), min(len(ta), len(tb)))
        first.append({"request_id": rid, "position": pos, "a": list(ta[pos:pos + 4]), "b": list(tb[pos:pos + 4])})
    return {"requests_compared": len(set(a) & set(b)), "identical": same, "differing": first,
            "only_in_a": sorted(set(a) - set(b)), "only_in_b": sorted(set(b) - set(a))}


def diff_traces(ra: TraceReader, rb: TraceReader, max_steps: int | None = None) -> DiffReport:
    """Walk both traces in step order up to the first diverging forward (or where their structure parts)."""
    rep = DiffReport(a=ra.display_path, b=rb.display_path, a_faults=list(ra.run.config.get("faults") or []),
                     b_faults=list(rb.run.config.get("faults") or []), steps_compared=0,
                     a_steps=ra.num_steps(), b_steps=rb.num_steps())
    for n, (sa, sb) in enumerate(_pairs(ra, rb)):
        if max_steps is not None and n >= max_steps:
            break
        rep.steps_compared = n + 1
        a = ra.step(sa.index, arrays=METADATA_ARRAYS)
        b = rb.step(sb.index, arrays=METADATA_ARRAYS)
        diffs = compare_steps(a, b)
        if not diffs:
            continue
        div = StepDivergence(sa.index, sb.index, step_label(a), diffs)
        if rep.first is None:
            rep.first = div
        if a.graph != GraphPhase.CAPTURE:
            rep.first_forward = div
            break
        if any(d.kind == "header" for d in diffs):
            rep.structure_diverged_at = n
            break
    rep.acceptance = {"a": _acceptance(ra), "b": _acceptance(rb)}
    rep.outputs = _outputs(ra, rb)
    rep.headline = headline(rep)
    return rep


def _pairs(ra: TraceReader, rb: TraceReader) -> Iterable[tuple[Any, Any]]:
    """The summaries of the indexes both traces hold, in index order (a merge of two ascending walks)."""
    ia, ib = ra.iter_summaries(), rb.iter_summaries()
    sa, sb = next(ia, None), next(ib, None)
    while sa is not None and sb is not None:
        if sa.index == sb.index:
            yield sa, sb
            sa, sb = next(ia, None), next(ib, None)
        elif sa.index < sb.index:
            sa = next(ia, None)
        else:
            sb = next(ib, None)


def _labels(rep: DiffReport) -> tuple[str, str, str]:
    """(subject, A's label, B's label): "with the fault X" when exactly A injects faults."""
    if rep.a_faults and not rep.b_faults:
        return f"with the fault {', '.join(rep.a_faults)}", "fault", "clean"
    if rep.b_faults and not rep.a_faults:
        return f"without the fault {', '.join(rep.b_faults)}", "clean", "fault"
    return "in A", "A", "B"


def _lead(d: Difference, a_label: str, b_label: str) -> str:
    if d.kind in ("scalar", "header") or (d.kind == "array" and d.row is not None and not isinstance(d.a, list)):
        where = "" if d.row is None else f"[{d.row}" + ("" if d.col is None else f", {d.col}") + "]"
        return f"reads {d.name}{where}={_fmt(d.a)} instead of {_fmt(d.b)}"
    return d.text(a_label, b_label)


_SHORT = {"TARGET_VERIFY": "verify", "DRAFT_DECODE": "draft decode", "DRAFT_EXTEND": "draft extend",
          "EXTEND": "extend", "DECODE": "decode"}


def _where(div: StepDivergence, step: Step | None = None) -> str:
    mode = div.label.split()[1]
    step_s = f"step {div.a_step}" + ("" if div.a_step == div.b_step else f" (B step {div.b_step})")
    return f"{_SHORT.get(mode, mode)} {step_s} ({div.label})"


def headline(rep: DiffReport) -> str:
    """The one sentence: "with the fault F, verify step 7 (target TARGET_VERIFY replay, iteration 0) reads
    kernel_q_len=4 instead of 2 (first at capture step 0)"."""
    subject, la, lb = _labels(rep)
    if rep.first is None:
        more = "" if rep.a_steps == rep.b_steps else "; the longer trace has more steps past the end of the other"
        return f"no divergence in {rep.steps_compared} paired steps (A {rep.a_steps} steps, B {rep.b_steps}){more}"
    main = rep.first_forward or rep.first
    d = sorted(main.differences, key=lambda x: _KIND_ORDER[x.kind])[0]
    text = f"{subject}, {_where(main)} {_lead(d, la, lb)}"
    if main is not rep.first:
        text += f" (first at capture step {rep.first.a_step})"
    return text


def format_report(rep: DiffReport, max_lines: int = 12) -> str:
    """The one-screen text report."""
    _, la, lb = _labels(rep)
    out = [f"A: {rep.a} ({rep.a_steps} steps; faults: {', '.join(rep.a_faults) or 'none'})",
           f"B: {rep.b} ({rep.b_steps} steps; faults: {', '.join(rep.b_faults) or 'none'})", "", rep.headline, ""]
    for title, div in (("first diverging step", rep.first), ("first diverging forward (not a capture)",
                                                              rep.first_forward)):
        if div is None or (title.startswith("first diverging forward") and div is rep.first):
            continue
        out.append(f"{title}: A step {div.a_step} / B step {div.b_step}, {div.label}: {len(div.differences)} "
                   "differences")
        ds = sorted(div.differences, key=lambda x: _KIND_ORDER[x.kind])
        for d in ds[:max_lines]:
            out.append(f"  {d.kind:8s} {d.text(la, lb)}")
        if len(ds) > max_lines:
            out.append(f"  ... {len(ds) - max_lines} more (--json lists all)")
        out.append("")
    if rep.first is not None and rep.first_forward is None:
        why = ("the step structure parts there" if rep.structure_diverged_at is not None
               else f"no forward differs in {rep.steps_compared} paired steps")
        out += [f"only captures differ before the comparison ends ({why})", ""]
    acc_a, acc_b = rep.acceptance["a"], rep.acceptance["b"]
    out.append("acceptance: mean accept length " + _acc(acc_a) + f" ({la}) vs " + _acc(acc_b) + f" ({lb}); "
               f"verify rows {acc_a['verify_rows']} vs {acc_b['verify_rows']}")
    o = rep.outputs
    line = f"outputs: {o['identical']} of {o['requests_compared']} requests identical"
    if o["differing"]:
        f = o["differing"][0]
        line += f"; first difference: request {f['request_id']} at output token {f['position']}"
    out.append(line)
    return "\n".join(out) + "\n"


def _acc(a: dict[str, Any]) -> str:
    m = a["mean_accept_length"]
    return "n/a" if m is None else f"{m:.3f}"


def differing_pairs(ra: TraceReader, rb: TraceReader, indexes: Iterable[int]) -> dict[int, list[Difference]]:
    """For a dashboard: the differences of the steps with these indexes in both traces (paired by index)."""
    out = {}
    for i in indexes:
        if not (ra.has_step(i) and rb.has_step(i)):
            continue  # one side does not hold it (a bundle's gap)
        d = compare_steps(ra.step(i, arrays=METADATA_ARRAYS), rb.step(i, arrays=METADATA_ARRAYS))
        if d:
            out[i] = d
    return out
