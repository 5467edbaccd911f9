"""Capture vs replay, kept across steps: the addresses and scalars each capture froze (I15, I16) and what each
graph page-table buffer last held (I19)."""

from __future__ import annotations

import numpy as np

from ..schema import GraphPhase, Step
from .context import PTR_NAMES, R2T, Ctx, cell, pages_read

# Arrays the replayed kernels read through the address the graph captured: the attention metadata and the graph's
# static batch inputs. Not: host mirrors (*_cpu, read by replay prep on the host), the recorder's attn_* copies, and
# out_cache_loc / positions, which an integration may record as the live tensors replay copies from (SGLang does).
_GRAPH_BOUND = frozenset(PTR_NAMES) | {"seq_lens", "req_pool_indices"}


class GraphState:
    """What each capture froze, keyed by (model, mode, step_id, bs)."""

    def __init__(self) -> None:
        self.captured: dict[tuple[str, str, int | None, int], Step] = {}

    def check(self, c: Ctx) -> None:
        """I15 / I16: a replay against its capture; a capture is remembered for the replays after it."""
        s = c.step
        key = (s.model, s.mode.value, s.step_id, s.padded_batch_size)
        if s.graph == GraphPhase.CAPTURE:
            self.captured[key] = s
            return
        if s.graph != GraphPhase.REPLAY:
            return
        cap = self.captured.get(key)
        if cap is None:
            return
        capa = {a.name: a for a in cap.arrays}
        for a in c.step.arrays:
            b = capa.get(a.name)
            # An address of 0 was not recorded.
            if b is None or a.name not in _GRAPH_BOUND or not a.data_ptr or not b.data_ptr:
                continue
            if a.data_ptr != b.data_ptr:
                c.v("I15", f"{a.name} at 0x{a.data_ptr:x}, but the graph captured 0x{b.data_ptr:x} "
                           f"(step {cap.index}): the kernels read the captured address", array=a.name,
                    found=f"0x{a.data_ptr:x}", expected=f"0x{b.data_ptr:x}",
                    related=[cell(f"{a.name}.data_ptr", value=f"0x{b.data_ptr:x}", step=cap.index)])
        frozen = cap.scalars.get("captured_max_seq_len_q", cap.scalars.get("max_seq_len_q"))
        now = s.scalars.get("max_seq_len_q")
        if frozen is not None and now is not None and now != frozen:
            name = "captured_max_seq_len_q" if "captured_max_seq_len_q" in cap.scalars else "max_seq_len_q"
            c.v("I16", f"max_seq_len_q = {now} at replay prep, the graph froze {frozen} at capture",
                array="max_seq_len_q", found=now, expected=frozen, related=[cell(name, value=frozen, step=cap.index)])
        for key_name, val in cap.scalars.items():
            # Every other scalar the capture says it froze into the graph (captured_X / frozen_X) binds X.
            for prefix in ("captured_", "frozen_"):
                if key_name.startswith(prefix) and key_name != "captured_max_seq_len_q":
                    base = key_name[len(prefix):]
                    got = s.scalars.get(base)
                    if base != "max_seq_len_q" and got is not None and got != val:
                        c.v("I16", f"{base} = {got} at replay prep, the graph froze {key_name} = {val} at capture "
                                   f"(step {cap.index})", array=base, found=got, expected=val,
                            related=[cell(key_name, value=val, step=cap.index)])


def _stale_cells(c: Ctx, b: int) -> int:
    """Cells of live row b the page-table grid marks stale (ui/views.py): read, inside the KV pool, and not the
    page req_to_token gives."""
    pt, starts = c.arr("page_table"), c.arr(R2T)
    assert pt is not None and starts is not None, "I19 judges only steps that record both"
    n = min(pages_read(c, b), starts.shape[1])
    row, want = pt[b, :n].astype(np.int64), starts[b, :n].astype(np.int64) // c.step.page_size
    npages = c.step.scalars.get("num_kv_pages")
    inside = (row >= 0) & (row < npages) if npages is not None else np.ones(n, dtype=bool)
    return int(np.count_nonzero((row != want) & inside))


class PageBuffers:
    """I19: the last recorded contents of each graph page-table buffer, keyed by (model, data_ptr)."""

    def __init__(self) -> None:
        self.held: dict[tuple[str, int], tuple[np.ndarray, int]] = {}  # values (-1 unknown), step they are from

    def check(self, c: Ctx, row_checks: bool) -> None:
        """I19: no page-table cell a replay reads is left over from what the buffer held before."""
        s, pt_a = c.step, c.a.get("page_table")
        if s.graph not in (GraphPhase.CAPTURE, GraphPhase.REPLAY) or pt_a is None or pt_a.values.ndim != 2:
            return
        key, pt = (s.model, pt_a.data_ptr), pt_a.values.astype(np.int64)
        prev = self.held.get(key)
        starts = c.arr("req_to_token_page_starts")
        if prev is not None and row_checks and s.graph == GraphPhase.REPLAY and starts is not None:
            held, since = prev
            for b, r in enumerate(s.requests):
                n = min(pages_read(c, b), held.shape[1] if b < held.shape[0] else 0)
                if not n:
                    continue
                want = starts[b, :n] // s.page_size
                stale = np.nonzero((pt[b, :n] != want) & (held[b, :n] == pt[b, :n]))[0]
                if stale.size:
                    j = int(stale[0])
                    marked = _stale_cells(c, b)
                    c.v("I19", f"page_table[{b}, {j}] = {int(pt[b, j])} is what the graph's buffer held at step "
                               f"{since}, but req_to_token gives page {int(want[j])} ({marked} stale cells in "
                               f"this row, {stale.size} of them left over from step {since}): replay prep did not "
                               "refresh it", r.request_id, array="page_table", row=b,
                        col=j, found=int(pt[b, j]), expected=int(want[j]),
                        related=[cell(R2T, b, j, int(starts[b, j])), cell("page_table", b, j, int(held[b, j]), since)])
        rows = max(pt.shape[0], prev[0].shape[0] if prev else 0)
        cols = max(pt.shape[1], prev[0].shape[1] if prev else 0)
        new = np.full((rows, cols), -1, dtype=np.int64)
        if prev is not None:
            new[: prev[0].shape[0], : prev[0].shape[1]] = prev[0]
        new[: pt.shape[0], : pt.shape[1]] = pt
        self.held[key] = (new, s.index)
