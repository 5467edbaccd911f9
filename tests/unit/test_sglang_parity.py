"""Upstream parity: SGLang's own TRTLLMHAAttnBackend (from the installed wheel) against ours, field by field.

CI installs `sglang==0.5.13` with `--no-deps` (and 0.5.12 into `.sglang-0.5.12/`); without sglang installed these
tests skip. The installed sglang may be any tested release (`PYTHONPATH=.sglang/0.5.23` puts that one first): a
release equal to ours compares equal everywhere, 0.5.12 differs exactly where its known bugs are
(`sglang_parity_mutations.KNOWN_DIFFERENCES`). tests/unit/test_sglang_releases.py runs the same on every release
of CI's matrix.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections import defaultdict
from pathlib import Path

import pytest

if importlib.util.find_spec("sglang") is None:
    pytest.skip("sglang is not installed (python -m pip install --no-deps sglang==0.5.13)", allow_module_level=True)

from specscope.integrations.sglang_loader import load_upstream  # noqa: E402
from specscope.integrations.sglang_package import TMB_PATH  # noqa: E402
from specscope.integrations.sglang_parity import (  # noqa: E402
    SWEEP_KT,
    SWEEP_PAGE_SIZES,
    parity_table,
    parity_table_body,
    sweep,
)
from specscope.integrations.sglang_parity_harness import ALL_MODES, GRAPH_MODES, PHASES, run_parity  # noqa: E402
from specscope.integrations.sglang_parity_mutations import (  # noqa: E402
    KNOWN_DIFFERENCES,
    MUTATIONS,
    RECREATES,
    Mutation,
    differing,
    mutation_effect,
)
from specscope.integrations.sglang_versions import is_tested  # noqa: E402
from specscope.tracer.schema import ForwardMode  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
OLD = Path(os.environ.get("SPECSCOPE_SGLANG_0_5_12", ROOT / ".sglang-0.5.12"))


@pytest.fixture(scope="module")
def up():  # noqa: ANN201 - an UpstreamSglang
    u = load_upstream()
    if not is_tested(u.version):
        pytest.skip(f"sglang {u.version} is installed, not a tested release (no reference to compare with)")
    return u


@pytest.fixture(scope="module")
def comparisons(up):  # noqa: ANN001, ANN201
    return sweep(up)


RELEASES = ROOT / ".sglang"
# Where releases are expected (CI, or a checkout that unpacked them), a missing 0.5.12 fails instead of skipping.
EXPECTED = bool(os.environ.get("CI")) or RELEASES.is_dir()


def _old():  # noqa: ANN202
    """sglang 0.5.12: `.sglang-0.5.12/` (or $SPECSCOPE_SGLANG_0_5_12), else `.sglang/0.5.12/`."""
    for where in (OLD, RELEASES / "0.5.12"):
        if (where / "sglang" / TMB_PATH).is_file():
            return load_upstream(where)
    msg = f"sglang 0.5.12 not unpacked at {OLD} (pip install --no-deps --target {OLD} sglang==0.5.12)"
    if EXPECTED:
        pytest.fail(msg)
    pytest.skip(msg)


def test_loader_runs_the_wheels_own_file(up) -> None:  # noqa: ANN001
    """The backend class comes from the wheel's trtllm_mha_backend.py, and loading it imports no sglang module."""
    assert up.module.__file__ == str(up.root / TMB_PATH)
    assert up.backend_cls.__module__.endswith("trtllm_mha_backend")
    assert up.backend_cls.init_forward_metadata.__code__.co_filename == str(up.root / TMB_PATH)
    assert up.api == up.facts.graph_api and up.has_fixup_hook == up.facts.has_fixup_hook
    assert not any(m == "sglang" or m.startswith("sglang.") for m in sys.modules)


def test_every_mode_and_phase_is_compared(comparisons) -> None:  # noqa: ANN001
    """The sweep covers each mode x phase, page sizes 16-128, T = K, T < K, T > K, and padded replays."""
    seen = {(c.mode, c.phase) for c in comparisons}
    for mode in ALL_MODES:
        assert (mode, "eager") in seen
    for mode in GRAPH_MODES:
        for phase in PHASES:
            assert (mode, phase) in seen, (mode, phase)
    assert {c.page_size for c in comparisons} == set(SWEEP_PAGE_SIZES)
    kt = {(c.K, c.T) for c in comparisons if c.mode == ForwardMode.TARGET_VERIFY}
    assert any(k == t for k, t in kt) and any(t < k for k, t in kt) and any(t > k for k, t in kt)
    assert any(c.padded_batch_size > c.batch_size for c in comparisons if c.mode == ForwardMode.TARGET_VERIFY)
    steps = {c.step_id for c in comparisons if c.mode == ForwardMode.DRAFT_DECODE}
    assert steps >= {0, 1, 2}
    assert len(comparisons) > 1500


def test_metadata_equals_upstream(up, comparisons) -> None:  # noqa: ANN001
    """Every field of every forward equals upstream's (0.5.12: differs exactly in its known bugs' cells)."""
    if up.version in KNOWN_DIFFERENCES:
        assert differing(comparisons) == KNOWN_DIFFERENCES[up.version]
        return
    bad = [c.describe() for c in comparisons if c.differs]
    assert not bad, f"{len(bad)} forwards differ from sglang {up.version}, first: " + "\n".join(bad[:5])


def _doc_table(version: str) -> str:
    """The parity-table section of docs/fidelity.md whose heading names `version` (releases with equal tables share
    one section)."""
    doc = (ROOT / "docs" / "fidelity.md").read_text(encoding="utf-8")
    hits = [h for h in doc.split("\n### sglang ")[1:] if version in h.split("\n", 1)[0].split(", ")]
    assert len(hits) == 1, f"docs/fidelity.md has {len(hits)} parity-table sections naming sglang {version}"
    return hits[0]


def test_fidelity_doc_quotes_the_current_table(up, comparisons) -> None:  # noqa: ANN001
    """docs/fidelity.md carries the table this sweep produces, under a heading naming the release (regenerate:
    python scripts/sglang_fidelity.py)."""
    assert parity_table_body(comparisons, up.version) in _doc_table(up.version)


def _differing(cmps) -> dict[tuple[str, str], set[str]]:  # noqa: ANN001
    out: dict[tuple[str, str], set[str]] = defaultdict(set)
    for c in cmps:
        if c.differs:
            out[(c.mode.value, c.phase)] |= c.differs
    return dict(out)


@pytest.mark.parametrize("m", MUTATIONS, ids=[m.name for m in MUTATIONS])
def test_injected_fault_shows_in_exactly_its_fields(up, m: Mutation) -> None:  # noqa: ANN001
    """Mutation check of the comparison: a fault in OUR backend differs from upstream in exactly what it corrupts
    (on a release whose upstream differs unmutated, against the unmutated run:
    `sglang_parity_mutations.mutation_effect`)."""
    eff = mutation_effect(up, m, baseline=up.version in KNOWN_DIFFERENCES)
    assert eff.caught, (eff.added, eff.expected, eff.removed)
    assert bool(eff.removed) == (m.fault in RECREATES.get(up.version, {}))


def test_sglang_0_5_12_differs_where_its_known_bugs_are() -> None:
    """The same harness on 0.5.12 finds its pre-fix behaviour: target verify with T != K (PR #27495's line,
    eager and graphs), draft-decode capture with unfilled cache_seqlens (PR #26521), no DRAFT_EXTEND_V2 graph
    path; and nothing where T == K outside those."""
    old = _old()
    assert old.version == "0.5.12" and old.api == "capture_replay" and not old.has_fixup_hook
    same = _differing(run_parity(old, page_size=16, K=4, T=4, iterations=3, modes=[ForwardMode.TARGET_VERIFY]))
    # T == K: only the capture-time cu_seqlens_k (0.5.12's capture bound the buffer without filling it).
    assert same == {("TARGET_VERIFY", "capture"): {"cu_seqlens_k"}}
    tk = _differing(run_parity(old, page_size=16, K=4, T=2, iterations=3, modes=[ForwardMode.TARGET_VERIFY]))
    for phase in ("eager", "capture", "replay", "padded replay"):
        assert {"max_seq_len_q", "kernel_q_len", "cache_seqlens_int32"} <= tk[("TARGET_VERIFY", phase)]
    dd = _differing(run_parity(old, page_size=32, K=4, T=4, iterations=2, modes=[ForwardMode.DRAFT_DECODE]))
    assert dd == {("DRAFT_DECODE", "capture"): {"cache_seqlens_int32", "cu_seqlens_k"}}


def test_sweep_sizes_are_documented() -> None:
    """The K/T pairs of the sweep include T = K, T < K and T > K (what the table header says)."""
    assert any(k == t for k, t in SWEEP_KT) and any(t < k for k, t in SWEEP_KT) and any(t > k for k, t in SWEEP_KT)


def test_fidelity_doc_quotes_the_current_0_5_12_table() -> None:
    """The 0.5.12 reference table in docs/fidelity.md is current too."""
    old = _old()
    assert parity_table(sweep(old), old.version) in (ROOT / "docs" / "fidelity.md").read_text(encoding="utf-8")
