"""The SQLite layout of a trace file (DDL) and the encoding of step rows and bodies.

Shared by the writer and the reader so both sides agree on one definition;
`docs/trace-format.md` documents every table and column.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import operator
import struct
import zlib
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from . import codec
from .schema import (
    MAGIC,
    SCHEMA_VERSION,
    ArraySnapshot,
    ForwardMode,
    GraphPhase,
    RequestRecord,
    RequestState,
    Step,
    StreamSpan,
    Violation,
    step_from_parts,
)

SQLITE_HEADER = b"SQLite format 3\x00"
BODY_ZLIB_LEVEL = 1

DDL = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE run (id INTEGER PRIMARY KEY CHECK (id = 1), info TEXT NOT NULL);
CREATE TABLE steps (
    idx INTEGER PRIMARY KEY,
    iteration INTEGER NOT NULL,
    mode TEXT NOT NULL,
    model TEXT NOT NULL,
    step_id INTEGER,
    batch_size INTEGER NOT NULL,
    padded_batch_size INTEGER NOT NULL,
    graph TEXT NOT NULL,
    tokens_per_request INTEGER NOT NULL,
    num_draft_tokens INTEGER NOT NULL,
    page_size INTEGER NOT NULL,
    start_ns INTEGER NOT NULL,
    end_ns INTEGER NOT NULL,
    scalars TEXT NOT NULL,
    num_query_tokens INTEGER NOT NULL,
    num_drafted_tokens INTEGER NOT NULL,
    accept_hist TEXT
);
CREATE TABLE step_bodies (idx INTEGER PRIMARY KEY, body BLOB NOT NULL);
CREATE TABLE blobs (id INTEGER PRIMARY KEY, digest BLOB NOT NULL UNIQUE, data BLOB NOT NULL);
CREATE TABLE requests (
    request_id INTEGER PRIMARY KEY,
    finish_reason TEXT NOT NULL,
    num_prompt_tokens INTEGER NOT NULL,
    num_output_tokens INTEGER NOT NULL,
    record TEXT NOT NULL
);
CREATE TABLE violations (
    id INTEGER PRIMARY KEY,
    step INTEGER NOT NULL,
    check_id TEXT NOT NULL,
    severity TEXT NOT NULL,
    request_id INTEGER,
    message TEXT NOT NULL,
    source TEXT NOT NULL
);
CREATE INDEX violations_step ON violations (step);
CREATE INDEX violations_check ON violations (check_id);
"""

REQUIRED_TABLES = ("meta", "run", "steps", "step_bodies", "blobs", "requests", "violations")

# Header columns in `steps`, in the order the reader selects them; `idx` is Step.index.
HEADER_COLUMNS = (
    "idx", "iteration", "mode", "model", "step_id", "batch_size", "padded_batch_size", "graph",
    "tokens_per_request", "num_draft_tokens", "page_size", "start_ns", "end_ns", "scalars",
)  # fmt: skip
STEP_COLUMNS = HEADER_COLUMNS + ("num_query_tokens", "num_drafted_tokens", "accept_hist")
INSERT_STEP = f"INSERT INTO steps ({', '.join(STEP_COLUMNS)}) VALUES ({', '.join('?' * len(STEP_COLUMNS))})"
INSERT_VIOLATION = (
    "INSERT INTO violations (step, check_id, severity, request_id, message, source) VALUES (?, ?, ?, ?, ?, ?)"
)
UPSERT_REQUEST = (
    "INSERT INTO requests (request_id, finish_reason, num_prompt_tokens, num_output_tokens, record)"
    " VALUES (?, ?, ?, ?, ?) ON CONFLICT (request_id) DO UPDATE SET finish_reason = excluded.finish_reason,"
    " num_prompt_tokens = excluded.num_prompt_tokens, num_output_tokens = excluded.num_output_tokens,"
    " record = excluded.record"
)

# Request fields by storage kind: ints become one int64 column each (a 2-D array), int tuples become
# flattened values plus lengths, anything else (a later minor version's field) a JSON list.
_FIELDS = dataclasses.fields(RequestState)
REQUEST_FIELDS = tuple(f.name for f in _FIELDS)
REQUEST_INT_FIELDS = tuple(f.name for f in _FIELDS if f.type == "int")
REQUEST_TUPLE_FIELDS = tuple(f.name for f in _FIELDS if f.type == "tuple[int, ...]")
REQUEST_JSON_FIELDS = tuple(n for n in REQUEST_FIELDS if n not in REQUEST_INT_FIELDS + REQUEST_TUPLE_FIELDS)
ARRAY_FIELDS = ("name", "dtype", "shape", "data_ptr", "ref")
SPAN_FIELDS = tuple(f.name for f in dataclasses.fields(StreamSpan))
INLINE_MAX_BYTES = 4096  # larger arrays (page tables) go to the content-addressed blobs table
BODY_MAGIC = b"SB"
BODY_VERSION = 1
_request_row = operator.attrgetter(*REQUEST_FIELDS)
_span_row = operator.attrgetter(*SPAN_FIELDS)


def meta_rows() -> list[tuple[str, str]]:
    """The `meta` rows a new trace starts with."""
    return [("magic", MAGIC), ("schema_version", SCHEMA_VERSION)]


def _json_default(o: Any) -> Any:
    # Engine code hands over numpy scalars freely; JSON has no such types.
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.bool_):
        return bool(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"{type(o).__name__} is not JSON serializable")


_encoder = json.JSONEncoder(separators=(",", ":"), default=_json_default)  # reused: built once, not per call


def dumps(obj: Any) -> str:
    """Compact JSON (numpy scalars allowed)."""
    return _encoder.encode(obj)


class _Inline:
    """The binary section of a body: arrays as uncompressed codec blobs (the body is zlib'd whole)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0

    def add(self, arr: np.ndarray) -> list[int]:
        b = codec.encode(arr, compress=False)
        self.parts.append(b)
        self.size += len(b)
        return [self.size - len(b), len(b)]


def _int_array(values: Iterable[int], count: int) -> np.ndarray:
    # int32 when every value fits (token ids, lengths, slots always do): half the bytes to compress.
    # NumPy refuses out-of-range Python ints, so a failed int32 pass falls back to int64 exactly.
    values = list(values)
    try:
        return np.fromiter(values, np.int32, count=count)
    except OverflowError:
        return np.fromiter(values, np.int64, count=count)


_I_ACCEPT = REQUEST_INT_FIELDS.index("accept_length")
_I_QTOKENS = REQUEST_INT_FIELDS.index("num_q_tokens")
_T_DRAFTS = REQUEST_TUPLE_FIELDS.index("draft_tokens")


def encode_step(step: Step, blob_ref: Callable[[str, np.ndarray], str]) -> tuple[tuple[Any, ...], bytes]:
    """The `steps` row of a step and its body container, not yet compressed (see `compress_body`).

    `blob_ref(name, values)` files an array too large to inline and returns its digest (hex).
    """
    inline = _Inline()
    reqs = step.requests
    n = len(reqs)
    cols = dict(zip(REQUEST_FIELDS, zip(*map(_request_row, reqs), strict=False), strict=True)) if n else {}
    # Int fields and the lengths of the tuple fields form one [fields, n] array; the tuples' values
    # are concatenated (field after field) into one flat array. Two arrays per step, not one per field.
    tuple_cols = [cols.get(f, ()) for f in REQUEST_TUPLE_FIELDS]
    lens = [list(map(len, c)) for c in tuple_cols]
    table = [cols.get(f, ()) for f in REQUEST_INT_FIELDS] + lens
    ints = _int_array(itertools.chain.from_iterable(table), len(table) * n).reshape(len(table), n)
    flat = itertools.chain.from_iterable(itertools.chain.from_iterable(tuple_cols))
    vals = _int_array(flat, sum(map(sum, lens)))
    arrays = []
    for a in step.arrays:
        v = np.asarray(a.values)
        ref = inline.add(v) if v.nbytes <= INLINE_MAX_BYTES else blob_ref(a.name, v)
        arrays.append([a.name, a.dtype, a.shape, a.data_ptr, ref])
    body = {
        "requests": {
            "count": n,
            "int_fields": REQUEST_INT_FIELDS,
            "tuple_fields": REQUEST_TUPLE_FIELDS,
            "ints": inline.add(ints),
            "tuple_values": inline.add(vals),
            "json": {f: list(cols.get(f, ())) for f in REQUEST_JSON_FIELDS},
        },
        "array_fields": ARRAY_FIELDS,
        "arrays": arrays,
        "span_fields": SPAN_FIELDS,
        "spans": [_span_row(s) for s in step.spans],
        "violations": [v.to_dict() for v in step.violations],
    }
    js = dumps(body).encode()
    container = b"".join([BODY_MAGIC, struct.pack("<BI", BODY_VERSION, len(js)), js, *inline.parts])
    hist = None
    drafted = 0
    if step.mode == ForwardMode.TARGET_VERIFY and n:
        counts = [0] * (max(max(table[_I_ACCEPT]), 0) + 1)
        for length in table[_I_ACCEPT]:
            counts[max(length, 0)] += 1
        hist = dumps(counts)
        drafted = sum(lens[_T_DRAFTS])
    elif step.mode == ForwardMode.TARGET_VERIFY:
        hist = "[]"
    row = (
        int(step.index), int(step.iteration), ForwardMode(step.mode).value, str(step.model),
        None if step.step_id is None else int(step.step_id), int(step.batch_size),
        int(step.padded_batch_size), GraphPhase(step.graph).value, int(step.tokens_per_request),
        int(step.num_draft_tokens), int(step.page_size), int(step.start_ns), int(step.end_ns),
        dumps({str(k): int(v) for k, v in step.scalars.items()}),
        sum(table[_I_QTOKENS]) if n else 0, drafted, hist,
    )  # fmt: skip
    return row, container


def compress_body(container: bytes) -> bytes:
    """The `step_bodies.body` of a container made by `encode_step`."""
    return zlib.compress(container, BODY_ZLIB_LEVEL)


class Body:
    """A decoded step body: its JSON part and its inline array section."""

    def __init__(self, data: bytes) -> None:
        raw = zlib.decompress(data)
        if raw[:2] != BODY_MAGIC:
            raise ValueError("step body has a bad magic")
        version, jlen = struct.unpack_from("<BI", raw, 2)
        if version != BODY_VERSION:
            raise ValueError(f"step body has unknown version {version}")
        self.json = json.loads(raw[7 : 7 + jlen])
        if not isinstance(self.json, dict):
            raise ValueError("step body is not a JSON object")
        self._inline = memoryview(raw)[7 + jlen :]

    def rows(self, fields_key: str, rows_key: str) -> list[dict[str, Any]]:
        """Records stored as a field list plus rows, as dicts."""
        fields = self.json.get(fields_key, [])
        return [dict(zip(fields, row, strict=True)) for row in self.json.get(rows_key, [])]

    def blob_digests(self) -> list[bytes]:
        """Digests of the blobs-table arrays this body references."""
        refs = [a["ref"] for a in self.rows("array_fields", "arrays")]
        return [bytes.fromhex(r) for r in refs if not isinstance(r, list)]

    def array(self, ref: Any, blobs: dict[bytes, np.ndarray]) -> np.ndarray:
        """The array behind a reference: inline [offset, length] or a blob digest (hex)."""
        if isinstance(ref, list):
            off, n = (int(x) for x in ref)
            if off < 0 or n < 0 or off + n > len(self._inline):
                raise ValueError("inline array reference out of range")
            return codec.decode(self._inline[off : off + n])
        return blobs[bytes.fromhex(ref)]

    def requests(self) -> list[RequestState]:
        """The RequestStates, rebuilt from columns."""
        r = self.json["requests"]
        n = int(r["count"])
        cols: dict[str, list[Any]] = {}
        ints = self.array(r["ints"], {})
        fields = [str(f) for f in r["int_fields"]]
        tfields = [str(f) for f in r["tuple_fields"]]
        if ints.shape != (len(fields) + len(tfields), n):
            raise ValueError("request columns do not match the request count")
        table = ints.tolist()
        for f, col in zip(fields, table, strict=False):
            cols[f] = col
        vals = self.array(r["tuple_values"], {}).tolist()
        lens = table[len(fields) :]
        if int(ints[len(fields) :].sum()) != len(vals) or (ints[len(fields) :] < 0).any():
            raise ValueError("request tuple columns are inconsistent")
        pos = 0
        for f, col_lens in zip(tfields, lens, strict=True):
            out = []
            for k in col_lens:
                out.append(tuple(vals[pos : pos + k]))
                pos += k
            cols[f] = out
        for f, col in r.get("json", {}).items():
            if len(col) != n:
                raise ValueError(f"request column {f} has the wrong length")
            cols[f] = col
        if all(f in cols for f in REQUEST_FIELDS):
            # The usual case: every field present, so rows go in positionally (~5x faster than kwargs).
            return [RequestState(*row) for row in zip(*(cols[f] for f in REQUEST_FIELDS), strict=True)]
        known = [f for f in REQUEST_FIELDS if f in cols]
        return [RequestState(**{f: cols[f][j] for f in known}) for j in range(n)]


def header_from_row(row: tuple[Any, ...] | list[Any]) -> dict[str, Any]:
    """`Step.header_dict()` form of the HEADER_COLUMNS part of a `steps` row."""
    h = dict(zip(("index",) + HEADER_COLUMNS[1:], row[: len(HEADER_COLUMNS)], strict=True))
    scalars = json.loads(h["scalars"])
    if not isinstance(scalars, dict):
        raise ValueError("step scalars are not a JSON object")
    h["scalars"] = scalars
    return h


def step_from_row(row: tuple[Any, ...], body: Body, blobs: dict[bytes, np.ndarray]) -> Step:
    """Assemble a Step from its header row, decoded body and decoded blobs (by digest)."""
    snaps = [
        ArraySnapshot(
            name=str(a["name"]), dtype=str(a["dtype"]), shape=tuple(int(n) for n in a["shape"]),
            data_ptr=int(a["data_ptr"]), values=body.array(a["ref"], blobs),
        )
        for a in body.rows("array_fields", "arrays")
    ]  # fmt: skip
    spans = body.rows("span_fields", "spans")
    step = step_from_parts(header_from_row(row), [], snaps, spans, list(body.json.get("violations", [])))
    return dataclasses.replace(step, requests=tuple(body.requests()))


def violation_row(v: Violation, source: str) -> tuple[Any, ...]:
    """The `violations` row of a violation."""
    return (
        int(v.step), str(v.check_id), v.severity.value,
        None if v.request_id is None else int(v.request_id), str(v.message), source,
    )  # fmt: skip


def request_row(rec: RequestRecord) -> tuple[Any, ...]:
    """The `requests` row of a request record."""
    return (
        int(rec.request_id), str(rec.finish_reason), len(rec.prompt_tokens), len(rec.output_tokens),
        dumps(rec.to_dict()),
    )  # fmt: skip
