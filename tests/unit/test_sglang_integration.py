"""specscope.integrations.sglang on SGLang's own backend (the wheel's file): recording, the start-up hook, and the
seed bug caught in the seed's own code (0.5.12 vs 0.5.13)."""

from __future__ import annotations

import importlib.util
import json
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
from specscope.integrations.sglang_loader import load_upstream  # noqa: E402
from specscope.integrations.sglang_package import TMB_PATH  # noqa: E402
from specscope.integrations.sglang_provenance import features  # noqa: E402
from specscope.integrations.sglang_steps import StepBuilder  # noqa: E402
from specscope.tracer.checks import check_steps  # noqa: E402
from specscope.tracer.schema import ForwardMode, GraphPhase, Severity  # noqa: E402
from specscope.tracer.store import TraceReader  # noqa: E402
from specscope.ui.cli import main as cli_main  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
OLD = Path(os.environ.get("SPECSCOPE_SGLANG_0_5_12", ROOT / ".sglang-0.5.12"))
STANDARD = ("cache_seqlens", "cu_seqlens_q", "cu_seqlens_k", "page_table", "seq_lens", "seq_lens_cpu",
            "req_pool_indices", "positions", "out_cache_loc", "req_to_token_page_starts")


RELEASES = ROOT / ".sglang"  # .ci/sglang-installs.sh unpacks every release wheel there
# Where releases are expected (CI, or a checkout that unpacked them), a missing one fails instead of skipping.
EXPECTED = bool(os.environ.get("CI")) or RELEASES.is_dir()


def _missing(msg: str) -> None:
    if EXPECTED:
        pytest.fail(msg)
    pytest.skip(msg)


def _old():  # noqa: ANN202
    """sglang 0.5.12: `.sglang-0.5.12/` (or $SPECSCOPE_SGLANG_0_5_12), else `.sglang/0.5.12/`."""
    for where in (OLD, RELEASES / "0.5.12"):
        if (where / "sglang" / TMB_PATH).is_file():
            return load_upstream(where)
    _missing(f"sglang 0.5.12 not unpacked at {OLD} (pip install --no-deps --target {OLD} sglang==0.5.12)")


def _new():  # noqa: ANN202
    """sglang 0.5.13, the fixed release these tests pin: the installed sglang when it is 0.5.13 (CI's), else
    `.sglang/0.5.13/` (another release installed, or first on PYTHONPATH)."""
    up = load_upstream()
    if up.version == "0.5.13":
        return up
    if (RELEASES / "0.5.13" / "sglang" / TMB_PATH).is_file():
        return load_upstream(RELEASES / "0.5.13")
    _missing(f"sglang {up.version} is installed and 0.5.13 is not unpacked at {RELEASES / '0.5.13'}")


def _read(path: Path):  # noqa: ANN202
    with TraceReader(path) as r:
        steps = list(r.steps())
        run = r.run
    return steps, list(check_steps(steps, run))


def _errors(vs):  # noqa: ANN001, ANN202
    return [v for v in vs if v.severity == Severity.ERROR]


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
        return _new() if version == "0.5.13" else _old()
    plain = drive(load(), None, K=4, T=2, plan_stream=version == "0.5.13")
    recorded = drive(load(), tmp_path / "t.db", K=4, T=2, plan_stream=version == "0.5.13")
    assert len(plain) == len(recorded) > 20
    assert all(_same(a, b) for a, b in zip(plain, recorded, strict=True))


def test_trace_holds_what_the_kernels_consume(tmp_path: Path) -> None:
    """Every prepared forward is a step with the standard arrays, the graph phase, padded bs and the frozen q
    length; the recorded metadata is the backend's own tensors (addresses included)."""
    up = _new()
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
    up = _new()
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
    cases = [(old, None), (_new(), "subclass")]
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
    drive(_new(), ok, K=4, plan_stream=True)
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


# ---- every release: what a release lacks is absent, graph replays from 0.5.15 carry no metadata -------------------
# The releases where what the recorder sees changes: max_seq_len_k dropped (0.5.14), graph metadata computed
# inside the graph (0.5.15), ragged verify (0.5.16), the unified pool (0.5.19), the newest (0.5.23).
BOUNDARIES = ("0.5.14", "0.5.15", "0.5.16", "0.5.19", "0.5.23")


def _release(version: str):  # noqa: ANN202
    where = RELEASES / version
    if not (where / "sglang" / TMB_PATH).is_file():
        _missing(f"sglang {version} not unpacked at {where} (bash .ci/sglang-installs.sh)")
    return load_upstream(where)


def _meta(path: Path) -> dict[str, str]:
    with TraceReader(path) as r:
        return r.meta()


@pytest.mark.parametrize("version", BOUNDARIES)
def test_every_release_records_what_its_backend_gives(tmp_path: Path, version: str) -> None:
    """Upstream's own backend of each boundary release, driven and recorded: eager steps and captures hold the
    metadata after the full init (captures after init_forward_metadata_in_graph from 0.5.15), max_seq_len_k is
    absent from 0.5.14 and the run config says why, replays from 0.5.15 are steps without metadata (header,
    requests, spans) under not_recorded.replay_metadata, and the catalogue finds no error; no recording problem."""
    from specscope.integrations.sglang_versions import facts_for

    up = _release(version)
    f = facts_for(version)
    drive(up, tmp_path / "t.db", K=4, T=2, plan_stream=f.has_fixup_hook)
    steps, vs = _read(tmp_path / "t.db")
    with TraceReader(tmp_path / "t.db") as r:
        config = r.run.config
    assert "recording_problems" not in _meta(tmp_path / "t.db")
    nr = config.get("not_recorded", {})
    assert ("max_seq_len_k" in nr.get("fields", {})) == (not f.has_max_seq_len_k)
    assert (nr.get("replay_metadata") == ss.REPLAY_METADATA_IN_GRAPH) == f.graph_metadata_in_graph
    assert config["sglang"]["version"] == version and config["sglang"]["tested"]
    assert config["sglang"]["backend_file"] == str(up.module.__file__)
    for s in steps:
        names = {a.name for a in s.arrays}
        assert ("max_seq_len_k" in s.scalars) == (f.has_max_seq_len_k and bool(names))
        if s.graph == GraphPhase.REPLAY and f.graph_metadata_in_graph:
            assert names == set() and set(s.scalars) <= {"acceptance_recorded", "plan_stream", "fixup_hook_ok"}
            assert s.requests and s.spans
        else:
            assert {"cache_seqlens", "cu_seqlens_k", "page_table", "req_to_token_page_starts"} <= names, s.index
            cs, pt = s.array("cache_seqlens").values, s.array("page_table").values
            assert int(cs.min()) > 0  # after the in-graph kernel: a capture recorded before it holds zeros
            assert pt.shape[1] == -(-int(cs.max()) // s.page_size)  # cropped to the pages the kernels read
    verify = [s for s in steps if s.mode == ForwardMode.TARGET_VERIFY and s.graph == GraphPhase.REPLAY]
    assert verify and all(r.accept_length >= 1 and len(r.draft_tokens) == 1 for s in verify for r in s.requests)
    assert _errors(vs) == []
    assert cli_main(["check", str(tmp_path / "t.db")]) == 0


def test_recording_at_out_graph_would_mislead_on_0_5_23(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Why replays carry no metadata from 0.5.15: snapshotting 0.5.23's graphs where 0.5.13 computed their metadata
    (out_graph's return) records the previous replay's values and unfilled captures, which the catalogue reads as
    errors (measured: 303 errors of 13 invariants for this drive); the recorder as it is finds none."""
    up = _release("0.5.23")
    drive(up, tmp_path / "ok.db", K=4, T=2)
    assert _errors(_read(tmp_path / "ok.db")[1]) == []
    monkeypatch.setattr(ss.SglangTracer, "_in_graph", lambda self: False)
    drive(_release("0.5.23"), tmp_path / "early.db", K=4, T=2)
    early = _errors(_read(tmp_path / "early.db")[1])
    assert len(early) > 100 and {"I5", "I17"} <= {v.check_id for v in early}


def test_a_newer_release_is_marked_untested(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A release newer than the newest tested one attaches and records what it can; its run info and `info` say
    "untested SGLang X"."""
    import dataclasses

    up = load_upstream()
    drive(dataclasses.replace(up, version="0.5.99"), tmp_path / "t.db", K=3, T=3, iterations=2)
    with TraceReader(tmp_path / "t.db") as r:
        sg = r.run.config["sglang"]
        n = len(list(r.steps()))
    assert sg["tested"] is False and sg["untested"] == "untested SGLang 0.5.99" and n > 10
    capsys.readouterr()
    assert cli_main(["info", "--no-check", str(tmp_path / "t.db")]) == 0
    assert "sglang   0.5.99 (untested SGLang 0.5.99)" in capsys.readouterr().out


# ---- provenance and features specscope does not model ----------------------------------------------------------
class _Env:
    """What SGLang's `envs.X` is: `.get()` and `.is_set()`."""

    def __init__(self, value: object) -> None:
        self.value = value

    def get(self) -> object:
        return self.value

    def is_set(self) -> bool:
        return True


def test_provenance_and_unmodelled_features_are_in_the_run_info(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Built by upstream's constructor from a server's args (FP8 KV cache, topk 2, context parallel) and with SGLang's
    spec-decoding variables set: the run info holds the version, the backend's file, those args, the variables and
    the features the model leaves out, with what showed each; `info` prints them (text and --json)."""
    from specscope.integrations.sglang_stand_ins import make_model_runner

    up = _new()
    up.module.envs.SGLANG_ENABLE_OVERLAP_PLAN_STREAM = _Env(True)
    mr = make_model_runner(req_to_token=torch.zeros(5, 64, dtype=torch.int32), page_size=16, context_len=64,
                           num_draft_tokens=4, topk=2, kv_cache_dtype=torch.float8_e4m3fn)
    mr.server_args.__dict__.update(attention_backend="trtllm_mha", speculative_algorithm="EAGLE", page_size=16,
                                   attn_cp_size=2, kv_cache_dtype="fp8_e4m3", cuda_graph_bs=[1, 2, 4],
                                   disable_cuda_graph=False, speculative_attention_mode="prefill")
    tracer = ss.SglangTracer(tmp_path / "t.db", sglang_version=up.version)
    ss.instrument(up.module, tracer)
    try:
        up.backend_cls(mr)
        tracer.close()
    finally:
        ss.uninstrument(up.module)
    with TraceReader(tmp_path / "t.db") as r:
        sg = r.run.config["sglang"]
        meta = r.meta()
    assert sg["version"] == "0.5.13" and sg["backend_file"] == up.module.__file__
    assert sg["server_args"]["attention_backend"] == "trtllm_mha" and sg["server_args"]["cuda_graph_bs"] == [1, 2, 4]
    assert sg["server_args"]["speculative_eagle_topk"] == 2
    assert sg["env"]["SGLANG_ENABLE_OVERLAP_PLAN_STREAM"] is True
    assert sg["parallel"]["tp_rank"] == 0 and sg["gpu"]["name"] == "cpu"
    feats = {f["feature"]: f["source"] for f in sg["unmodelled"]}
    assert feats == {"topk > 1": "backend.topk", "CP": "server args attn_cp_size=2",
                     "FP8 KV": "backend.data_type=float8_e4m3fn"}
    # Nothing was prepared: the trace exists anyway and says why it is empty.
    assert json.loads(meta["recording_problems"])[0]["what"] == "nothing recorded"
    capsys.readouterr()
    assert cli_main(["info", "--no-check", str(tmp_path / "t.db")]) == 0
    out = capsys.readouterr().out
    assert "sglang   0.5.13 (tested)" in out and "server   " in out and "attn_cp_size=2" in out
    assert "env      SGLANG_ENABLE_OVERLAP_PLAN_STREAM=True" in out
    assert "unmodelled FP8 KV:" in out and "unmodelled topk > 1:" in out and "problem  nothing recorded: 1x" in out
    assert "config   " in out and "sglang=" not in out  # the section replaces the raw dict in the config line
    assert cli_main(["info", "--json", "--no-check", str(tmp_path / "t.db")]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["sglang"]["unmodelled"] == sg["unmodelled"] and d["recording_problems"][0]["count"] == 1


def test_ragged_verify_is_named_on_releases_that_have_it(tmp_path: Path) -> None:
    """SGLANG_RAGGED_VERIFY_MODE as SGLang reads it (its envs): named from 0.5.16, where it exists; the drive still
    records (the stand-in batches carry no ragged layout, so the backend runs its static path)."""
    up = _release("0.5.23")
    up.module.envs.SGLANG_RAGGED_VERIFY_MODE = _Env("compact")
    drive(up, tmp_path / "t.db", K=3, T=3, iterations=2)
    with TraceReader(tmp_path / "t.db") as r:
        sg = r.run.config["sglang"]
    assert sg["env"]["SGLANG_RAGGED_VERIFY_MODE"] == "compact"
    assert [f["source"] for f in sg["unmodelled"]] == ["SGLANG_RAGGED_VERIFY_MODE=compact"]


def test_unified_pool_and_swa_are_detected_from_the_backend_object() -> None:
    """The attach-time reading of a backend object: the unified pool's translator and an SWA pool (which the CPU
    loader cannot build) are named with where they were seen; a static bf16 topk-1 backend names nothing."""
    from types import SimpleNamespace

    plain = SimpleNamespace(topk=1, data_type=torch.bfloat16, kv_index_translator=SimpleNamespace(is_translating=False),
                            _swa_kv_pool=None, use_sliding_window_kv_pool=False)
    assert features(plain, {}, {}, None) == []
    both = SimpleNamespace(topk=1, data_type=torch.bfloat16, kv_index_translator=SimpleNamespace(is_translating=True),
                           _swa_kv_pool=object(), is_xqa_impl=True)
    got = {f["feature"]: f["source"] for f in features(both, {}, {"SGLANG_RAGGED_VERIFY_MODE": "compact"}, None)}
    assert got == {"unified KV pool": "backend.kv_index_translator", "SWA": "backend SWA KV pool",
                   "ragged verify": "SGLANG_RAGGED_VERIFY_MODE=compact"}


# ---- a failed recording is visible ---------------------------------------------------------------------------
def test_a_failing_recorder_says_why_in_the_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture) -> None:
    """An error in the recorder's own code: SGLang's calls all return as before (the drive ends normally), the
    failed steps are missing, and meta.recording_problems holds one entry (what, first step, count, detail with
    where in specscope it raised); `info` shows it. With SPECSCOPE_DEBUG=1 the error reaches the caller."""
    def broken(self, md) -> None:  # noqa: ANN001
        raise AttributeError("'TRTLLMMHAMetadata' object has no attribute 'something_new'")

    monkeypatch.setattr(StepBuilder, "_step_features", broken)
    up = _new()
    drive(up, tmp_path / "t.db", K=3, T=3, iterations=2)
    steps, _ = _read(tmp_path / "t.db")
    problems = json.loads(_meta(tmp_path / "t.db")["recording_problems"])
    assert len(problems) == 2  # one per prep method that failed: out_graph (graphs) and init_forward_metadata
    p = {x["what"]: x for x in problems}
    graph = p["init_forward_metadata_out_graph: AttributeError"]
    eager = p["init_forward_metadata: AttributeError"]
    assert graph["first_step"] == 0 and graph["count"] > 10 and eager["count"] >= 1
    assert "something_new" in graph["detail"] and "in broken)" in graph["detail"]
    assert all(s.graph != GraphPhase.CAPTURE for s in steps)  # the failed steps are missing, not made up
    capsys.readouterr()
    assert cli_main(["info", "--no-check", str(tmp_path / "t.db")]) == 0
    assert f"problem  init_forward_metadata_out_graph: AttributeError: {graph['count']}x, first at step 0" in \
        capsys.readouterr().out
    monkeypatch.setenv("SPECSCOPE_DEBUG", "1")
    with pytest.raises(AttributeError, match="something_new"):
        drive(_new(), tmp_path / "debug.db", K=3, T=3, iterations=1)
