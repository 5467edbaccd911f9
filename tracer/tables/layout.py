"""What is where in a trace file: its tables (DDL), their columns and statements, the body container's fields,
and the rows of the tables a step body does not feed (violations, requests, meta)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from ..schema import MAGIC, SCHEMA_VERSION, RequestRecord, RequestState, StreamSpan, StreamWait, Violation
from .json_text import dumps

SQLITE_HEADER = b"SQLite format 3\x00"

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
# The body container (`step_bodies.body` before compression): each record list is stored as its field names plus
# rows; arrays of at most INLINE_MAX_BYTES sit in its binary section.
ARRAY_FIELDS = ("name", "dtype", "shape", "data_ptr", "ref")
SPAN_FIELDS = tuple(f.name for f in dataclasses.fields(StreamSpan))
WAIT_FIELDS = tuple(f.name for f in dataclasses.fields(StreamWait))
INLINE_MAX_BYTES = 4096  # larger arrays (page tables) go to the content-addressed blobs table
BODY_MAGIC = b"SB"
BODY_VERSION = 2  # written; 1 (schema 1, zlib) is still read
BODY_VERSIONS = (1, 2)


def meta_rows() -> list[tuple[str, str]]:
    """The `meta` rows a new trace starts with."""
    return [("magic", MAGIC), ("schema_version", SCHEMA_VERSION)]


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
