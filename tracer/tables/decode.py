"""Decoding a step: its `steps` row, its body container and its `step_requests` data."""

from __future__ import annotations

import dataclasses
import json
import struct
from typing import Any

import numpy as np

from .. import codec
from ..schema import ArraySnapshot, RequestState, Step, step_from_parts
from .compression import DictLoader, decompress_body, decompress_request_data
from .layout import BODY_MAGIC, BODY_VERSIONS, HEADER_COLUMNS, REQUEST_FIELDS, STEP_REQUEST_FIELDS


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
    arr = codec.decode(decompress_request_data(data))
    if arr.shape != (len(STEP_REQUEST_FIELDS), n):
        raise ValueError("step_requests data does not match its request count")
    return arr
