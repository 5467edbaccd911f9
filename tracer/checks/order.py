"""Per-step stream order and call errors: plan-stream work after its producers (I21), launches after the metadata
they consume (I22), and the calls that raised (I28, K1)."""

from __future__ import annotations

from ..schema import StreamSpan
from .context import Ctx

HOOK = "update_verify_buffers_to_fill_after_draft"


def _us(ns: int) -> str:
    return f"{ns / 1000:.1f} us"


def _ordering(c: Ctx, check_id: str, later: StreamSpan, earlier: StreamSpan, what: str, waits_recorded: bool) -> None:
    """`later` must start after `earlier` ends and be ordered after it by a recorded wait edge (when the trace
    records wait edges at all: schema 1 did not)."""
    if later.stream == earlier.stream:
        return  # one stream runs in order
    edge = not waits_recorded or any(
        (w.stream, w.on_stream, w.on_span) == (later.stream, earlier.stream, earlier.name) for w in c.step.waits)
    early = later.start_ns < earlier.end_ns
    if not early and edge:
        return
    gap = f"{later.stream} '{later.name}' started {_us(earlier.end_ns - later.start_ns)} before {earlier.stream} " \
          f"'{earlier.name}' ended" if early else f"{later.stream} '{later.name}' started after {earlier.stream} " \
          f"'{earlier.name}' ended only by chance"
    why = "no wait edge orders it after them" if not edge else "although a wait edge was recorded"
    c.v(check_id, f"{what}: {gap}; {why}", array=f"span:{later.stream}:{later.name}",
        found=later.start_ns, expected=f">= {earlier.end_ns} with a wait on {earlier.stream} '{earlier.name}'")


def check_streams(c: Ctx, waits_recorded: bool = True) -> None:
    """I21 / I22: plan-stream work after its producers, launches after the metadata they read."""
    spans = c.step.spans
    prods = [sp for sp in spans if sp.name == "producers"]
    metas = [sp for sp in spans if sp.name == "metadata"]
    fwds = [sp for sp in spans if sp.name == "forward"]
    before = len(c.out)
    for m in metas:
        for p in prods:
            if len(c.out) == before:
                _ordering(c, "I21", m, p, "metadata work is not ordered after the producers of seq_lens and "
                                          "req_to_token", waits_recorded)
    before = len(c.out)
    for f in fwds:
        for m in metas:
            if len(c.out) == before:
                _ordering(c, "I22", f, m, "the launch is not ordered after the metadata it consumes", waits_recorded)


def check_errors(c: Ctx) -> None:
    """I28 (the plan-stream hook) and K1 (any other call): every call the step made succeeded."""
    for e in c.step.errors:
        text = f"{e.call} raised {e.error_type}: {e.message}"
        if e.call == HOOK:
            c.v("I28", f"{text} (the backend lacks the plan-stream fix-up hook)", array=f"call:{e.call}",
                found=e.error_type, expected="no error")
        else:
            end = " (fatal: the device context is gone and the run ended here)" if e.fatal else ""
            c.v("K1", text + end, array=f"call:{e.call}", found=e.error_type, expected="no error")
