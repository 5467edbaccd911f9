"""The engine-to-writer wire: every message kind round-trips, a batch of mixed steps comes back as the same steps and
the same stored bodies as the writer's own path, and layouts shared by graph replays cross the pipe once."""

from __future__ import annotations

import dataclasses
import os
import sys

import numpy as np
import pytest
from specscope.tracer import codec, tables
from specscope.tracer.pipe_format import (
    Close,
    End,
    Flush,
    Meta,
    Refused,
    Request,
    Start,
    Steps,
    decode,
    encode,
    encode_steps,
)
from specscope.tracer.process_writer import ProcessTraceWriter
from specscope.tracer.schema import ArraySnapshot, CallError, Step, StreamWait
from specscope.tracer.step_batch import (
    HEADER_FIELDS,
    LayoutTable,
    StepBatchBuilder,
    batch_columns,
    batch_of,
    batch_steps,
    parts_from_raw,
    raw_from_step,
    step_from_raw,
)
from specscope.tracer.store import TraceReader
from stepgen import make_request, make_run, make_step

LAYOUT = (("page_table", "int32", (4, 6), 0x1000), ("seq_lens", "int32", (4,), 0x2000))
CROP = {"page_table": 2}


def _mixed() -> list[dict]:
    """Eager packs, graph replays sharing one layout object, host and float arrays, ragged tokens, errors, waits."""
    raws = []
    for i in range(8):
        s = make_step(i)
        s = dataclasses.replace(
            s, waits=(StreamWait("plan", "compute", "producers"),) if i % 2 else (),
            errors=(CallError("kernel:xqa", "RuntimeError", f"bad q_len {i}"),) if i % 3 == 0 else (),
            faults_fired=("stale-page-table",) if i % 4 == 1 else (),
            arrays=s.arrays + (ArraySnapshot("attn_out", "float32", (2, 3), 0,
                                             np.arange(6, dtype=np.float32).reshape(2, 3) / (i + 1)),))  # fmt: skip
        raw = raw_from_step(s)
        flat = np.arange(28, dtype=np.int64) + i
        layout = LAYOUT if i % 2 else tuple(LAYOUT)  # replays: the one object; eager: a copy of it
        raw["packs"] = [(flat, layout if i % 2 else tuple(list(e) for e in layout), CROP)]
        if i == 2:
            raw["requests"] = {k: np.asarray(v) if k in ("slot", "num_q_tokens") else v
                               for k, v in raw["requests"].items()}
        if i == 5:
            raw["requests"] = {}
        raws.append(raw)
    return raws


def _container(cols: tables.StepColumns) -> bytes:
    return tables.encode_columns(cols, lambda name, v: codec.digest(v).hex()).container


def test_header_fields_are_the_steps() -> None:
    assert tuple(make_step(0).header_dict()) == HEADER_FIELDS


def test_every_message_kind_round_trips() -> None:
    batch = batch_of(_mixed())
    msgs = [Start("/x/t.db", make_run().to_dict(), True), Steps(batch), Request(make_request(1).to_dict()),
            Meta("k", "v"), End("error", 3, "boom", 7), End("closed", None, "", None), Refused("why"), Flush(),
            Close()]
    for m in msgs:
        assert decode(encode(m)) == m
    assert decode(encode(msgs[2])).record == make_request(1).to_dict()

    class Version(str):  # torch.__version__ is a str subclass, and run info carries it
        pass

    start = decode(encode(Start("/x", {"torch": Version("2.1"), "shape": (1, 2)}, False)))
    assert isinstance(start, Start) and start.run == {"torch": "2.1", "shape": [1, 2]}


def test_a_mixed_batch_is_the_same_steps_and_bodies() -> None:
    raws = _mixed()
    batch = decode(encode(Steps(batch_of(raws))))
    assert isinstance(batch, Steps)
    assert batch_steps(batch.batch) == [step_from_raw(r) for r in raws]
    got = [_container(c) for c in batch_columns(batch.batch)]
    assert got == [_container(tables.columns_from_parts(parts_from_raw(r))) for r in raws]
    cols = next(iter(batch_columns(batch.batch)))
    assert [(a[0], a[4].shape) for a in cols.arrays][:2] == [("page_table", (4, 2)), ("seq_lens", (4,))]


def test_replayed_layouts_cross_the_pipe_once() -> None:
    table, known = LayoutTable(), []  # the sender's and the receiver's memory
    raws = _mixed()
    sizes = []
    for _ in range(3):
        (body,) = encode_steps(raws, table)
        msg = decode(body)
        assert isinstance(msg, Steps)
        sizes.append(len(body))
        got = [_container(c) for c in batch_columns(msg.batch, known)]
        assert got == [_container(tables.columns_from_parts(parts_from_raw(r))) for r in raws]
    assert sizes[1] == sizes[2] < sizes[0]


def test_a_ragged_request_column_is_refused_in_the_writers_words() -> None:
    raws = [raw_from_step(make_step(i)) for i in range(3)]
    raws[1]["requests"]["slot"] = raws[1]["requests"]["slot"][:-1]
    b = StepBatchBuilder()
    for r in raws:
        b.add_raw(r)
    with pytest.raises(ValueError, match="step 1: a request column has"):
        b.finish()
    bodies = encode_steps(raws)
    first, refused = (decode(x) for x in bodies)
    assert isinstance(first, Steps) and len(first.batch.index) == 1
    assert isinstance(refused, Refused) and "step 1: a request column has" in refused.reason


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX pipes")
def test_process_writer_stores_what_was_written(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "w.db")
    raws = _mixed()
    w = ProcessTraceWriter(path, make_run())
    w.write_raw_steps(raws[:5])
    w.write_raw_step(raws[5])
    w.write_raw_steps(raws[6:])
    w.write_step(make_step(8))
    w.write_request(make_request(1))
    w.write_meta("note", "hello")
    w.set_end("closed", lost_in_flight=0)
    w.close()
    expected: list[Step] = [step_from_raw(r) for r in raws] + [make_step(8)]
    with TraceReader(path) as r:
        assert r.is_closed() and r.num_steps() == 9
        assert [r.step(i) for i in range(9)] == expected
        assert r.requests() == [make_request(1)]
