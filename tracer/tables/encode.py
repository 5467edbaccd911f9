"""Encoding a step: its request columns, its `steps` row, its body container and its rows of the queryable
tables."""

from __future__ import annotations

import itertools
import operator
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import codec
from ..schema import ForwardMode, GraphPhase, Step
from .compression import compress_request_data
from .json_text import fast_dumps
from .layout import (
    ARRAY_FIELDS,
    BODY_MAGIC,
    BODY_VERSION,
    INLINE_MAX_BYTES,
    REQUEST_FIELDS,
    REQUEST_INT_FIELDS,
    REQUEST_JSON_FIELDS,
    REQUEST_TUPLE_FIELDS,
    SPAN_FIELDS,
    STEP_REQUEST_FIELDS,
    WAIT_FIELDS,
)

_request_row = operator.attrgetter(*REQUEST_FIELDS)
_span_row = operator.attrgetter(*SPAN_FIELDS)
_I32 = np.iinfo(np.int32)
_I_RID = REQUEST_INT_FIELDS.index("request_id")
_I_DATA = [REQUEST_INT_FIELDS.index(f) for f in STEP_REQUEST_FIELDS]
_I_ACCEPT = REQUEST_INT_FIELDS.index("accept_length")
_I_QLEN = REQUEST_INT_FIELDS.index("num_q_tokens")
_I_DRAFT_LEN = len(REQUEST_INT_FIELDS) + REQUEST_TUPLE_FIELDS.index("draft_tokens")


class _Inline:
    """The binary section of a body: arrays as uncompressed codec blobs (the body is compressed whole)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0

    def add(self, arr: np.ndarray) -> list[int]:
        header, data = codec.encode_parts_raw(arr)
        self.parts += (header, data)  # joined once with the whole container, not per array
        n = len(header) + len(data)
        self.size += n
        return [self.size - n, n]


def _int_table(cols: Sequence[Sequence[int]], n: int) -> np.ndarray:
    # fromiter over one flat chain: ~3x faster than np.array on a list of lists; it refuses ints beyond int64
    # (OverflowError), which the writer reports as an unstorable step.
    return narrow_ints(np.fromiter(itertools.chain.from_iterable(cols), np.int64, count=len(cols) * n)
                       .reshape(len(cols), n))


def _flat_ints(values: Iterable[int], count: int) -> np.ndarray:
    try:
        return np.fromiter(values, np.int32, count=count)
    except OverflowError:
        return np.fromiter(values, np.int64, count=count)


@dataclass(kw_only=True)
class _StepFacts:
    """What a step carries beside its header and request columns, in both of the column forms below."""

    json_cols: dict[str, list[Any]] = field(default_factory=dict)
    arrays: list[tuple[str, str, tuple[int, ...], int, np.ndarray]] = field(default_factory=list)
    spans: list[tuple[str, str, int, int]] = field(default_factory=list)
    violations: list[dict[str, Any]] = field(default_factory=list)
    waits: list[tuple[str, str, str]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    faults_fired: list[str] = field(default_factory=list)


@dataclass
class StepParts(_StepFacts):
    """A step in columns, as both `Step` objects and the recorder's compact form reduce to before encoding."""

    header: dict[str, Any]  # Step.header_dict() form
    num_requests: int
    int_cols: dict[str, Sequence[int]]  # REQUEST_INT_FIELDS -> n values
    tuple_cols: dict[str, Sequence[Sequence[int]]]  # REQUEST_TUPLE_FIELDS -> n tuples


def parts_from_step(step: Step) -> StepParts:
    """The columns of a schema Step."""
    reqs = step.requests
    n = len(reqs)
    cols = dict(zip(REQUEST_FIELDS, zip(*map(_request_row, reqs), strict=False), strict=True)) if n else {}
    return StepParts(
        header=step.header_dict(), num_requests=n,
        int_cols={f: cols.get(f, ()) for f in REQUEST_INT_FIELDS},
        tuple_cols={f: cols.get(f, ()) for f in REQUEST_TUPLE_FIELDS},
        json_cols={f: list(cols.get(f, ())) for f in REQUEST_JSON_FIELDS},
        arrays=[(a.name, a.dtype, tuple(a.shape), a.data_ptr, a.values) for a in step.arrays],
        spans=[_span_row(s) for s in step.spans],
        violations=[v.to_dict() for v in step.violations],
        waits=[(w.stream, w.on_stream, w.on_span) for w in step.waits],
        errors=[e.to_dict() for e in step.errors],
        faults_fired=[str(f) for f in step.faults_fired],
    )  # fmt: skip


@dataclass
class EncodedStep:
    """Everything one step adds to the file, ready for SQLite (the body not yet compressed)."""

    index: int
    row: tuple[Any, ...]  # the `steps` row
    container: bytes  # the body before compression
    request_row: tuple[Any, ...] | None  # the `step_requests` row (None without requests)
    request_ids: list[int]
    span_rows: list[tuple[Any, ...]]
    fault_rows: list[tuple[str, int]]
    violations: list[dict[str, Any]]  # attached by the recorder (v2 engines attach none)
    max_span_ns: int


@dataclass
class StepColumns(_StepFacts):
    """A step as numpy columns: what `encode_columns` encodes (the writer process builds it straight from its
    input frame; `columns_from_parts` builds it from `StepParts`)."""

    header: dict[str, Any]  # Step.header_dict() form
    table: np.ndarray  # [len(REQUEST_INT_FIELDS) + len(REQUEST_TUPLE_FIELDS), n]: int fields, then tuple lengths
    values: np.ndarray  # 1-D: the tuple fields' values, field after field, request after request


def narrow_ints(a: np.ndarray) -> np.ndarray:
    """int32 when every value fits (token ids, lengths, slots always do): half the bytes to compress."""
    # The ufuncs' own reductions: a.min() / a.max() add a Python wrapper each, on the writer's per-step path.
    if a.size == 0 or (int(np.minimum.reduce(a, axis=None)) >= _I32.min
                       and int(np.maximum.reduce(a, axis=None)) <= _I32.max):  # fmt: skip
        return a.astype(np.int32)
    return a.astype(np.int64, copy=False)


def columns_from_parts(p: StepParts) -> StepColumns:
    """The numpy columns of a `StepParts`; ValueError if a request column has the wrong length."""
    idx = int(p.header["index"])
    n = p.num_requests
    ints_src = [p.int_cols.get(f, ()) for f in REQUEST_INT_FIELDS]
    tuple_src = [p.tuple_cols.get(f, ()) or ((),) * n for f in REQUEST_TUPLE_FIELDS]
    lens: list[Sequence[int]] = [list(map(len, c)) for c in tuple_src]
    for c in ints_src + lens:
        if len(c) != n:
            raise ValueError(f"step {idx}: a request column has {len(c)} values for {n} requests")
    # Int fields and the lengths of the tuple fields form one [fields, n] array; the tuples' values
    # are concatenated (field after field) into one flat array. Two arrays per step, not one per field.
    table = _int_table(ints_src + lens, n)
    flat = itertools.chain.from_iterable(itertools.chain.from_iterable(tuple_src))
    vals = _flat_ints(flat, sum(map(sum, lens)))
    return StepColumns(p.header, table, vals, json_cols=p.json_cols, arrays=p.arrays, spans=p.spans,
                       violations=p.violations, waits=p.waits, errors=p.errors, faults_fired=p.faults_fired)


def encode_parts(p: StepParts, blob_ref: Callable[[str, np.ndarray], str]) -> EncodedStep:
    """Encode a step's columns: its `steps` row, its body container and its rows of the queryable tables.

    `blob_ref(name, values)` files an array too large to inline and returns its digest (hex).
    """
    return encode_columns(columns_from_parts(p), blob_ref)


def encode_columns(c: StepColumns, blob_ref: Callable[[str, np.ndarray], str]) -> EncodedStep:
    """`encode_parts` for numpy columns (the writer process's path: no per-request Python objects)."""
    h = c.header
    idx = int(h["index"])
    table = c.table
    n = int(table.shape[1])
    if table.shape[0] != len(REQUEST_INT_FIELDS) + len(REQUEST_TUPLE_FIELDS):
        raise ValueError(f"step {idx}: the request table has {table.shape[0]} rows")
    if n and int(np.add.reduce(table[len(REQUEST_INT_FIELDS) :], axis=None)) != len(c.values):
        raise ValueError(f"step {idx}: the request tuple lengths do not add up to their values")
    inline = _Inline()
    arrays = []
    for name, dtype, shape, ptr, values in c.arrays:
        v = np.asarray(values)
        ref = inline.add(v) if v.nbytes <= INLINE_MAX_BYTES else blob_ref(name, v)
        arrays.append([name, dtype, [int(x) for x in shape], int(ptr), ref])
    body: dict[str, Any] = {
        "requests": {
            "count": n,
            "int_fields": REQUEST_INT_FIELDS,
            "tuple_fields": REQUEST_TUPLE_FIELDS,
            "ints": inline.add(table),
            "tuple_values": inline.add(c.values),
            "json": c.json_cols,
        },
        "array_fields": ARRAY_FIELDS,
        "arrays": arrays,
        "span_fields": SPAN_FIELDS,
        "spans": c.spans,
        "violations": c.violations,
    }
    if c.waits:
        body["wait_fields"] = WAIT_FIELDS
        body["waits"] = c.waits
    if c.errors:
        body["errors"] = c.errors
    if c.faults_fired:
        body["faults_fired"] = c.faults_fired
    js = fast_dumps(body)
    container = b"".join([BODY_MAGIC, struct.pack("<BI", BODY_VERSION, len(js)), js, *inline.parts])
    mode = ForwardMode(h["mode"])
    hist = None
    drafted = 0
    if mode == ForwardMode.TARGET_VERIFY and n:
        hist = fast_dumps(np.bincount(np.maximum(table[_I_ACCEPT], 0)).tolist()).decode()
        drafted = int(np.add.reduce(table[_I_DRAFT_LEN]))
    elif mode == ForwardMode.TARGET_VERIFY:
        hist = "[]"
    step_id = h.get("step_id")
    scalars = h.get("scalars", {})
    row = (
        idx, int(h["iteration"]), mode.value, str(h["model"]), None if step_id is None else int(step_id),
        int(h["batch_size"]), int(h["padded_batch_size"]), GraphPhase(h["graph"]).value,
        int(h["tokens_per_request"]), int(h["num_draft_tokens"]), int(h["page_size"]), int(h["start_ns"]),
        int(h["end_ns"]), fast_dumps({str(k): int(v) for k, v in scalars.items()} if scalars else {}).decode(),
        int(np.add.reduce(table[_I_QLEN])) if n else 0, drafted, hist,
    )  # fmt: skip
    req_row = None
    ids: list[int] = []
    if n:
        rid = table[_I_RID]
        ids = rid.tolist()
        # Raw little-endian ids, so SQLite's instr() finds a request's steps without decoding anything.
        raw_ids = rid.astype("<i4" if table.dtype == np.int32 else "<i8").tobytes()
        data = compress_request_data(codec.encode(table[_I_DATA], compress=False))
        req_row = (idx, n, 4 if table.dtype == np.int32 else 8, raw_ids, data)
    span_rows = [(idx, k, str(s[0]), str(s[1]), int(s[2]), int(s[3])) for k, s in enumerate(c.spans)]
    max_span = max((r[5] - r[4] for r in span_rows), default=0)
    faults = [(f, idx) for f in dict.fromkeys(c.faults_fired)]
    return EncodedStep(idx, row, container, req_row, ids, span_rows, faults, list(c.violations), max_span)


def encode_step(step: Step, blob_ref: Callable[[str, np.ndarray], str]) -> tuple[tuple[Any, ...], bytes]:
    """The `steps` row of a step and its body container, not yet compressed (see `BodyCompressor`)."""
    e = encode_parts(parts_from_step(step), blob_ref)
    return e.row, e.container
