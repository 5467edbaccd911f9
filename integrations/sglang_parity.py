"""Upstream parity: the same batches through SGLang's own `TRTLLMHAAttnBackend` (loaded by `sglang_loader`) and
through ours (backend/trtllm_mha_backend.py + backend/graph_runner.py), field by field.

Fields compared for every prepared forward (the metadata the kernels consume):

- `cache_seqlens_int32`, `cu_seqlens_q`, `cu_seqlens_k`: values over all rows the kernel runs (padded rows too),
  and their dtypes (`*.dtype`);
- `max_seq_len_q`, `max_seq_len_k`: the Python scalars (`max_seq_len_k` only where the release has it: from 0.5.14
  upstream's metadata has no such field, and it is compared as absent, `(absent)` in the table);
- `page_table`: the row count, and for every row b the columns j < ceil(cache_seqlens[b] / P) the kernel reads
  (upstream's lengths);
- `kernel_q_len`: the q length the kernels run with: the live `max_seq_len_q` eagerly, the value frozen at
  capture for a graph;
- `reuses_capture_tensors` (replay only): the metadata object and every tensor address are the ones bound at
  capture.

`python -m specscope.integrations.sglang_parity` prints the parity table (mode x field) that docs/fidelity.md
quotes; tests/unit/test_sglang_parity.py checks the doc is current.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..backend.forward_batch import ForwardBatch
from ..backend.graph_runner import GraphRunner
from ..backend.memory import KVPool, PageAllocator, ReqToTokenPool, RequestKV
from ..backend.trtllm_mha_backend import TRTLLMHABackend
from ..tracer.schema import ForwardMode
from .sglang_driver import UpstreamGraphRunner, specscope_batch, step_backends, upstream_batch
from .sglang_loader import SglangNotFound, UpstreamSglang, load_upstream, make_model_runner
from .sglang_versions import facts_for

FIELDS = ("cache_seqlens_int32", "cache_seqlens_int32.dtype", "cu_seqlens_q", "cu_seqlens_q.dtype", "cu_seqlens_k",
          "cu_seqlens_k.dtype", "max_seq_len_q", "max_seq_len_k", "page_table", "kernel_q_len",
          "reuses_capture_tensors")
_TENSORS = ("cache_seqlens_int32", "cu_seqlens_q", "cu_seqlens_k", "page_table")
GRAPH_MODES = (ForwardMode.DECODE, ForwardMode.DRAFT_DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND)
ALL_MODES = (*GRAPH_MODES, ForwardMode.EXTEND)
PHASES = ("eager", "capture", "replay", "padded replay")


class _NoKernels:
    """The kernels of a backend that only prepares metadata: parity never runs attention."""

    name = "none"

    def decode(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Not available: the parity backends compare metadata only."""
        raise RuntimeError("the parity backends prepare metadata only; no attention kernel runs")

    def context(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Not available: the parity backends compare metadata only."""
        raise RuntimeError("the parity backends prepare metadata only; no attention kernel runs")


def _ptrs(md: Any) -> dict[str, int]:
    return {n: getattr(md, n).data_ptr() for n in _TENSORS if getattr(md, n, None) is not None}


class _Absent:
    """The value of a metadata field the release does not have (not a made-up value)."""

    def __repr__(self) -> str:
        return "absent"


ABSENT: Any = _Absent()


@dataclass
class Snapshot:
    """One prepared forward's metadata, as plain values."""

    values: dict[str, Any]


def snapshot(md: Any, *, kernel_q_len: int | None, reuses: bool | None) -> Snapshot:
    """The compared fields of a metadata object (upstream's `TRTLLMMHAMetadata` or ours)."""
    v: dict[str, Any] = {}
    if md is None:  # the backend prepared nothing for this mode (0.5.12 has no DRAFT_EXTEND_V2 graph path)
        v = {f: None for f in FIELDS}
        v["page_table"] = torch.zeros(0, 0, dtype=torch.int32)
        return Snapshot(v)
    for n in ("cache_seqlens_int32", "cu_seqlens_q", "cu_seqlens_k"):
        t = getattr(md, n)
        v[n] = None if t is None else t.detach().cpu().tolist()
        v[n + ".dtype"] = None if t is None else str(t.dtype)
    v["max_seq_len_q"] = int(md.max_seq_len_q)
    v["max_seq_len_k"] = int(md.max_seq_len_k) if hasattr(md, "max_seq_len_k") else ABSENT
    v["page_table"] = torch.zeros(0, 0, dtype=torch.int32) if md.page_table is None else md.page_table.detach().cpu()
    v["kernel_q_len"] = None if kernel_q_len is None else int(kernel_q_len)
    v["reuses_capture_tensors"] = reuses
    return Snapshot(v)


def diff(ref: Snapshot, got: Snapshot, page_size: int) -> set[str]:
    """Fields where `got` (ours) differs from `ref` (upstream); a field upstream does not have is not compared."""
    out = {f for f in FIELDS if f != "page_table" and ref.values[f] is not ABSENT
           and ref.values[f] != got.values[f]}
    a, b, lens = ref.values["page_table"], got.values["page_table"], ref.values["cache_seqlens_int32"] or []
    if a.shape[0] != b.shape[0]:
        out.add("page_table")
    else:
        for row, n in enumerate(lens):
            cols = -(-int(n) // page_size)
            if cols > a.shape[1] or cols > b.shape[1] or not torch.equal(a[row, :cols], b[row, :cols]):
                out.add("page_table")
                break
    return out


@dataclass
class Comparison:
    """One forward prepared by both backends."""

    mode: ForwardMode
    phase: str
    step_id: int | None
    batch_size: int  # live rows
    padded_batch_size: int
    page_size: int
    K: int
    T: int
    differs: set[str]
    detail: dict[str, tuple[Any, Any]] = field(default_factory=dict)

    def describe(self) -> str:
        """One line naming the forward and what differs."""
        sid = "" if self.step_id is None else f" #{self.step_id}"
        parts = [f"{f}: upstream {self.detail[f][0]!r} ours {self.detail[f][1]!r}" for f in sorted(self.differs)
                 if f in self.detail]
        return (f"{self.mode.value}{sid} {self.phase} bs {self.batch_size}/{self.padded_batch_size} P={self.page_size} "
                f"K={self.K} T={self.T}: " + "; ".join(parts))


def _compare(cmp: list[Comparison], mode: ForwardMode, phase: str, step_id: int | None, bs: int, pbs: int,
             ref: Snapshot, got: Snapshot, p: int, k: int, t: int) -> None:
    d = diff(ref, got, p)
    detail = {f: (ref.values[f], got.values[f]) for f in d if f != "page_table"}
    cmp.append(Comparison(mode, phase, step_id, bs, pbs, p, k, t, d, detail))


def _no_forward(ids: torch.Tensor, pos: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
    # Metadata only: the captured "model" does nothing (our GraphRunner runs the forward once at capture on a CPU).
    return torch.zeros(ids.shape[0], 1)


class ParityHarness:
    """Both backends over one req_to_token table, with graph runners for every graph mode."""

    def __init__(self, up: UpstreamSglang, *, page_size: int, K: int, T: int, num_steps: int, ladder: list[int],
                 context_len: int = 1024, faults: frozenset[str] = frozenset(),
                 graph_modes: Iterable[ForwardMode] = GRAPH_MODES) -> None:
        self.up, self.P, self.K, self.T, self.C = up, page_size, K, T, context_len
        self.ladder = ladder
        self.max_bs = max(ladder)
        self.num_slots = self.max_bs * 2
        self.r2t = ReqToTokenPool(self.num_slots, context_len, torch.device("cpu"))
        pages = self.num_slots * (-(-context_len // page_size)) + 2
        self.alloc = PageAllocator(pages, page_size)
        kv = KVPool(1, 2, page_size, 1, 8, torch.float32, torch.device("cpu"))  # the constructor wants one
        self.kv = kv

        def ours(step: int = 0) -> TRTLLMHABackend:
            return TRTLLMHABackend(req_to_token_pool=self.r2t, kv_pool=kv, page_size=page_size,
                                   max_context_len=context_len, num_draft_tokens=K, kernels=_NoKernels(),
                                   device=torch.device("cpu"), speculative_step_id=step, faults=faults)

        def mr(draft: bool) -> Any:
            return make_model_runner(req_to_token=self.r2t.req_to_token, page_size=page_size, context_len=context_len,
                                     num_draft_tokens=K, is_draft_worker=draft)

        n_draft = num_steps - 1
        # SGLang's target model captures one kind (TARGET_VERIFY with speculation, DECODE without), so the plain
        # decode comparisons get their own target backend on both sides.
        self.up_decode = up.backend_cls(mr(False))
        self.up_target = up.backend_cls(mr(False))
        self.up_draft = up.multi_step_cls(mr(True), 1, num_steps)
        self.up_draft_extend = up.backend_cls(mr(True))
        self.our_decode = ours()
        self.our_target = ours()
        self.our_draft = [ours(i) for i in range(n_draft)]
        self.our_draft_extend = ours()
        self.n_draft = n_draft
        self.faults = faults
        self.graph_modes = tuple(m for m in GRAPH_MODES if m in tuple(graph_modes))
        self.cmp: list[Comparison] = []
        self.up_runners: dict[ForwardMode, UpstreamGraphRunner] = {}
        self.our_runners: dict[tuple[ForwardMode, int | None], GraphRunner] = {}
        self.our_capture_ptrs: dict[tuple[ForwardMode, int | None, int], dict[str, int]] = {}
        self.up_capture_ptrs: dict[tuple[ForwardMode, int, int], dict[str, int]] = {}
        self.kvs: dict[int, RequestKV] = {}
        self._capture()

    # ---- wiring --------------------------------------------------------------------------------------
    def _tokens(self, mode: ForwardMode) -> int:
        return self.T if mode in (ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND) else 1

    def _up_backend(self, mode: ForwardMode) -> Any:
        return {ForwardMode.DECODE: self.up_decode, ForwardMode.TARGET_VERIFY: self.up_target,
                ForwardMode.DRAFT_DECODE: self.up_draft, ForwardMode.DRAFT_EXTEND: self.up_draft_extend,
                ForwardMode.EXTEND: self.up_target}[mode]

    def _our_backend(self, mode: ForwardMode, step: int | None) -> TRTLLMHABackend:
        if mode == ForwardMode.DRAFT_DECODE:
            return self.our_draft[step or 0]
        if mode == ForwardMode.DECODE:
            return self.our_decode
        return self.our_draft_extend if mode == ForwardMode.DRAFT_EXTEND else self.our_target

    def _template(self, be: TRTLLMHABackend, mode: ForwardMode, step: int | None) -> ForwardBatch:
        z = torch.zeros(1, dtype=torch.int64)
        return ForwardBatch(mode, 1, z, z, torch.ones(1, dtype=torch.int32), torch.ones(1, dtype=torch.int32), z, z,
                            self.r2t, self.kv, be, spec_step_id=step)

    def _capture(self) -> None:
        for mode in self.graph_modes:
            t = self._tokens(mode)
            be_up = self._up_backend(mode)
            upr = UpstreamGraphRunner(self.up, be_up, mode, tokens_per_req=t, ladder=self.ladder)
            self.up_runners[mode] = upr
            steps = list(range(self.n_draft)) if mode == ForwardMode.DRAFT_DECODE else [None]
            for s in steps:
                be = self._our_backend(mode, s)
                be.init_cuda_graph_state(self.max_bs, self.max_bs * t)
                self.our_runners[(mode, s)] = GraphRunner(
                    name=f"parity:{mode.value}:{s}", mode=mode, forward=_no_forward, backend=be,
                    template=self._template(be, mode, s), max_bs=self.max_bs, tokens_per_req=t,
                    device=torch.device("cpu"), pad_seq_len_from_live="padded-row-seqlen" in self.faults,
                    ladder=self.ladder)
            for bs in reversed(self.ladder):  # upstream captures largest first; so do we here
                upr.capture(bs)
                for i, s in enumerate(steps):
                    runner = self.our_runners[(mode, s)]
                    fb = runner.prepare_capture(bs)
                    runner.capture_forward(fb)
                    be = self._our_backend(mode, s)
                    md = be.forward_metadata
                    self.our_capture_ptrs[(mode, s, bs)] = _ptrs(md)
                    up_md = step_backends(be_up)[i].forward_metadata
                    self.up_capture_ptrs[(mode, i, bs)] = _ptrs(up_md)
                    _compare(self.cmp, mode, "capture", s, bs, bs,
                             snapshot(up_md, kernel_q_len=getattr(up_md, "max_seq_len_q", None), reuses=None),
                             snapshot(md, kernel_q_len=md.kernel_q_len, reuses=None), self.P, self.K, t)

    # ---- batches -------------------------------------------------------------------------------------
    def new_batch(self, rng: random.Random, bs: int, max_extra: int) -> list[tuple[int, int]]:
        """`bs` distinct request slots with random committed lengths S; KV pages allocated up to S + max_extra.

        Slots are re-drawn each time and their pages freed and re-allocated, so page tables change between
        batches (what stale-column bugs need to show)."""
        slots = rng.sample(range(1, self.num_slots + 1), bs)
        rows = []
        for slot in slots:
            old = self.kvs.pop(slot, None)
            if old is not None:
                old.release(self.alloc)
                self.r2t.req_to_token[slot].zero_()
            kv = RequestKV(slot)
            s = rng.randint(1, self.C - max_extra - 1)
            kv.ensure(s + max_extra, self.alloc, self.r2t)
            self.kvs[slot] = kv
            rows.append((slot, s))
        return rows

    def our_batch(self, mode: ForwardMode, rows: list[tuple[int, int]], step: int | None = None,
                  prefix: list[int] | None = None) -> ForwardBatch:
        """Our ForwardBatch for `rows` = (slot, S) under specscope's conventions (backend/forward_batch.py)."""
        return specscope_batch(self.r2t, self.kv, self._our_backend(mode, step), mode, rows,
                               T=self._tokens(mode), step=step, prefix=prefix)

    # ---- one forward through both --------------------------------------------------------------------
    def eager(self, mode: ForwardMode, rows: list[tuple[int, int]], prefix: list[int] | None = None) -> None:
        """Eager metadata from both backends for the same batch."""
        steps = list(range(self.n_draft)) if mode == ForwardMode.DRAFT_DECODE else [None]
        up_fb = upstream_batch(self.up, self.our_batch(mode, rows, steps[0], prefix))
        be_up = self._up_backend(mode)
        be_up.init_forward_metadata(up_fb)
        for i, s in enumerate(steps):
            fb = self.our_batch(mode, rows, s, prefix)
            be = self._our_backend(mode, s)
            be.init_forward_metadata(fb)
            up_md, md = step_backends(be_up)[i].forward_metadata, be.forward_metadata
            _compare(self.cmp, mode, "eager", s, len(rows), len(rows),
                     snapshot(up_md, kernel_q_len=getattr(up_md, "max_seq_len_q", None), reuses=None),
                     snapshot(md, kernel_q_len=md.kernel_q_len, reuses=None), self.P, self.K, self._tokens(mode))

    def replay(self, mode: ForwardMode, rows: list[tuple[int, int]]) -> None:
        """Replay prep on both sides (padded to the next captured size) for the same batch."""
        steps = list(range(self.n_draft)) if mode == ForwardMode.DRAFT_DECODE else [None]
        upr = self.up_runners[mode]
        view = upr.replay_prepare(upstream_batch(self.up, self.our_batch(mode, rows, steps[0])))
        bs = view.batch_size
        phase = "padded replay" if bs != len(rows) else "replay"
        for i, s in enumerate(steps):
            runner = self.our_runners[(mode, s)]
            runner.replay_prepare(self.our_batch(mode, rows, s))
            be = self._our_backend(mode, s)
            md = be.forward_metadata
            up_be = step_backends(upr.backend)[i]
            up_md = up_be.forward_metadata
            ours_reuse = md is be.graph_metadata.get((mode, bs)) and _ptrs(md) == self.our_capture_ptrs[(mode, s, bs)]
            up_reuse = (up_md is not None and up_md is upr.captured[(bs, i)]
                        and _ptrs(up_md) == self.up_capture_ptrs[(mode, i, bs)])
            _compare(self.cmp, mode, phase, s, len(rows), bs,
                     snapshot(up_md, kernel_q_len=upr.captured_q_len[(bs, i)], reuses=up_reuse),
                     snapshot(md, kernel_q_len=md.kernel_q_len, reuses=ours_reuse), self.P, self.K, self._tokens(mode))


def run_parity(up: UpstreamSglang, *, page_size: int, K: int, T: int, seed: int = 0, iterations: int = 4,
               faults: frozenset[str] = frozenset(), modes: Iterable[ForwardMode] = ALL_MODES,
               ladder: tuple[int, ...] = (1, 2, 4, 8)) -> list[Comparison]:
    """Eager, capture, replay and padded replay of `modes` on both backends; every comparison made."""
    rng = random.Random(seed * 1000 + page_size * 10 + K * 3 + T)
    modes = tuple(modes)
    h = ParityHarness(up, page_size=page_size, K=K, T=T, num_steps=max(K - 1, 2), ladder=list(ladder), faults=faults,
                      graph_modes=modes)
    sizes = [3, max(ladder), 1, 5, 2, 7, 4, 6]
    for it in range(iterations):
        bs = min(sizes[it % len(sizes)], max(ladder))
        rows = h.new_batch(rng, bs, max_extra=max(T, K) + 2)
        for mode in modes:
            if mode == ForwardMode.EXTEND:
                h.eager(mode, rows)  # no prefix: new tokens = the whole sequence
                pre = [rng.randint(0, s - 1) for _, s in rows]
                h.eager(mode, rows, prefix=pre)
                continue
            h.eager(mode, rows)
            if mode in GRAPH_MODES:
                h.replay(mode, rows)
    return h.cmp


# ---- the parity table --------------------------------------------------------------------------------------
# Differences that are not bugs, by (mode, phase, field): the reason is in docs/fidelity.md.
DOCUMENTED: dict[tuple[str, str, str], str] = {}

SWEEP_PAGE_SIZES = (16, 32, 64, 128)
SWEEP_KT = ((2, 2), (4, 4), (4, 2), (4, 6), (6, 5), (3, 4), (5, 5))  # (K, T): T = K, T < K, T > K


def sweep(up: UpstreamSglang, *, iterations: int = 3, faults: frozenset[str] = frozenset()) -> list[Comparison]:
    """The parity sweep: page sizes 16-128 x (K, T) pairs with T = K, T < K and T > K."""
    out: list[Comparison] = []
    for p in SWEEP_PAGE_SIZES:
        for k, t in SWEEP_KT:
            out += run_parity(up, page_size=p, K=k, T=t, iterations=iterations, faults=faults)
    return out


def parity_table_body(cmps: list[Comparison], version: str) -> str:
    """The markdown table of `parity_table`, without its header line: one row per (mode, phase), one column per
    field; `=` equal, `≠` a difference (documented ones carry their note), `·` not applicable, `(absent)` a field
    this release's metadata does not have."""
    cols = [f for f in FIELDS]
    absent = set(facts_for(version).fields_absent)
    head = "| mode | phase | forwards | " + " | ".join(f"`{c}`" for c in cols) + " |"
    sep = "|" + "---|" * (3 + len(cols))
    lines = [head, sep]
    for mode in ALL_MODES:
        for phase in PHASES:
            sel = [c for c in cmps if c.mode == mode and c.phase == phase]
            if not sel:
                continue
            cells = []
            for f in cols:
                if f == "reuses_capture_tensors" and "replay" not in phase:
                    cells.append("·")
                    continue
                if f in absent:
                    cells.append("(absent)")
                    continue
                n = sum(f in c.differs for c in sel)
                note = DOCUMENTED.get((mode.value, phase, f))
                cells.append("=" if n == 0 else (f"≠ ({note})" if note else f"**≠ {n}**"))
            lines.append(f"| {mode.value} | {phase} | {len(sel)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def sweep_header(versions: str) -> str:
    """The line naming what a sweep covered, for `versions` (one release or several)."""
    pks = ", ".join(str(p) for p in SWEEP_PAGE_SIZES)
    kts = ", ".join(f"K={k} T={t}" for k, t in SWEEP_KT)
    return f"sglang {versions}, page sizes {pks}; {kts}; batch sizes 1-8 over the capture ladder 1, 2, 4, 8.\n"


def parity_table(cmps: list[Comparison], version: str) -> str:
    """Markdown: the sweep's header line, then `parity_table_body`."""
    return sweep_header(version) + "\n" + parity_table_body(cmps, version)


# ---- mutation checks of the comparison ----------------------------------------------------------------------
_OVERRIDE = frozenset({"cache_seqlens_int32", "cu_seqlens_k", "max_seq_len_q", "max_seq_len_k", "kernel_q_len"})


@dataclass(frozen=True)
class Mutation:
    """A fault injected into OUR backend, and the (mode, phase) -> fields it must make differ from upstream."""

    fault: str
    page_size: int
    K: int
    T: int
    expected: dict[tuple[str, str], frozenset[str]]

    @property
    def name(self) -> str:
        """`fault-P16-K4-T2`."""
        return f"{self.fault}-P{self.page_size}-K{self.K}-T{self.T}"

    def expected_for(self, version: str) -> dict[tuple[str, str], frozenset[str]]:
        """The expected differences on `version`: a field the release does not have cannot differ."""
        absent = set(facts_for(version).fields_absent)
        return {k: frozenset(v - absent) for k, v in self.expected.items()}


MUTATIONS: tuple[Mutation, ...] = (
    Mutation("max-seq-len-q-override", 16, 4, 2,
             {("TARGET_VERIFY", p): _OVERRIDE for p in ("capture", "replay", "padded replay")}),
    # K < T: the refresh width comes from S + K, so the tail page-table columns go stale too.
    Mutation("max-seq-len-q-override", 16, 3, 5,
             {("TARGET_VERIFY", "capture"): _OVERRIDE, ("TARGET_VERIFY", "replay"): _OVERRIDE | {"page_table"},
              ("TARGET_VERIFY", "padded replay"): _OVERRIDE | {"page_table"}}),
    Mutation("stale-page-table", 32, 4, 4,
             {(m.value, p): frozenset({"page_table"}) for m in GRAPH_MODES for p in ("replay", "padded replay")}),
    Mutation("padded-row-seqlen", 64, 4, 4,
             {(m.value, "padded replay"): frozenset({"cache_seqlens_int32", "cu_seqlens_k"}) for m in GRAPH_MODES}),
    Mutation("zero-cache-seqlens-at-capture", 128, 4, 4,
             {("DRAFT_DECODE", "capture"): frozenset({"cache_seqlens_int32", "cu_seqlens_k"})}),
)


def differing(cmps: list[Comparison]) -> dict[tuple[str, str], frozenset[str]]:
    """(mode, phase) -> every field that differs in some forward of it."""
    out: dict[tuple[str, str], set[str]] = {}
    for c in cmps:
        if c.differs:
            out.setdefault((c.mode.value, c.phase), set()).update(c.differs)
    return {k: frozenset(v) for k, v in out.items()}


def run_mutation(up: UpstreamSglang, m: Mutation) -> dict[tuple[str, str], frozenset[str]]:
    """What differs from upstream with `m.fault` injected into our backend."""
    return differing(run_parity(up, page_size=m.page_size, K=m.K, T=m.T, iterations=4,
                                faults=frozenset([m.fault])))


Cells = dict[tuple[str, str], frozenset[str]]


@dataclass(frozen=True)
class MutationEffect:
    """What a fault changes in the comparison with one release, against the same batches without it."""

    added: Cells  # fields that differ from upstream with the fault and not without it
    removed: Cells  # fields that differ without the fault and not with it: the fault re-creates upstream's behaviour
    expected: Cells  # the fault's fields, less those upstream already differs in unmutated
    cells: frozenset[tuple[str, str]]  # the fault's (mode, phase) cells

    @property
    def caught(self) -> bool:
        """The comparison sees exactly the fault: it adds only its own fields, all of them wherever upstream did not
        already differ, and changes nothing outside its own (mode, phase) cells. A cell where the fault re-creates
        upstream's own bug (ours now equals upstream there: `removed`) cannot show the fault's fields, and is
        excused from showing them; where upstream equals ours unmutated nothing is removed, so this is exact."""
        none: frozenset[str] = frozenset()
        own = all(v <= self.expected.get(k, none) for k, v in self.added.items())
        missing = {k for k, v in self.expected.items() if self.added.get(k, none) != v}
        return own and set(self.removed) <= self.cells and missing <= set(self.removed)


def mutation_effect(up: UpstreamSglang, m: Mutation, *, baseline: bool = True) -> MutationEffect:
    """The mutation check of `m` on `up`. With `baseline`, the unmutated comparison of the same batches is run too,
    so a release whose upstream differs from ours (0.5.12's known bugs) still checks the fault: a field upstream
    already differs in cannot show it, and a fault that re-creates upstream's bug makes ours equal there
    (`removed`). Without it the unmutated comparison is taken as equal everywhere (what the sweep shows from
    0.5.13), and `added` is simply what differs."""
    got = run_mutation(up, m)
    base = differing(run_parity(up, page_size=m.page_size, K=m.K, T=m.T, iterations=4)) if baseline else {}
    none: frozenset[str] = frozenset()
    added = {k: v - base.get(k, none) for k, v in got.items() if v - base.get(k, none)}
    removed = {k: v - got.get(k, none) for k, v in base.items() if v - got.get(k, none)}
    want = m.expected_for(up.version)
    expected = {k: v - base.get(k, none) for k, v in want.items() if v - base.get(k, none)}
    return MutationEffect(added, removed, expected, frozenset(want))


# 0.5.12's upstream differs from ours unmutated, exactly where its known bugs are (docs/fidelity.md): PR #27495's
# verify line with T != K (eager and graphs), the verify capture's unfilled cu_seqlens_k, PR #26521's draft-decode
# capture, and no DRAFT_EXTEND_V2 graph path (no metadata at all: every field). Keyed by release; every other
# tested release equals ours in every field of every forward of the sweep.
_TV_0_5_12 = frozenset({"cache_seqlens_int32", "cu_seqlens_k", "max_seq_len_q", "max_seq_len_k", "kernel_q_len"})
_NO_METADATA = frozenset(f for f in FIELDS if f != "reuses_capture_tensors")
KNOWN_DIFFERENCES: dict[str, Cells] = {
    "0.5.12": {
        ("TARGET_VERIFY", "eager"): _TV_0_5_12 | {"cu_seqlens_q", "page_table"},
        ("TARGET_VERIFY", "capture"): _TV_0_5_12,
        ("TARGET_VERIFY", "replay"): _TV_0_5_12 | {"page_table"},
        ("TARGET_VERIFY", "padded replay"): _TV_0_5_12 | {"page_table"},
        ("DRAFT_DECODE", "capture"): frozenset({"cache_seqlens_int32", "cu_seqlens_k"}),
        ("DRAFT_EXTEND", "capture"): _NO_METADATA,
        ("DRAFT_EXTEND", "replay"): _NO_METADATA | {"reuses_capture_tensors"},
        ("DRAFT_EXTEND", "padded replay"): _NO_METADATA | {"reuses_capture_tensors"},
    },
}
# The faults that re-create a bug of a release (ours then equals upstream where it differed): fault -> the PR.
RECREATES: dict[str, dict[str, str]] = {
    "0.5.12": {"max-seq-len-q-override": "PR #27495", "zero-cache-seqlens-at-capture": "PR #26521"},
}


def main(argv: list[str] | None = None) -> int:
    """Print the parity table for the installed sglang (or `--sglang DIR`)."""
    ap = argparse.ArgumentParser(prog="python -m specscope.integrations.sglang_parity", description=main.__doc__)
    ap.add_argument("--sglang", help="folder holding an unpacked sglang wheel (default: the installed one)")
    ap.add_argument("--verbose", action="store_true", help="also print every differing forward")
    a = ap.parse_args(argv)
    try:
        up = load_upstream(a.sglang)
    except SglangNotFound as e:
        print(f"specscope: error: {e}", file=sys.stderr)
        return 2
    cmps = sweep(up)
    print(parity_table(cmps, up.version), end="")
    if a.verbose:
        for c in cmps:
            if c.differs:
                print(c.describe(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
