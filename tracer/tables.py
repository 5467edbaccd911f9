"""The SQLite layout of a trace file (DDL) and the encoding of step rows and bodies.

Shared by the writer and the reader so both sides agree on one definition;
`docs/trace-format.md` documents every table and column. Schema 2 adds queryable tables beside the step
bodies (`spans`, `step_requests`, `fault_firings`, violation cells) and zstd-compressed bodies (body
version 2, optionally with a dictionary trained on the trace's first steps); schema 1 bodies (zlib,
body version 1) still decode.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import operator
import struct
import threading
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import zstandard

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
    StreamWait,
    Violation,
    step_from_parts,
)

SQLITE_HEADER = b"SQLite format 3\x00"
BODY_ZLIB_LEVEL = 1  # schema 1 bodies (still read; the upgrade command rewrites them)
# Level 1 with a trained dictionary (digested once): ~1.26 KB per bs-64 body, ~20% less CPU than level 3 for
# ~1% more bytes, and far below zlib level 1's ~170 us and ~1.8 KB (benchmarks/results/trace_store.md).
BODY_ZSTD_LEVEL = 1
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"

_V1_DDL = """
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
"""

DDL = _V1_DDL + """
CREATE TABLE violations (
    id INTEGER PRIMARY KEY,
    step INTEGER NOT NULL,
    check_id TEXT NOT NULL,
    severity TEXT NOT NULL,
    request_id INTEGER,
    message TEXT NOT NULL,
    source TEXT NOT NULL,
    array TEXT,
    row INTEGER,
    col INTEGER,
    found TEXT,
    expected TEXT,
    related TEXT
);
CREATE INDEX violations_step ON violations (step, severity);
CREATE INDEX violations_check ON violations (check_id, step);
CREATE INDEX violations_severity ON violations (severity, step);
CREATE TABLE spans (
    step INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    stream TEXT NOT NULL,
    name TEXT NOT NULL,
    start_ns INTEGER NOT NULL,
    end_ns INTEGER NOT NULL,
    PRIMARY KEY (step, seq)
) WITHOUT ROWID;
CREATE INDEX spans_start ON spans (start_ns);
CREATE TABLE step_requests (
    step INTEGER PRIMARY KEY,
    num_requests INTEGER NOT NULL,
    id_bytes INTEGER NOT NULL,
    request_ids BLOB NOT NULL,
    data BLOB NOT NULL
);
CREATE TABLE request_life (
    request_id INTEGER PRIMARY KEY,
    first_step INTEGER NOT NULL,
    last_step INTEGER NOT NULL
);
CREATE TABLE fault_firings (fault TEXT NOT NULL, step INTEGER NOT NULL, PRIMARY KEY (fault, step)) WITHOUT ROWID;
CREATE TABLE zdicts (id INTEGER PRIMARY KEY, data BLOB NOT NULL);
CREATE INDEX steps_capture ON steps (model, mode, padded_batch_size, step_id, idx) WHERE graph = 'capture';
"""

REQUIRED_TABLES_V1 = ("meta", "run", "steps", "step_bodies", "blobs", "requests", "violations")
REQUIRED_TABLES = REQUIRED_TABLES_V1 + ("spans", "step_requests", "request_life", "fault_firings", "zdicts")

# Header columns in `steps`, in the order the reader selects them; `idx` is Step.index.
HEADER_COLUMNS = (
    "idx", "iteration", "mode", "model", "step_id", "batch_size", "padded_batch_size", "graph",
    "tokens_per_request", "num_draft_tokens", "page_size", "start_ns", "end_ns", "scalars",
)  # fmt: skip
STEP_COLUMNS = HEADER_COLUMNS + ("num_query_tokens", "num_drafted_tokens", "accept_hist")
INSERT_STEP = f"INSERT INTO steps ({', '.join(STEP_COLUMNS)}) VALUES ({', '.join('?' * len(STEP_COLUMNS))})"
VIOLATION_COLUMNS = (
    "step", "check_id", "severity", "request_id", "message", "source", "array", "row", "col", "found", "expected",
    "related",
)  # fmt: skip
# Traces of schema 2.0 have no `related` column; schema 1 has no cell columns at all.
VIOLATION_COLUMNS_2_0 = VIOLATION_COLUMNS[:-1]
INSERT_VIOLATION = (
    f"INSERT INTO violations ({', '.join(VIOLATION_COLUMNS)}) VALUES ({', '.join('?' * len(VIOLATION_COLUMNS))})"
)
INSERT_SPAN = "INSERT INTO spans (step, seq, stream, name, start_ns, end_ns) VALUES (?, ?, ?, ?, ?, ?)"
INSERT_STEP_REQUEST = (
    "INSERT INTO step_requests (step, num_requests, id_bytes, request_ids, data) VALUES (?, ?, ?, ?, ?)"
)
UPSERT_REQUEST_LIFE = (
    "INSERT INTO request_life (request_id, first_step, last_step) VALUES (?, ?, ?) ON CONFLICT (request_id)"
    " DO UPDATE SET first_step = min(first_step, excluded.first_step), last_step = max(last_step, excluded.last_step)"
)
INSERT_FAULT = "INSERT OR IGNORE INTO fault_firings (fault, step) VALUES (?, ?)"
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
# The rows of `step_requests.data` (an int array [5, n]; the batch row is the column), RequestState int fields.
STEP_REQUEST_FIELDS = ("slot", "seq_len_before", "seq_len_after", "num_q_tokens", "accept_length")
_REQ_DATA_LEVEL = -1  # ~2x faster than level 1 on these ~1.3 KB for ~100 more bytes
ARRAY_FIELDS = ("name", "dtype", "shape", "data_ptr", "ref")
SPAN_FIELDS = tuple(f.name for f in dataclasses.fields(StreamSpan))
WAIT_FIELDS = tuple(f.name for f in dataclasses.fields(StreamWait))
INLINE_MAX_BYTES = 4096  # larger arrays (page tables) go to the content-addressed blobs table
BODY_MAGIC = b"SB"
BODY_VERSION = 2  # written; 1 (schema 1, zlib) is still read
BODY_VERSIONS = (1, 2)
_request_row = operator.attrgetter(*REQUEST_FIELDS)
_span_row = operator.attrgetter(*SPAN_FIELDS)
_I32 = np.iinfo(np.int32)
_I_RID = REQUEST_INT_FIELDS.index("request_id")
_I_DATA = [REQUEST_INT_FIELDS.index(f) for f in STEP_REQUEST_FIELDS]
_I_ACCEPT = REQUEST_INT_FIELDS.index("accept_length")
_I_QLEN = REQUEST_INT_FIELDS.index("num_q_tokens")
_I_DRAFT_LEN = len(REQUEST_INT_FIELDS) + REQUEST_TUPLE_FIELDS.index("draft_tokens")


class _ThreadZstd(threading.local):
    """The dictionary-less zstd contexts of one thread."""

    # python-zstandard's compressors and decompressors keep one native context that two threads must not use
    # at once (it lets go of the GIL while it works): a context shared by the process let two readers on two threads
    # corrupt each other's output ("Data corruption detected" on a valid trace). Each thread makes its own on
    # first use; a context is cheap to keep and costly to make per call.

    def __init__(self) -> None:
        self.plain = zstandard.ZstdDecompressor()
        self.request_compressor = zstandard.ZstdCompressor(level=_REQ_DATA_LEVEL)


_zstd = _ThreadZstd()


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
# Step bodies: msgspec's JSON encoder is ~6x faster than json's on a body; the output is the same compact JSON
# (non-ASCII text as UTF-8 rather than \u escapes, which every JSON reader accepts).
_fast_encoder = msgspec.json.Encoder(enc_hook=_json_default)


def fast_dumps(obj: Any) -> bytes:
    """Compact UTF-8 JSON bytes (numpy scalars allowed), for the per-step hot path."""
    return _fast_encoder.encode(obj)


def dumps(obj: Any) -> str:
    """Compact JSON (numpy scalars allowed)."""
    return _encoder.encode(obj)


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
        data = _zstd.request_compressor.compress(codec.encode(table[_I_DATA], compress=False))
        req_row = (idx, n, 4 if table.dtype == np.int32 else 8, raw_ids, data)
    span_rows = [(idx, k, str(s[0]), str(s[1]), int(s[2]), int(s[3])) for k, s in enumerate(c.spans)]
    max_span = max((r[5] - r[4] for r in span_rows), default=0)
    faults = [(f, idx) for f in dict.fromkeys(c.faults_fired)]
    return EncodedStep(idx, row, container, req_row, ids, span_rows, faults, list(c.violations), max_span)


def encode_step(step: Step, blob_ref: Callable[[str, np.ndarray], str]) -> tuple[tuple[Any, ...], bytes]:
    """The `steps` row of a step and its body container, not yet compressed (see `BodyCompressor`)."""
    e = encode_parts(parts_from_step(step), blob_ref)
    return e.row, e.container


class BodyCompressor:
    """zstd for step bodies, with the trace's trained dictionary once there is one."""

    def __init__(self, dict_data: zstandard.ZstdCompressionDict | None = None) -> None:
        self.dict_id = 0 if dict_data is None else dict_data.dict_id()
        if dict_data is not None:
            # Digested once for this level: otherwise every compress() re-loads the 16 KiB dictionary (~2x the
            # cost of compressing a body). A private copy, so the caller's dictionary object is left as it was.
            dict_data = zstandard.ZstdCompressionDict(dict_data.as_bytes())
            dict_data.precompute_compress(level=BODY_ZSTD_LEVEL)
        self._c = zstandard.ZstdCompressor(level=BODY_ZSTD_LEVEL, dict_data=dict_data, write_content_size=True)

    def compress(self, container: bytes) -> bytes:
        """The `step_bodies.body` of a container made by `encode_parts`."""
        return self._c.compress(container)


def train_dictionary(samples: Sequence[bytes], size: int = 16384) -> zstandard.ZstdCompressionDict | None:
    """A zstd dictionary trained on body containers, or None when the samples are too few or too alike."""
    # zstandard types its samples list[bytes | bytearray | memoryview], which a list[bytes] is not (lists are
    # invariant): a list of that type holding the same objects.
    buffers: list[bytes | bytearray | memoryview] = list(samples)
    try:
        d = zstandard.train_dictionary(size, buffers)
    except zstandard.ZstdError:
        return None
    return d if d.dict_id() else None


def compress_body(container: bytes) -> bytes:
    """A body compressed without a dictionary (tests and one-off writers)."""
    return BodyCompressor().compress(container)


# A dictionary's decompressor comes from the reader (one per trace, used under the reader's lock).
DictLoader = Callable[[int], "zstandard.ZstdDecompressor"]
MAX_BODY_BYTES = 1 << 30


def decompress_body(data: bytes, dicts: DictLoader | None) -> bytes:
    """The container of a stored body: zstd (schema 2, maybe with a dictionary) or zlib (schema 1)."""
    if data[:4] == ZSTD_MAGIC:
        params = zstandard.get_frame_parameters(data)
        if params.content_size > MAX_BODY_BYTES:
            raise ValueError("step body claims an impossible size")
        d = _zstd.plain
        if params.dict_id:
            if dicts is None:
                raise ValueError(f"step body needs dictionary {params.dict_id}")
            d = dicts(params.dict_id)
        return d.decompress(data, max_output_size=MAX_BODY_BYTES)
    return zlib.decompress(data)


class Body:
    """A decoded step body: its JSON part and its inline array section."""

    def __init__(self, data: bytes, dicts: DictLoader | None = None) -> None:
        raw = decompress_body(data, dicts)
        if raw[:2] != BODY_MAGIC:
            raise ValueError("step body has a bad magic")
        version, jlen = struct.unpack_from("<BI", raw, 2)
        if version not in BODY_VERSIONS:
            raise ValueError(f"step body has unknown version {version}")
        self.version = version
        self.json = json.loads(raw[7 : 7 + jlen])
        if not isinstance(self.json, dict):
            raise ValueError("step body is not a JSON object")
        self._inline = memoryview(raw)[7 + jlen :]

    def rows(self, fields_key: str, rows_key: str) -> list[dict[str, Any]]:
        """Records stored as a field list plus rows, as dicts."""
        fields = self.json.get(fields_key, [])
        return [dict(zip(fields, row, strict=True)) for row in self.json.get(rows_key, [])]

    def array_rows(self, keep: set[str] | None = None) -> list[dict[str, Any]]:
        """The array entries (name, dtype, shape, data_ptr, ref), only those named in `keep` if given."""
        rows = self.rows("array_fields", "arrays")
        return rows if keep is None else [a for a in rows if a["name"] in keep]

    def blob_digests(self, keep: set[str] | None = None) -> list[bytes]:
        """Digests of the blobs-table arrays this body references (of the arrays in `keep`, if given)."""
        refs = [a["ref"] for a in self.array_rows(keep)]
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
            # The usual case: every field present. A frozen dataclass's __init__ sets each field through
            # object.__setattr__ (~2 us a row, 64 rows a step); filling the instance dict directly is the same
            # object (fields, equality, hash, repr) at a fifth of the cost.
            new, cls = object.__new__, RequestState
            states: list[RequestState] = []
            for row in zip(*(cols[f] for f in REQUEST_FIELDS), strict=True):
                st = new(cls)
                st.__dict__.update(zip(REQUEST_FIELDS, row, strict=True))
                states.append(st)
            return states
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


def step_from_row(
    row: tuple[Any, ...], body: Body, blobs: dict[bytes, np.ndarray], keep: set[str] | None = None
) -> Step:
    """Assemble a Step from its header row, decoded body and decoded blobs (by digest); with `keep`, only
    the arrays it names are decoded."""
    snaps = [
        ArraySnapshot(
            name=str(a["name"]), dtype=str(a["dtype"]), shape=tuple(int(n) for n in a["shape"]),
            data_ptr=int(a["data_ptr"]), values=body.array(a["ref"], blobs),
        )
        for a in body.array_rows(keep)
    ]  # fmt: skip
    spans = body.rows("span_fields", "spans")
    j = body.json
    step = step_from_parts(
        header_from_row(row), [], snaps, spans, list(j.get("violations", [])), body.rows("wait_fields", "waits"),
        list(j.get("errors", [])), [str(f) for f in j.get("faults_fired", [])],
    )  # fmt: skip
    return dataclasses.replace(step, requests=tuple(body.requests()))


def decode_request_data(data: bytes, n: int) -> np.ndarray:
    """The [5, n] int array of a `step_requests.data` value (rows: STEP_REQUEST_FIELDS)."""
    arr = codec.decode(_zstd.plain.decompress(data, max_output_size=MAX_BODY_BYTES))
    if arr.shape != (len(STEP_REQUEST_FIELDS), n):
        raise ValueError("step_requests data does not match its request count")
    return arr


def violation_row(v: Violation, source: str) -> tuple[Any, ...]:
    """The `violations` row of a violation."""
    return (
        int(v.step), str(v.check_id), v.severity.value, None if v.request_id is None else int(v.request_id),
        str(v.message), source, None if v.array is None else str(v.array), None if v.row is None else int(v.row),
        None if v.col is None else int(v.col), None if v.found is None else str(v.found),
        None if v.expected is None else str(v.expected),
        json.dumps([c.to_dict() for c in v.related], separators=(",", ":")) if v.related else None,
    )  # fmt: skip


def violation_insert(columns: Sequence[str]) -> tuple[str, int]:
    """The INSERT for a `violations` table with these columns (older traces lack some), and how many of
    `violation_row`'s leading values it takes."""
    have = set(columns)
    cols = [c for c in VIOLATION_COLUMNS if c in have]
    n = len(cols)
    if cols != list(VIOLATION_COLUMNS[:n]):
        raise ValueError(f"unexpected violations columns: {sorted(have)}")
    return f"INSERT INTO violations ({', '.join(cols)}) VALUES ({', '.join('?' * n)})", n


def violation_dict_row(d: dict[str, Any], source: str) -> tuple[Any, ...]:
    """The `violations` row of a `Violation.to_dict()` (as step bodies hold them)."""
    return violation_row(Violation.from_dict(d), source)


def request_row(rec: RequestRecord) -> tuple[Any, ...]:
    """The `requests` row of a request record."""
    return (
        int(rec.request_id), str(rec.finish_reason), len(rec.prompt_tokens), len(rec.output_tokens),
        dumps(rec.to_dict()),
    )  # fmt: skip

