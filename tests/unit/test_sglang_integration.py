"""specscope.integrations.sglang on SGLang's own backend (the wheel's file): recording, the start-up hook, and the
seed bug caught in the seed's own code (0.5.12 vs 0.5.13)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

if importlib.util.find_spec("sglang") is None:
    pytest.skip("sglang is not installed (python -m pip install --no-deps sglang==0.5.13)", allow_module_level=True)

import torch  # noqa: E402
from specscope.integrations import sglang as ss  # noqa: E402
from specscope.integrations import sglang_hook  # noqa: E402
from specscope.integrations.sglang_drive import drive, without_fixup_hook  # noqa: E402
from specscope.integrations.sglang_loader import TMB_PATH, load_upstream  # noqa: E402
from specscope.tracer.checks import check_steps  # noqa: E402
from specscope.tracer.schema import ForwardMode, GraphPhase, Severity  # noqa: E402
from specscope.tracer.store import TraceReader  # noqa: E402
from specscope.ui.cli import main as cli_main  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
OLD = Path(os.environ.get("SPECSCOPE_SGLANG_0_5_12", ROOT / ".sglang-0.5.12"))
STANDARD = ("cache_seqlens", "cu_seqlens_q", "cu_seqlens_k", "page_table", "seq_lens", "seq_lens_cpu",
            "req_pool_indices", "positions", "out_cache_loc", "req_to_token_page_starts")


def _old():  # noqa: ANN202
    if not (OLD / "sglang" / TMB_PATH).is_file():
        pytest.skip(f"sglang 0.5.12 not unpacked at {OLD} (pip install --no-deps --target {OLD} sglang==0.5.12)")
    return load_upstream(OLD)


def _read(path: Path):  # noqa: ANN202
    with TraceReader(path) as r:
        steps = list(r.steps())
        run = r.run
    return steps, list(check_steps(steps, run))


def _checker_padding_offset(v) -> bool:  # noqa: ANN001
    """tracer/checks.py `_check_padding` reads one out_cache_loc token per padded row outside the uniform modes;
    DRAFT_EXTEND_V2 rows have T tokens, so a padded draft-extend replay reports a live token's slot (I18). A checker
    issue, reported to its owner; recognised here so these tests hold before and after its fix."""
    return (v.check_id == "I18" and "DRAFT_EXTEND" in v.message
            and getattr(v, "array", "out_cache_loc") == "out_cache_loc")


def _errors(vs):  # noqa: ANN001, ANN202
    return [v for v in vs if v.severity == Severity.ERROR and not _checker_padding_offset(v)]


def _same(a, b) -> bool:  # noqa: ANN001
    if a.values.keys() != b.values.keys():
        return False
    for k, x in a.values.items():
        y = b.values[k]
        if isinstance(x, torch.Tensor):
            if not torch.equal(x, y):
                return False
        elif x != y:
            return False
    return True


@pytest.mark.parametrize("version", ["0.5.13", "0.5.12"])
def test_recording_does_not_change_what_the_backend_computes(tmp_path: Path, version: str) -> None:
    """The same drive on two separate loads of the wheel, one instrumented and recorded, one plain: every
    prepared metadata field is identical."""
    def load():  # noqa: ANN202
        return load_upstream() if version == "0.5.13" else _old()
    plain = drive(load(), None, K=4, T=2, plan_stream=version == "0.5.13")
    recorded = drive(load(), tmp_path / "t.db", K=4, T=2, plan_stream=version == "0.5.13")
    assert len(plain) == len(recorded) > 20
    assert all(_same(a, b) for a, b in zip(plain, recorded, strict=True))


def test_trace_holds_what_the_kernels_consume(tmp_path: Path) -> None:
    """Every prepared forward is a step with the standard arrays, the graph phase, padded bs and the frozen q
    length; the recorded metadata is the backend's own tensors (addresses included)."""
    up = load_upstream()
    drive(up, tmp_path / "t.db", K=4, T=2, plan_stream=True)
    steps, _ = _read(tmp_path / "t.db")
    modes = {(s.mode, s.graph) for s in steps}
    for m in (ForwardMode.DRAFT_DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND):
        assert (m, GraphPhase.CAPTURE) in modes and (m, GraphPhase.REPLAY) in modes
    assert (ForwardMode.EXTEND, GraphPhase.EAGER) in modes
    assert {s.step_id for s in steps if s.mode == ForwardMode.DRAFT_DECODE} == {0, 1}
    verify = [s for s in steps if s.mode == ForwardMode.TARGET_VERIFY and s.graph == GraphPhase.REPLAY]
    assert any(s.padded_batch_size > s.batch_size for s in verify)
    for s in steps:
        if s.graph != GraphPhase.CAPTURE:
            names = {a.name for a in s.arrays}
            assert set(STANDARD) <= names, (s.index, set(STANDARD) - names)
    for s in verify:
        assert s.tokens_per_request == 2 and s.num_draft_tokens == 4
        assert s.scalars["kernel_q_len"] == s.scalars["captured_max_seq_len_q"] == 2
        assert s.scalars["fixup_hook_ok"] == 1 and s.scalars["acceptance_recorded"] == 1
        assert all(1 <= r.accept_length <= 2 and len(r.draft_tokens) == 1 for r in s.requests)
        assert s.array("draft_tokens") is not None and s.array("cache_seqlens").dtype == "int32"
    # Replays hand the kernels the tensors bound at capture: same addresses as the capture of that size.
    cap = {(s.mode, s.step_id, s.padded_batch_size): s for s in steps if s.graph == GraphPhase.CAPTURE}
    for s in steps:
        if s.graph == GraphPhase.REPLAY:
            c = cap[(s.mode, s.step_id, s.padded_batch_size)]
            assert s.array("cache_seqlens").data_ptr == c.array("cache_seqlens").data_ptr != 0


def test_each_iteration_runs_its_batch_size(tmp_path: Path) -> None:
    """A batch short of its size admits every missing request in that iteration's prefill, so each iteration's
    verify runs exactly its batch size (capped by the largest graph)."""
    drive(load_upstream(), tmp_path / "t.db", K=4, T=2, iterations=5, batch_sizes=(4, 2, 3, 8, 1))
    steps, _ = _read(tmp_path / "t.db")
    eager = [s.batch_size for s in steps if s.graph == GraphPhase.EAGER]
    verify = [s.batch_size for s in steps if s.mode == ForwardMode.TARGET_VERIFY and s.graph == GraphPhase.REPLAY]
    assert verify == [4, 2, 3, 4, 1]
    assert eager == [4, 1, 1]  # 0 -> 4, 2 -> 3, 3 -> 4 requests: the prefill admits the missing ones


def test_seed_bug_caught_in_0_5_12(tmp_path: Path) -> None:
    """0.5.12's target-verify graph uses the backend's cached K for a runner built for T != K (the line PR #27495
    removed): the catalogue flags I6 at the first replay (already at capture), with I3 / I5 / I12 / I13 after."""
    old = _old()
    drive(old, tmp_path / "old.db", K=4, T=2)
    steps, vs = _read(tmp_path / "old.db")
    first_replay = min(s.index for s in steps if s.mode == ForwardMode.TARGET_VERIFY and s.graph == GraphPhase.REPLAY)
    at = {v.check_id for v in vs if v.step == first_replay}
    assert "I6" in at or "I16" in at
    assert {"I6", "I3", "I5", "I13"} <= at
    first_capture = min(s.index for s in steps if s.mode == ForwardMode.TARGET_VERIFY)
    assert any(v.check_id == "I6" and v.step == first_capture for v in vs)
    # 0.5.12's draft-decode capture also binds cache_seqlens without filling it (PR #26521, G1).
    assert any(v.check_id == "I17" and "DRAFT_DECODE" in v.message for v in vs)


def test_same_drive_is_clean_on_0_5_13(tmp_path: Path) -> None:
    """The same driver on 0.5.13: no error (I7, a warning, stays: the verify graph buffer has stride K)."""
    up = load_upstream()
    drive(up, tmp_path / "new.db", K=4, T=2)
    _, vs = _read(tmp_path / "new.db")
    assert _errors(vs) == []
    assert {v.check_id for v in vs if v.severity == Severity.WARNING} <= {"I7"}


def test_missing_fixup_hook_is_recorded_as_I28(tmp_path: Path) -> None:
    """Under the plan-stream call path, a backend class without update_verify_buffers_to_fill_after_draft raises
    NotImplementedError as SGLang would; the trace keeps the verify step with the call error, and I28 fires.
    0.5.12 lacks the hook itself; for 0.5.13 a subclass resolves it to the base class's raising default."""
    old = _old()
    assert not old.has_fixup_hook
    cases = [(old, None), (load_upstream(), "subclass")]
    for up, how in cases:
        path = tmp_path / f"{up.version}.db"
        cls = without_fixup_hook(up) if how else None
        with pytest.raises(NotImplementedError):
            drive(up, path, K=4, plan_stream=True, backend_cls=cls)
        steps, vs = _read(path)
        last = steps[-1]
        assert last.mode == ForwardMode.TARGET_VERIFY and last.graph == GraphPhase.REPLAY
        assert [(e.call, e.error_type) for e in last.errors] == [
            ("update_verify_buffers_to_fill_after_draft", "NotImplementedError")]
        assert any(v.check_id == "I28" and v.step == last.index for v in vs)
    ok = tmp_path / "ok.db"
    drive(load_upstream(), ok, K=4, plan_stream=True)
    assert not any(v.check_id == "I28" for v in _read(ok)[1])


def test_uninstrument_restores_the_classes() -> None:
    """uninstrument puts the original methods back; a class recorded with no tracer open runs unchanged."""
    up = load_upstream()
    cls = up.backend_cls
    before = {k: v for k, v in vars(cls).items() if callable(v)}
    ss.instrument(up.module)
    assert "_specscope_patched" in vars(cls)
    ss.uninstrument(up.module)
    after = {k: v for k, v in vars(cls).items() if callable(v)}
    assert before == after


def test_startup_hook_records_a_process_that_imports_sglang(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """`specscope sglang-hook install` + SPECSCOPE_TRACE: a fresh interpreter that imports
    sglang.srt.layers.attention.trtllm_mha_backend through the normal import system (packages registered without
    their server-stack __init__, see install_as_sglang) gets the classes patched and records into the trace."""
    site = tmp_path / "site"
    site.mkdir()
    assert cli_main(["sglang-hook", "install", "--site-packages", str(site)]) == 0
    assert cli_main(["sglang-hook", "status", "--site-packages", str(site)]) == 0
    script = textwrap.dedent(f"""
        import site, sys
        site.addsitedir({str(site)!r})  # processes the .pth like site-packages at start-up
        from specscope.integrations.sglang_loader import install_as_sglang
        from specscope.integrations.sglang_drive import drive
        up = install_as_sglang()
        import sglang.srt.layers.attention.trtllm_mha_backend as tmb
        assert "_specscope_patched" in vars(tmb.TRTLLMHAAttnBackend), "not patched"
        drive(up, None, K=3, T=3, iterations=3)
    """)
    env = dict(os.environ, SPECSCOPE_TRACE=str(tmp_path / "live-{pid}.db"))
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    traces = list(tmp_path.glob("live-*.db"))
    assert len(traces) == 1 and "recording SGLang's TRTLLM MHA backend" in r.stderr
    steps, vs = _read(traces[0])
    assert len(steps) > 10 and _errors(vs) == []
    assert cli_main(["sglang-hook", "uninstall", "--site-packages", str(site)]) == 0
    assert not list(site.glob("*.pth"))
    assert cli_main(["sglang-hook", "status", "--site-packages", str(site)]) == 1


def test_hook_does_nothing_without_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """boot() with SPECSCOPE_TRACE unset installs no finder (what every start-up of the environment runs)."""
    monkeypatch.delenv("SPECSCOPE_TRACE", raising=False)
    before = list(sys.meta_path)
    sglang_hook.boot()
    assert sys.meta_path == before
    assert sglang_hook.SglangFinder().find_spec("json", None) is None  # only its one module name is touched


def test_hook_bad_directory_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Bad input: one `specscope: error:` line, exit 2."""
    assert cli_main(["sglang-hook", "install", "--site-packages", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specscope: error:") and err.count("\n") == 1
