"""Round trips through real trace files: every record type and field, arrays of many dtypes and shapes."""

from __future__ import annotations

import dataclasses
import os
import sqlite3

import numpy as np
import pytest
from specscope.tracer import codec
from specscope.tracer.errors import TraceError, TraceIndexError
from specscope.tracer.schema import (
    MAGIC,
    SCHEMA_VERSION,
    ArraySnapshot,
    Cell,
    ForwardMode,
    GraphPhase,
    RequestRecord,
    RequestState,
    Severity,
    Step,
    StreamSpan,
    Violation,
)
from specscope.tracer.store import TraceReader, TraceWriter, append_violations
from stepgen import make_request, make_run, make_step


def _every_dtype_step(i: int) -> Step:
    rng = np.random.default_rng(7)
    arrays = []
    for dt in ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
               "float64", "bool", "complex64"]:  # fmt: skip
        for shape in [(0,), (1,), (5,), (3, 4), (2, 0), (2, 3, 4), ()]:
            v = (rng.standard_normal(shape) * 1000).astype(dt)
            arrays.append(ArraySnapshot(f"{dt}{shape}", dt, shape + (9,), i * 8, v))
    info = np.iinfo(np.int32)
    extremes = np.array([[info.max, info.min, 0, info.max], [info.min, info.max, -1, 1]], np.int32)
    arrays.append(ArraySnapshot("wrap", "int32", (2, 4), 0, extremes))  # deltas overflow and must wrap back
    big = np.arange(5000, dtype=np.int64).reshape(50, 100) * 3  # > inline limit: stored as a blob
    arrays.append(ArraySnapshot("big", "int64", (64, 128), 2**48 + 5, big))
    arrays.append(ArraySnapshot("bigf", "float32", (5000,), 0, rng.standard_normal(5000).astype(np.float32)))
    arrays.append(ArraySnapshot("strided", "int32", (4,), 0, np.arange(8, dtype=np.int32)[::2]))
    return dataclasses.replace(make_step(i), arrays=tuple(arrays))


def test_every_record_round_trips(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "t.db")
    steps = [make_step(i) for i in range(10)] + [_every_dtype_step(10)]
    # A step with no requests, arrays, spans or violations, and None where fields allow it.
    steps.append(
        Step(index=11, iteration=99, mode=ForwardMode.DECODE, model="target", step_id=None, batch_size=0,
             padded_batch_size=0, graph=GraphPhase.CAPTURE, tokens_per_request=1, num_draft_tokens=1,
             page_size=128, start_ns=0, end_ns=2**62)  # fmt: skip
    )
    rich = RequestState(7, 3, 100, 103, 4, (5, 6, 7), (5, 6, 9), 3)
    steps.append(dataclasses.replace(make_step(12), requests=(rich,) * 3, scalars={"neg": -5, "big": 2**62}))
    run = make_run()
    with TraceWriter(path, run) as w:
        for s in steps:
            w.write_step(s)
        recs = [make_request(r) for r in range(4)]
        for rec in recs:
            w.write_request(rec)
        # Upsert: the final record of request 1001 replaces the first.
        final = dataclasses.replace(recs[1], output_tokens=(1, 2, 3), finish_iteration=50, finish_reason="stop")
        w.write_request(final)
    with TraceReader(path) as r:
        assert r.run == run
        assert r.schema_version == SCHEMA_VERSION
        assert r.is_closed()
        assert r.num_steps() == len(steps)
        for s in steps:
            got = r.step(s.index)
            assert got == s
            for a, b in zip(got.arrays, s.arrays, strict=True):
                assert a.values.dtype == b.values.dtype and a.values.shape == b.values.shape
                assert a.shape == tuple(b.shape)
        assert list(r.steps()) == steps
        assert list(r.steps(3, 7)) == steps[3:7]
        assert r.requests() == [recs[0], final, recs[2], recs[3]]
        headers = list(r.step_headers())
        assert [h["index"] for h in headers] == [s.index for s in steps]
        for h, s in zip(headers, steps, strict=True):
            expect = s.header_dict()
            expect["num_violations"] = len(s.violations)
            assert h == expect
        assert [h["index"] for h in r.step_headers(mode="TARGET_VERIFY")] == [3, 8]
        recorded = [v for s in steps for v in s.violations]
        assert r.violations() == recorded
        assert r.violations(step=3) == list(steps[3].violations)
        assert r.violations(check_id="I9") == [v for v in recorded if v.check_id == "I9"]
        assert r.violations(severity="warning") == [v for v in recorded if v.severity == Severity.WARNING]
        with pytest.raises(TraceIndexError, match="has no step 13"):
            r.step(13)
        with pytest.raises(IndexError):
            r.step(-1)


def test_identical_arrays_stored_once(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "t.db")
    table = np.arange(64 * 80, dtype=np.int32).reshape(64, 80)
    with TraceWriter(path, make_run()) as w:
        for i in range(20):
            pt = table if i < 10 else table + 1  # the same values, as new array objects too
            arrays = (ArraySnapshot("page_table", "int32", (64, 128), 0, pt.copy()),
                      ArraySnapshot("other_name", "int32", (64, 128), 0, pt.copy()))  # fmt: skip
            w.write_step(dataclasses.replace(make_step(i), arrays=arrays))
    with sqlite3.connect(path) as c:
        assert c.execute("SELECT count(*) FROM blobs").fetchone()[0] == 2
    with TraceReader(path) as r:
        assert np.array_equal(r.step(15).array("page_table").values, table + 1)
        assert np.array_equal(r.step(5).array("other_name").values, table)


def test_base_chains_decode_in_any_order(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "t.db")
    n = 80  # 40 versions of the big table: several keys, each with up to KEY_INTERVAL - 1 dependents
    with TraceWriter(path, make_run()) as w:
        for i in range(n):
            w.write_step(make_step(i))
    with sqlite3.connect(path) as c:
        codecs = [row[0][3] for row in c.execute("SELECT data FROM blobs")]
    assert codecs.count(codec.CODEC_DELTA_ZLIB_BASE) > codecs.count(codec.CODEC_DELTA_ZLIB) > 0
    with sqlite3.connect(path) as c:  # bases are always stand-alone blobs: one level, never a chain
        for (data,) in c.execute("SELECT data FROM blobs"):
            b = codec.base_digest(data)
            if b is not None:
                (base,) = c.execute("SELECT data FROM blobs WHERE digest = ?", (b,)).fetchone()
                assert codec.base_digest(base) is None
    for i in [37, 0, 22, 15, 39, 8]:  # a fresh reader each time: nothing cached
        with TraceReader(path) as r:
            assert r.step(i) == make_step(i)
    with TraceReader(path) as r:
        assert list(r.steps()) == [make_step(i) for i in range(n)]


def test_checker_violations_append_and_replace(small_trace: str) -> None:
    v1 = Violation("I4", Severity.ERROR, 2, "step 2: cu_seqlens_k[3] = 40 != 41", 1001)
    v2 = Violation("I4", Severity.ERROR, 5, "step 5: cu_seqlens_k[1] = 9 != 10", None)
    assert append_violations(small_trace, [v1]) == 1
    assert append_violations(small_trace, [v2], replace=True) == 1
    with TraceReader(small_trace) as r:
        got = r.violations(check_id="I4")
        assert got == [v2]
        # replace=True dropped every earlier "check" violation, the fixture's add_violations one too.
        assert r.violations(source="check") == [v2]
        assert len(r.violations(source="recorder")) == sum(len(make_step(i).violations) for i in range(12))
        assert r.step(5).violations == make_step(5).violations  # the step body keeps only recorded ones
        assert r.count_violations_by_id()["I4"] == 1


def test_violation_relations_round_trip_and_older_tables_take_what_they_hold(small_trace: str) -> None:
    related = (Cell("req_pool_indices", 1, None, "7"), Cell("cache_seqlens", 1, None, "40", step=3))
    v = Violation("I40", Severity.ERROR, 4, "step 4: page_table[1][2] = 9, owned by request 1002", 1001,
                  "page_table", 1, 2, "9", "12", related)
    assert Violation.from_dict(v.to_dict()) == v
    assert "related" not in dataclasses.replace(v, related=()).to_dict()  # single facts keep their old JSON
    assert v.cells()[0] == Cell("page_table", 1, 2, "9") and v.cells()[1:] == list(related)
    assert append_violations(small_trace, [v]) == 1
    with TraceReader(small_trace) as r:
        assert r.violations(check_id="I40") == [v]
    # A trace written before the `related` column existed takes the violation without it.
    conn = sqlite3.connect(small_trace)
    conn.execute("ALTER TABLE violations DROP COLUMN related")
    conn.commit()
    conn.close()
    assert append_violations(small_trace, [v], replace=True) == 1
    with TraceReader(small_trace) as r:
        assert r.violations(check_id="I40") == [dataclasses.replace(v, related=())]


def test_writer_refuses_existing_file_unless_overwrite(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "t.db")
    with TraceWriter(path, make_run()) as w:
        w.write_step(make_step(0))
    with pytest.raises(TraceError, match="already exists"):
        TraceWriter(path, make_run())
    with TraceWriter(path, make_run(), overwrite=True) as w:
        w.write_step(make_step(5))
    with TraceReader(path) as r:
        assert [h["index"] for h in r.step_headers()] == [5]


def test_writer_errors_surface_as_trace_errors(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "t.db")
    w = TraceWriter(path, make_run())
    w.write_step(make_step(0))
    w.write_step(make_step(0))  # duplicate index: fails on the writer thread
    with pytest.raises(TraceError, match="step index 0 was written twice"):
        w.flush()
    with pytest.raises(TraceError):
        w.write_step(make_step(1))
    with pytest.raises(TraceError):
        w.close()
    bad = dataclasses.replace(make_step(2), arrays=(ArraySnapshot("o", "object", (1,), 0, np.array([None])),))
    w2 = TraceWriter(os.path.join(tmp_path, "u.db"), make_run())
    w2.write_step(make_step(0))
    w2.write_step(make_step(1))
    w2.write_step(bad)
    with pytest.raises(TraceError, match="dtype object"):
        w2.close()
    with pytest.raises(TraceError, match="already closed"):
        w2.write_step(make_step(3))
    with TraceReader(os.path.join(tmp_path, "u.db")) as r:  # everything queued before the failure is there
        assert list(r.steps()) == [make_step(0), make_step(1)]


def test_writer_cleans_up_a_failed_create(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "t.db")
    bad_run = dataclasses.replace(make_run(), config={"x": object()})
    with pytest.raises(TraceError, match="cannot create the trace"):
        TraceWriter(path, bad_run)
    assert not os.path.exists(path)
    with pytest.raises(TraceError, match="cannot create the trace"):
        TraceWriter(os.path.join(tmp_path, "no", "such", "dir.db"), make_run())


def test_writer_refuses_decreasing_indexes(tmp_path: os.PathLike[str]) -> None:
    w = TraceWriter(os.path.join(tmp_path, "t.db"), make_run())
    w.write_step(make_step(5))
    w.write_step(make_step(3))
    with pytest.raises(TraceError, match="step index 3 was written after step 5"):
        w.close()


def test_backpressure_never_drops(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "t.db")
    with TraceWriter(path, make_run(), queue_size=2) as w:
        for i in range(300):
            w.write_step(make_step(i))
    with TraceReader(path) as r:
        assert r.num_steps() == 300
        assert r.step(299) == make_step(299)


def test_meta_and_tables(small_trace: str) -> None:
    with sqlite3.connect(small_trace) as c:
        meta = dict(c.execute("SELECT key, value FROM meta"))
        tables = {row[0] for row in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        mode = c.execute("PRAGMA journal_mode").fetchone()[0]
    assert meta["magic"] == MAGIC and meta["schema_version"] == SCHEMA_VERSION and "closed_ns" in meta
    assert {"meta", "run", "steps", "step_bodies", "blobs", "requests", "violations"} <= tables
    assert mode == "delete"  # a closed trace is one self-contained file
    assert not os.path.exists(small_trace + "-wal")


def test_reader_accepts_newer_minor_version(small_trace: str) -> None:
    with sqlite3.connect(small_trace) as c:
        c.execute("UPDATE meta SET value = '1.7' WHERE key = 'schema_version'")
    with TraceReader(small_trace) as r:
        assert r.schema_version == "1.7"
        assert r.step(3) == make_step(3)


@pytest.mark.parametrize(
    "arr",
    [
        np.array([], np.int32),
        np.array(7, np.int64),
        np.array([2**63 - 1, -(2**63), 0], np.int64),
        np.array([65535, 0, 1], np.uint16),
        np.arange(12, dtype=np.int32).reshape(3, 4)[:, ::2],
        np.array([[True, False]]),
        np.array([1.5, -np.inf, np.nan], np.float32),
        np.zeros((2, 0, 3), np.int16),
    ],
)
@pytest.mark.parametrize("compress", [True, False])
def test_codec_round_trip(arr: np.ndarray, compress: bool) -> None:
    out = codec.decode(codec.encode(arr, compress=compress))
    assert out.dtype == arr.dtype and out.shape == arr.shape
    assert np.array_equal(out, arr, equal_nan=arr.dtype.kind == "f")
    assert not out.flags.writeable


def test_codec_delta_compresses_page_runs() -> None:
    pages = (np.arange(64 * 70, dtype=np.int32).reshape(64, 70) + 1000) * 1
    # Without delta coding these runs compress ~3x; with it >30x (zlib-ng's fast level ~39x, zlib's ~50x).
    assert len(codec.encode(pages)) < pages.nbytes // 32


@pytest.mark.parametrize(
    "blob",
    [b"", b"SA", b"XX\x01\x02\x03<i4\x01" + b"\0" * 8, b"SA\x09\x02\x03<i4\x00", b"SA\x01\x07\x03<i4\x00",
     b"SA\x01\x02\x03|O8\x00", b"SA\x01\x02\x03<i4\x01" + (10**6).to_bytes(8, "little") + b"x\x9c",
     b"SA\x01\x02\x03zz9\x00", b"SA\x01\x00\x03<i4\x01" + (3).to_bytes(8, "little") + b"\0" * 11],
)  # fmt: skip
def test_codec_rejects_garbage(blob: bytes) -> None:
    with pytest.raises(TraceError):
        codec.decode(blob)


def test_codec_base_round_trip() -> None:
    base = np.random.default_rng(0).permutation(64 * 70).astype(np.int32).reshape(64, 70)  # fragmented pages
    new = base.copy()
    new[5, 60:] = 99_999
    d = codec.digest(base)
    blob = codec.encode_with_base(new, codec.Base(base, d))
    assert codec.base_digest(blob) == d and codec.base_digest(codec.encode(new)) is None
    assert len(blob) < len(codec.encode(new)) // 10
    assert np.array_equal(codec.decode(blob, base), new)
    with pytest.raises(TraceError, match="needs its base"):
        codec.decode(blob)
    with pytest.raises(TraceError):
        codec.decode(blob, base + 1)  # the wrong base: zlib's dictionary check fails
    f = np.linspace(0, 1, 2000, dtype=np.float32)
    assert np.array_equal(codec.decode(codec.encode_with_base(f * 2, codec.Base(f, codec.digest(f))), f), f * 2)


def test_codec_rejects_bad_zlib_payload() -> None:
    good = codec.encode(np.arange(100, dtype=np.int64))
    for cut in (len(good) - 1, len(good) - 5, 20):
        with pytest.raises(TraceError):
            codec.decode(good[:cut])
    with pytest.raises(TraceError):
        codec.decode(good + b"trailing")
    with pytest.raises(TraceError):
        codec.encode(np.array(["a"]))


def test_request_record_and_span_fields(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "t.db")
    rec = RequestRecord(request_id=2**40, prompt_tokens=(), output_tokens=(0,), arrival_iteration=0,
                        finish_iteration=None, finish_reason="unfinished")  # fmt: skip
    span = StreamSpan("plan", "metadata", -5, 2**63 - 1)
    with TraceWriter(path, make_run()) as w:
        w.write_request(rec)
        w.write_step(dataclasses.replace(make_step(0), spans=(span,)))
    with TraceReader(path) as r:
        assert r.requests() == [rec]
        assert r.step(0).spans == (span,)


def test_batch_queue_blocks_when_full_and_keeps_order() -> None:
    import threading
    import time

    from specscope.tracer.batch_queue import BatchQueue

    q: BatchQueue[int] = BatchQueue(4)
    for i in range(4):
        q.put(i)
    done = threading.Event()

    def producer() -> None:
        for i in range(4, 10):
            q.put(i)
        done.set()

    t = threading.Thread(target=producer)
    t.start()
    time.sleep(0.05)
    assert not done.is_set()  # full: the producer waits (backpressure)
    got: list[int] = []
    while len(got) < 10:
        got += q.get_batch(3)
    t.join(5)
    assert done.is_set() and got == list(range(10))
