"""CI's SGLang release matrix: upstream's own TRTLLM MHA backend of each release, loaded from its own folder
`.sglang/<version>/` (`.ci/sglang-installs.sh`), against specscope's mirror and under specscope's recorder.

Every release of MATRIX gets the same, complete treatment (no reduced sweep; measured cost in docs/sglang.md):

- the full parity sweep (`sglang_parity.sweep`: page sizes 16-128 x seven (K, T) pairs, every mode x phase,
  padded replays), equal to ours in every field of every forward; 0.5.12 differs exactly where its known bugs are;
- the five mutation checks of the comparison (`sglang_parity_mutations.MUTATIONS`), each fault differing from
  upstream in exactly its fields; on 0.5.12, whose unmutated sweep already differs, against the unmutated run of
  the same batches (`sglang_parity_mutations.mutation_effect`), where the two faults that re-create its bugs make
  ours equal to it;
- the two drives of docs/fidelity.md (K=4 with T=4 and T=2) recorded and judged by the catalogue: clean but for
  the I7 warning from 0.5.13, graph replays recorded without metadata from 0.5.15, I6 at 0.5.12's first verify
  replay; and docs/fidelity.md carries the release's parity table and its summary row as measured here.

A missing folder fails the test when releases are expected (CI set, or `.sglang/` exists); elsewhere (a checkout
that never ran `.ci/sglang-installs.sh`) it is skipped with that reason. Test ids name the release.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from specscope.integrations import sglang as ss
from specscope.integrations.sglang_loader import UpstreamSglang, load_upstream
from specscope.integrations.sglang_package import TMB_PATH
from specscope.integrations.sglang_parity import SWEEP_KT, SWEEP_PAGE_SIZES, parity_table_body, sweep
from specscope.integrations.sglang_parity_compare import Comparison
from specscope.integrations.sglang_parity_harness import ALL_MODES, GRAPH_MODES, PHASES
from specscope.integrations.sglang_parity_mutations import (
    KNOWN_DIFFERENCES,
    MUTATIONS,
    RECREATES,
    Mutation,
    differing,
    mutation_effect,
)
from specscope.integrations.sglang_versions import TESTED_RELEASES
from specscope.tracer.schema import ForwardMode, GraphPhase
from specscope.tracer.store import TraceReader
from specscope.ui.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[2]
RELEASES = Path(os.environ.get("SPECSCOPE_SGLANG_RELEASES") or ROOT / ".sglang")
EXPECTED = bool(os.environ.get("CI")) or RELEASES.is_dir()
# The releases where what upstream does changes: before and after PR #27495 (0.5.12 / 0.5.13), max_seq_len_k
# dropped and the device page table (0.5.14), graph metadata inside the graph (0.5.15), ragged verify and the
# capture width (0.5.16), the unified KV pool (0.5.19), the newest (0.5.23).
MATRIX = ("0.5.12", "0.5.13", "0.5.14", "0.5.15", "0.5.16", "0.5.19", "0.5.23")
NEWER = tuple(v for v in MATRIX if v != "0.5.12")


def _fidelity() -> types.ModuleType:
    """scripts/sglang_fidelity.py, the page's writer: its drives and summary row are what the page quotes."""
    spec = importlib.util.spec_from_file_location("_sglang_fidelity", ROOT / "scripts" / "sglang_fidelity.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve their module by name
    spec.loader.exec_module(mod)
    return mod


FID = _fidelity()


def folder(version: str) -> Path:
    """The release's folder, or fail (releases expected) / skip (a checkout without them)."""
    where = RELEASES / version
    if (where / "sglang" / TMB_PATH).is_file():
        return where
    msg = f"sglang {version} not unpacked at {where} (bash .ci/sglang-installs.sh)"
    if EXPECTED:
        pytest.fail(msg)
    pytest.skip(msg)


def load(version: str) -> UpstreamSglang:
    """A fresh load of the release from its own folder (each load has its own modules and buffers)."""
    up = load_upstream(folder(version))
    assert up.version == version
    return up


_SWEEPS: dict[str, list[Comparison]] = {}


def swept(version: str) -> list[Comparison]:
    """The full parity sweep of the release, run once per session."""
    if version not in _SWEEPS:
        _SWEEPS[version] = sweep(load(version))
    return _SWEEPS[version]


def _code_files(mod: types.ModuleType) -> set[str]:
    """The source files of every function and class the module's namespace holds, one level into classes and into
    the stand-in modules it holds (where its imported upstream names came from; real packages such as torch are
    not walked)."""
    out: set[str] = set()
    fns = (types.FunctionType, types.MethodType, classmethod, staticmethod, property)

    def code_of(obj: object) -> None:
        if isinstance(obj, property):
            obj = obj.fget
        if isinstance(obj, (classmethod, staticmethod, types.MethodType)):
            obj = obj.__func__
        if isinstance(obj, types.FunctionType):
            out.add(obj.__code__.co_filename)

    def add(obj: object) -> None:
        if isinstance(obj, fns):
            code_of(obj)
        elif isinstance(obj, type):
            for v in vars(obj).values():
                if isinstance(v, fns):
                    code_of(v)

    for v in list(vars(mod).values()):
        if isinstance(v, types.ModuleType):
            if getattr(v, "__spec__", None) is None:  # a stand-in or an upstream file loaded by the loader
                for w in list(vars(v).values()):
                    add(w)
        else:
            add(v)
    return out


def test_matrix_is_tested_releases() -> None:
    """Every release of the matrix is one specscope declares tested and the install script unpacks."""
    script = (ROOT / ".ci" / "sglang-installs.sh").read_text(encoding="utf-8")
    assert set(MATRIX) <= set(TESTED_RELEASES)
    assert all(v in script for v in MATRIX)


@pytest.mark.parametrize("version", MATRIX)
def test_release_loads_from_its_own_folder_only(version: str) -> None:
    """Two releases loaded in one process: each load's backend, base class, extracted helpers and Triton kernels
    are executed from its own folder's files, never the other's, and no `sglang` module is imported."""
    other = "0.5.23" if version != "0.5.23" else "0.5.12"
    ups = [load(version), load(other)]
    roots = [str(u.root) + os.sep for u in ups]
    for up, root in zip(ups, roots, strict=True):
        assert up.module.__file__ == str(up.root / TMB_PATH) and up.root == (folder(up.version) / "sglang").resolve()
        files = _code_files(up.module) | _code_files(up.base_module)
        for k in up.kernel_modules.values():
            assert str(k.__file__).startswith(root)
            files |= _code_files(k)
        upstream = {f for f in files if f"{os.sep}.sglang" in f or f"{os.sep}sglang{os.sep}" in f}
        assert upstream and all(f.startswith(root) for f in upstream), sorted(upstream - {
            f for f in upstream if f.startswith(root)})[:3]
        assert bool(up.kernel_modules) == up.facts.page_table_on_device
    assert not any(m == "sglang" or m.startswith("sglang.") for m in sys.modules)


@pytest.mark.parametrize("version", MATRIX)
def test_sweep_covers_every_mode_and_phase(version: str) -> None:
    """The sweep compares each mode x phase, every page size and (K, T) pair, padded replays and every draft
    step; 0.5.12 included (its DRAFT_EXTEND_V2 graphs prepare nothing, and are compared as such)."""
    cmps = swept(version)
    seen = {(c.mode, c.phase) for c in cmps}
    assert {(m, "eager") for m in ALL_MODES} | {(m, p) for m in GRAPH_MODES for p in PHASES} <= seen
    assert {c.page_size for c in cmps} == set(SWEEP_PAGE_SIZES)
    assert {(c.K, c.T) for c in cmps if c.mode == ForwardMode.TARGET_VERIFY} == set(SWEEP_KT)
    assert any(c.padded_batch_size > c.batch_size for c in cmps if c.phase == "padded replay")
    assert {c.step_id for c in cmps if c.mode == ForwardMode.DRAFT_DECODE} >= {0, 1, 2}
    assert len(cmps) == 1608


@pytest.mark.parametrize("version", NEWER)
def test_every_forward_equals_upstream(version: str) -> None:
    """0.5.13 and later: every compared field of every forward equals upstream's."""
    bad = [c.describe() for c in swept(version) if c.differs]
    assert not bad, f"{len(bad)} forwards differ from sglang {version}, first: " + "\n".join(bad[:5])


def test_0_5_12_differs_exactly_where_its_known_bugs_are() -> None:
    """The sweep on 0.5.12: differences only in the (mode, phase, field) cells of its known bugs
    (`sglang_parity_mutations.KNOWN_DIFFERENCES`); with T == K the verify differs only in the capture's
    cu_seqlens_k; DECODE, EXTEND and draft-decode eager and replays equal ours."""
    cmps = swept("0.5.12")
    assert differing(cmps) == KNOWN_DIFFERENCES["0.5.12"]
    same_kt = differing([c for c in cmps if c.K == c.T and c.mode == ForwardMode.TARGET_VERIFY])
    assert same_kt == {("TARGET_VERIFY", "capture"): frozenset({"cu_seqlens_k"})}


MUTATION_CASES = [pytest.param(v, m, id=f"{v}-{m.name}") for v in MATRIX for m in MUTATIONS]


@pytest.mark.parametrize(("version", "m"), MUTATION_CASES)
def test_injected_fault_shows_in_exactly_its_fields(version: str, m: Mutation) -> None:
    """Mutation check of the comparison on each release: a fault in OUR backend differs from upstream in exactly
    the fields it corrupts (a field the release lacks cannot differ). On 0.5.12, whose upstream differs unmutated,
    against the unmutated run of the same batches: the fault adds its fields where upstream did not already differ,
    changes nothing outside its cells, and the faults that re-create 0.5.12's bugs make ours equal to it there."""
    known = version in KNOWN_DIFFERENCES
    eff = mutation_effect(load(version), m, baseline=known)
    assert eff.caught, (eff.added, eff.expected, eff.removed)
    assert bool(eff.removed) == (m.fault in RECREATES.get(version, {})), eff.removed
    if not known:
        assert eff.added == m.expected_for(version)


_DRIVES: dict[str, list[Any]] = {}


def drives(version: str, tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    """The page's two drives of the release (K=4 T=4, K=4 T=2), recorded and checked, once per session."""
    if version not in _DRIVES:
        d = tmp_path_factory.mktemp(f"drives-{version}")
        _DRIVES[version] = [FID.run_drive(load(version), k, t, d) for k, t in FID.DRIVES]
        _DRIVES[version].append(d)
    return _DRIVES[version]


@pytest.mark.parametrize("version", MATRIX)
def test_recorded_drives_are_judged_as_documented(version: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """From 0.5.13 both drives are clean but for the I7 warning of T != K, `specscope check` exits 0, and from
    0.5.15 every graph replay is a step without metadata, named in the run config; on 0.5.12 the seed bug's drive
    is caught by I6 at the first verify replay (and at capture)."""
    d44, d42, where = drives(version, tmp_path_factory)
    path = where / f"drive-{version}-K4-T2.db"
    with TraceReader(path) as r:
        steps = list(r.steps())
        nr = r.run.config.get("not_recorded", {})
        assert "recording_problems" not in r.meta()
    graphs = [s for s in steps if s.graph == GraphPhase.REPLAY]
    assert d44.steps > 30 and d42.steps > 30 and graphs
    in_graph = version not in ("0.5.12", "0.5.13", "0.5.14")
    assert (nr.get("replay_metadata") == ss.REPLAY_METADATA_IN_GRAPH) == in_graph
    assert all((not s.arrays) == in_graph for s in graphs)
    assert d44.replays_without_metadata == (len(graphs) if in_graph else 0)
    if version == "0.5.12":
        from specscope.tracer.checks import check_steps

        with TraceReader(path) as r:
            vs = list(check_steps(steps, r.run))
        first = min(s.index for s in graphs if s.mode == ForwardMode.TARGET_VERIFY)
        assert any(v.check_id == "I6" and v.step == first for v in vs)
        assert cli_main(["check", str(path)]) == 1
        return
    for dr in (d44, d42):
        assert not dr.errors and set(dr.warnings) <= {"I7"}, dr.verdict()
    assert not d44.warnings and d42.warnings
    assert cli_main(["check", str(path)]) == 0


@pytest.mark.parametrize("version", MATRIX)
def test_fidelity_doc_carries_the_release(version: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """docs/fidelity.md holds this release's parity table under a heading that names it, and its summary row as
    measured here (all but the two timing columns); regenerate with `python scripts/sglang_fidelity.py`."""
    doc = (ROOT / "docs" / "fidelity.md").read_text(encoding="utf-8")
    body = parity_table_body(swept(version), version)
    headings = [h for h in doc.split("\n### sglang ")[1:] if version in h.split("\n", 1)[0].split(", ")]
    assert len(headings) == 1 and body in headings[0], f"no current parity table of {version} in docs/fidelity.md"
    d44, d42, _ = drives(version, tmp_path_factory)
    up = load(version)
    cmps = swept(version)
    caught = len(MUTATIONS)  # test_injected_fault_shows_in_exactly_its_fields checks each one
    row = FID.summary_row(FID.ReleaseResult(version, up, cmps, caught, [d44, d42], 0.0, 0.0))
    want = row.split(" | ")[:-2]
    rows = [line for line in doc.splitlines() if line.startswith(f"| {version} | ")]
    assert len(rows) == 1 and rows[0].split(" | ")[:-2] == want, (rows, want)
    assert all(float(x) > 0 for x in rows[0].rstrip(" |").split(" | ")[-2:])

