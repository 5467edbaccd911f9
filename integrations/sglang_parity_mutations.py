"""Mutation checks of the parity comparison: each fault injected into our backend must differ from upstream in
exactly the fields it corrupts; and what each release is known to differ in unmutated (its old bugs), with the
faults that re-create them."""

from __future__ import annotations

from dataclasses import dataclass

from .sglang_loader import UpstreamSglang
from .sglang_parity_compare import FIELDS, Comparison
from .sglang_parity_harness import GRAPH_MODES, run_parity
from .sglang_versions import facts_for

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

