"""Bug-report bundles: the zip's contents, a round trip through info / check / replay / export, bad arguments."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from specscope.tracer import kv_bases
from specscope.tracer.attention_call import recorded_call
from specscope.tracer.bundle_file import open_trace_or_bundle
from specscope.tracer.checks import check_steps
from specscope.tracer.errors import TraceError
from specscope.tracer.export.bundle import bundle_steps, environment
from specscope.tracer.kv_bases import stored_kv
from specscope.tracer.kv_delta import KV_ARRAYS, PLANED, raw_values
from specscope.tracer.schema import ArraySnapshot, ForwardMode, Step
from specscope.tracer.store import TraceReader
from specscope.ui.cli import main
from test_export_common import BF16, FAULT, recorded

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fault(tmp_path_factory: pytest.TempPathFactory) -> str:
    return recorded(tmp_path_factory, "fault", FAULT)


@pytest.fixture(scope="module")
def bf16(tmp_path_factory: pytest.TempPathFactory) -> str:
    return recorded(tmp_path_factory, "bf16", BF16)


def verify_steps(path: str) -> list[int]:
    with TraceReader(path) as r:
        return [s.index for s in r.iter_summaries()
                if s.mode == ForwardMode.TARGET_VERIFY and s.graph.value == "replay"]


def without_kv(step: Step) -> tuple[ArraySnapshot, ...]:
    """The arrays a bundle keeps as they are (not the delta-coded KV, nor the byte-planed q / out)."""
    return tuple(a for a in step.arrays if (a.name not in KV_ARRAYS or a.name == "attn_page_ids")
                 and a.name not in PLANED)


def one_error_line(capsys: pytest.CaptureFixture[str], *expect: str) -> None:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("specscope: error: "), err
    for e in expect:
        assert e in err[0], (e, err[0])


def test_bundle_round_trip(fault: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    v = verify_steps(fault)
    a, b = v[0] - 1, v[1] + 2
    out = tmp_path / "report.zip"
    assert main(["export", fault, "--bundle", str(out), "--steps", f"{a}:{b}"]) == 0
    assert "report.zip" in capsys.readouterr().out
    with zipfile.ZipFile(out) as z:
        names = set(z.namelist())
        readme = z.read("README.md").decode()
        check = json.loads(z.read("check.json"))
        env = json.loads(z.read("environment.json"))
        manifest = json.loads(z.read("bundle.json"))
        command = z.read("command.txt").decode().strip()
    assert {"trace.db", "README.md", "check.json", "environment.json", "command.txt", "perfetto.json.gz",
            "bundle.json"} <= names
    with TraceReader(fault) as r:
        want = bundle_steps(r, a, b)
        captures = {r.capture_of(i) for i in range(a, b)} - {None}
        assert command == r.run.command and env == environment(r)
        original = [x for x in r.violations() if x.step in set(want)]
    assert manifest["original_steps"] == want and captures and captures <= set(want)
    assert set(manifest["captures_added"]) == captures - set(range(a, b))
    assert len(check["original_violations"]) == len(original)
    assert "specscope check report.zip" in readme and "specscope replay report.zip --step" in readme
    assert command in readme
    # The bundled trace: the same steps under their original indexes, opens in every command.
    with open_trace_or_bundle(out) as db, TraceReader(db) as r:
        assert [s.index for s in r.iter_summaries()] == want  # sparse: the range and the captures before it
        assert r.num_steps() == len(want)
        with TraceReader(fault) as orig:
            for o in want:
                a_, b_ = r.step(o), orig.step(o)
                assert (a_.mode, a_.graph, a_.batch_size, a_.requests) == (b_.mode, b_.graph, b_.batch_size,
                                                                            b_.requests)
                assert without_kv(a_) == without_kv(b_)  # the KV pages travel delta-coded (test below)
                if b_.array("attn_kv") is not None:
                    assert stored_kv(a_, r.kv_base).tobytes() == b_.array("attn_kv").values.tobytes()
                    for name in ("attn_q", "attn_out"):  # byte planes in the bundle, the same bytes back
                        assert raw_values(a_, name).tobytes() == b_.array(name).values.tobytes()
        found = list(check_steps(r.steps()))
        assert r.run.command == command
    assert [x["check_id"] for x in check["bundle_check"]] == [x.check_id for x in found]
    assert any(x.check_id == "I6" for x in found)
    with open_trace_or_bundle(out) as db:
        assert main(["info", db]) == 0
        assert "TARGET_VERIFY" in capsys.readouterr().out
        assert main(["check", db]) == 1
        assert "I6" in capsys.readouterr().out
    assert main(["replay", str(out), "--step", str(v[1])]) == 1  # the faulted verify, from the zip
    text = capsys.readouterr().out
    assert "kernel-vs-truth" in text and f"step {v[1]} of {Path(fault).name}" in text
    assert main(["export", str(out), "--perfetto", str(tmp_path / "p.json")]) == 0
    assert main(["diff", str(out), str(out)]) == 0
    assert "no divergence" in capsys.readouterr().out


def test_open_trace_or_bundle_cleans_up_and_passes_traces_through(fault: str, tmp_path: Path) -> None:
    with open_trace_or_bundle(fault) as p:
        assert p == fault
    out = tmp_path / "b.zip"
    assert main(["export", fault, "--bundle", str(out), "--steps", "4:8"]) == 0
    with open_trace_or_bundle(out) as db:
        assert Path(db).exists()
        folder = Path(db).parent
    assert not folder.exists()


def test_damaged_bundles_are_one_sentence(tmp_path: Path) -> None:
    bad = tmp_path / "bad.zip"
    bad.write_bytes(b"PK\x03\x04" + b"\0" * 64)
    with pytest.raises(TraceError, match="not a readable bundle"):
        with open_trace_or_bundle(bad):
            pass
    empty = tmp_path / "empty.zip"
    with zipfile.ZipFile(empty, "w"):
        pass
    with pytest.raises(TraceError):
        with open_trace_or_bundle(empty):
            pass
    junk = tmp_path / "junk.zip"
    with zipfile.ZipFile(junk, "w") as z:
        z.writestr("trace.db", b"not sqlite")
    with pytest.raises(TraceError, match="not a specscope trace"):
        with open_trace_or_bundle(junk) as db:
            TraceReader(db)


def test_export_bad_arguments_exit_2(fault: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "x.zip")
    cases = [
        (["export", fault], "nothing to write"),
        (["export", fault, "--bundle", out, "--steps", "9:3"], "range is empty"),
        (["export", fault, "--bundle", out, "--steps", "a:b"], "expected A:B"),
        (["export", fault, "--bundle", out, "--steps", "100000:100002"], "no steps in --steps"),
        (["export", fault, "--bundle", str(tmp_path / "x.tar")], "must end in .zip"),
        (["export", fault, "--perfetto", str(tmp_path / "x.txt")], "must end in .json"),
        (["export", fault, "--perfetto", str(tmp_path / "nope" / "x.json")], "no such folder"),
        (["export", str(tmp_path / "missing.db"), "--perfetto", str(tmp_path / "m.json")], "no such file"),
    ]
    for argv, msg in cases:
        assert main(argv) == 2, argv
        one_error_line(capsys, msg)
    Path(out).write_text("keep me")
    assert main(["export", fault, "--bundle", out]) == 2
    one_error_line(capsys, "already exists")
    assert Path(out).read_text() == "keep me"


@pytest.mark.parametrize("attention", ["flagged", "none"])
def test_attention_selection_keeps_the_verdicts_consistent(fault: str, tmp_path: Path, attention: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / f"{attention}.zip"
    assert main(["export", fault, "--bundle", str(out), "--attention", attention]) == 0
    capsys.readouterr()
    with zipfile.ZipFile(out) as z:
        check = json.loads(z.read("check.json"))
        manifest = json.loads(z.read("bundle.json"))
    with open_trace_or_bundle(out) as db, TraceReader(db) as r:
        found = list(check_steps(r.steps()))
        with_calls = [s.index for s in r.iter_summaries() if r.step(s.index, arrays=("attn_q",)).arrays]
        flagged = {x.step for x in found}
    assert [x["check_id"] for x in check["bundle_check"]] == [x.check_id for x in found]
    assert manifest["attention_steps"] == with_calls
    if attention == "none":
        assert not with_calls and not any(x.check_id.startswith("D") for x in found)
    else:
        assert with_calls and set(with_calls) <= flagged and manifest["attention_dropped"]


def test_committed_sample_exports_open(capsys: pytest.CaptureFixture[str]) -> None:
    from test_export_perfetto import assert_well_formed

    folder = REPO / "samples" / "exports"
    for p in sorted(folder.glob("*.perfetto.json.gz")):
        import gzip

        with gzip.open(p) as f:
            assert_well_formed(json.load(f)["traceEvents"])
    bundles = sorted(folder.glob("*.zip"))
    assert bundles
    for p in bundles:
        with open_trace_or_bundle(p) as db:
            assert main(["info", db]) == 0
    verify = folder / "cpu-fault-max-seq-len-q-override-verify.zip"
    assert main(["replay", str(verify), "--step", "1"]) == 1
    assert "kernel-vs-truth" in capsys.readouterr().out


@pytest.mark.parametrize("which", ["fault", "bf16"])
def test_bundled_kv_is_delta_coded_and_lossless(which: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """Every bundled call's KV pages come back byte for byte; later calls store only the rows that changed."""
    src = request.getfixturevalue(which)
    out = tmp_path / "all.zip"
    assert main(["export", src, "--bundle", str(out)]) == 0
    with zipfile.ZipFile(out) as z:
        manifest = json.loads(z.read("bundle.json"))
    assert manifest["kv_stored_bytes"] < manifest["kv_full_bytes"] / 3
    for order in ("forward", "backward"):  # backward: every call resolves its chain from the bundle, cold
        kv_bases.clear_cache()
        deltas = 0
        with TraceReader(out) as b, TraceReader(src) as orig:
            pairs = [(i, i) for i in manifest["original_steps"]]  # bundle and trace number them alike
            for new, old in pairs if order == "forward" else pairs[::-1]:
                st, want = b.step(new), orig.step(old).array("attn_kv")
                if want is None:
                    assert st.array("attn_q") is None
                    continue
                deltas += st.array("attn_kv") is None
                got = stored_kv(st, b.kv_base)  # the cache, or the base calls this reader holds
                assert got.dtype == want.values.dtype and got.shape == want.values.shape
                assert got.tobytes() == want.values.tobytes(), (order, new)
                assert recorded_call(st, b.kv_base).kv.tobytes() == recorded_call(orig.step(old)).kv.tobytes()
        assert deltas and deltas == len(manifest["attention_steps"]) - len(manifest["kv_keyframes"])
    assert len(manifest["kv_chain_starts"]) == 2  # the first call of the target and of the draft


def test_delta_coded_bundle_checks_and_replays_from_anywhere(fault: str, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """`check` reads the chain in order; `replay` of the last call and a cold random read resolve it, from the zip or
    from its extracted trace.db through that trace's reader; a call decoded out of order with no reader to fetch its
    bases says so (one sentence, never wrong bytes)."""
    out = tmp_path / "all.zip"
    assert main(["export", fault, "--bundle", str(out)]) == 0
    capsys.readouterr()
    with zipfile.ZipFile(out) as z:
        manifest = json.loads(z.read("bundle.json"))
        check = json.loads(z.read("check.json"))
        z.extract("trace.db", tmp_path)
    last = manifest["attention_steps"][-1]
    kv_bases.clear_cache()
    code = main(["replay", str(out), "--step", str(last), "--json"])
    res = json.loads(capsys.readouterr().out)
    with TraceReader(fault) as r:
        from specscope.backend.replay import replay

        want_call = recorded_call(r.step(last))
        want = replay(want_call, "cpu", "reference", "float32")
        want_kv = want_call.kv.tobytes()
    assert code == (0 if want.agrees else 1) and res["worst"]["kernel-vs-truth"] == want.worst("kernel-vs-truth")
    kv_bases.clear_cache()  # as in a fresh process
    loose = str(tmp_path / "trace.db")
    with TraceReader(loose) as r:
        st = r.step(last)  # cold, out of order: the reader resolves the call from the base calls its trace holds
        assert recorded_call(st).kv.tobytes() == want_kv  # so the catalogue, handed only the step, decodes it
        kv_bases.clear_cache()
        with pytest.raises(recorded_call_error(), match="no reader of its trace was given"):
            recorded_call(st)  # nothing opens a file behind the caller's back
        assert recorded_call(st, r.kv_base).kv.tobytes() == want_kv
        kv_bases.clear_cache()
        found = list(check_steps(r.steps()))  # in order: each call chains onto the one before
    assert [(x.check_id, x.step) for x in found] == [(x["check_id"], x["step"]) for x in check["bundle_check"]]
    assert any(x.check_id == "D2" for x in found) and not any(x.check_id == "I2" for x in found)
    kv_bases.clear_cache()
    mid = manifest["attention_steps"][len(manifest["attention_steps"]) // 2]
    with TraceReader(out) as b:  # a window from the middle of the chain, as the dashboard's step view checks one
        window = list(check_steps(b.steps(mid)))
    assert not any(x.check_id == "I2" for x in window)
    assert [x.step for x in window if x.check_id.startswith("D")] == [x.step for x in found
                                                                      if x.check_id.startswith("D") and x.step >= mid]
    assert main(["check", str(out)]) == 1
    assert "D2" in capsys.readouterr().out


def recorded_call_error() -> type[Exception]:
    from specscope.tracer.attention_call import NoRecordedCall

    return NoRecordedCall


def test_delta_codec_keeps_every_byte() -> None:
    """Pages that move, appear, vanish, repeat rows or hold NaN / -0.0 / denormals come back bit for bit."""
    from specscope.tracer import kv_delta

    rng = np.random.default_rng(0)
    shape = (5, 2, 2, 8, 32)  # U, K/V, Hkv, page size, D
    a = rng.standard_normal(shape).astype(np.float32)
    a[[1, 3], :, :, 6:] = 0  # rows not written yet
    a[1, 0, 0, 3, 0] = np.nan
    a[2, 1, 1, 7, 3] = -0.0
    a[3, 0, 1, 0, 1] = np.float32(1e-45)
    a[4, :, :, 6] = a[0, :, :, 2]  # a repeated row (layer 0: the same token at the same position)
    ids_a = np.array([7, 3, 9, 1, 4])
    rows_a, src_a, lit_a = kv_delta.encode(ids_a, a, {})  # a model's first call: against an empty store
    assert len(lit_a) == 5 * 8 - 4 - 1 and (src_a == -2 - (0 * 8 + 2)).sum() == 1  # zeros cost nothing, a repeat 8 B
    assert kv_delta.decode(ids_a, a.shape, rows_a, src_a, lit_a, {}).tobytes() == a.tobytes()
    pages = kv_delta.advance({}, ids_a, a)
    # The next call: page 9 gone, pages reordered, page 12 new (one of its rows copies a row of page 1, another
    # repeats a new row of this call), one row of page 3 rewritten, a NaN turned to -NaN.
    ids_b = np.array([3, 1, 12, 7, 4])
    b = a[[1, 3, 0, 0, 4]].copy()
    b[2] = 0
    b[2, :, :, :2] = rng.standard_normal((2, 2, 2, 32))
    b[2, :, :, 4] = a[3, :, :, 5]
    b[2, :, :, 6] = b[2, :, :, 1]
    b[0, :, :, 5] = rng.standard_normal((2, 2, 32))
    b[0, 0, 0, 3, 0] = -np.float32(np.nan)
    rows, src, lit = kv_delta.encode(ids_b, b, pages)
    assert sorted(rows.tolist()) == [0 * 8 + 3, 0 * 8 + 5, 2 * 8 + 0, 2 * 8 + 1, 2 * 8 + 4, 2 * 8 + 6]  # slot*P+row
    assert len(lit) == 4 and 1 * 8 + 5 in src.tolist() and -2 - (2 * 8 + 1) in src.tolist()
    back = kv_delta.decode(ids_b, b.shape, rows, src, lit, pages)
    assert back.tobytes() == b.tobytes()
    bits = b.view(np.int32).astype(np.int16)  # raw 16-bit patterns (a bf16 pool) go the same way
    pages16 = kv_delta.advance({}, ids_a, a.view(np.int32).astype(np.int16))
    coded16 = kv_delta.encode(ids_b, bits, pages16)
    assert kv_delta.decode(ids_b, bits.shape, *coded16, pages16).tobytes() == bits.tobytes()
    assert kv_delta.encode(ids_b, b, None) is None  # no store: the full array
    with pytest.raises(kv_delta.DeltaError, match="points past"):
        kv_delta.decode(ids_b, b.shape, np.array([99], np.int32), np.array([-1]), lit[:1], pages)
    with pytest.raises(kv_delta.DeltaError, match="no earlier call"):
        kv_delta.decode(ids_b, b.shape, np.array([0], np.int32), np.array([55 * 8]), lit[:0], pages)


@pytest.mark.parametrize("dtype", [np.int16, np.float32, np.int64])
def test_byte_planes_round_trip(dtype: type) -> None:
    from specscope.tracer import kv_delta

    rng = np.random.default_rng(1)
    v = rng.integers(-(2**15), 2**15, size=(3, 2, 5)).astype(dtype)
    if dtype is np.float32:
        v = rng.standard_normal((3, 2, 5)).astype(np.float32)
        v[0, 0, 0], v[0, 0, 1] = np.nan, -0.0
    p = kv_delta.to_planes(v)
    assert p.dtype == np.uint8 and p.shape == (v.dtype.itemsize, *v.shape)
    assert np.array_equal(p[-1], v.view(np.uint8).reshape(*v.shape, -1)[..., 0])  # the last plane: the low bytes
    back = kv_delta.from_planes(p)
    assert back.dtype == v.dtype and back.tobytes() == v.tobytes()
    with pytest.raises(kv_delta.DeltaError, match="byte planes"):
        kv_delta.from_planes(np.zeros((3, 4), np.uint8))
