"""What travels on the pipe from the engine to the writer child: framing, and the encodings of its messages.

A message is a u64 length (`LENGTH`) and a payload. A payload is one of three encodings, told apart by its first
byte (`decode_message`):

- a **step frame** (`S`, `encode_step_frame`): one step as a msgpack head and its numbers as raw aligned buffers,
  which the child views without copying;
- a **batch frame** (`B`, `FAST_STEPS`): a resolving pass's steps as msgpack, each array as [dtype, shape, bytes];
- a **pickle** of (kind, payload): the start message, requests, meta rows, end records, status requests, and any
  step or batch the two frames cannot carry (a non-numeric array, an int beyond int64, a ragged column), which
  meets the same checks in the child.

Steps travel in the recorder's compact form (`parts_from_raw` documents its keys). Frames are a private protocol
between one version's parent and child, never stored.
"""

from __future__ import annotations

import itertools
import pickle
import struct
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import numpy as np

from . import tables
from .schema import ArraySnapshot, CallError, RequestState, Step, StreamSpan, StreamWait, step_from_parts

REQUEST_INT_COLUMNS = ("request_id", "slot", "seq_len_before", "seq_len_after", "num_q_tokens", "accept_length")
REQUEST_LIST_COLUMNS = ("draft_tokens", "accepted_tokens")
LENGTH = struct.Struct("<Q")  # the length prefix of every message on the pipe


# -- the recorder's compact step form ---------------------------------------------------------------------


def _waits(raw: dict[str, Any]) -> list[tuple[str, str, str]]:
    out = []
    for w in raw.get("waits") or ():
        if isinstance(w, dict):
            out.append((str(w["stream"]), str(w["on_stream"]), str(w["on_span"])))
        else:
            s, on_stream, on_span = w
            out.append((str(s), str(on_stream), str(on_span)))
    return out


def _errors(raw: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for e in raw.get("errors") or ():
        out.append(CallError.from_dict(e).to_dict() if isinstance(e, dict) else CallError(*e).to_dict())
    return out


def _arrays(raw: dict[str, Any]) -> list[tuple[str, str, tuple[int, ...], int, np.ndarray]]:
    out = [(a.name, a.dtype, tuple(a.shape), a.data_ptr, a.values) for pack in raw.get("packs", ())
           for a in unpack(*pack)]  # fmt: skip
    out += [(str(n), str(dt), tuple(sh), int(ptr), v) for n, dt, sh, ptr, v in raw.get("arrays", ())]
    return out


def parts_from_raw(raw: dict[str, Any]) -> tables.StepParts:
    """The columns of a step in the recorder's compact form, without building per-request objects.

    Keys: `header` (Step.header_dict()), `requests` (columns: REQUEST_INT_COLUMNS as int lists or arrays,
    optional `draft_tokens` / `accepted_tokens` lists of lists), `packs` and `arrays` (snapshots),
    `spans` ((stream, name, start_ns, end_ns)), `violations` (Violation.to_dict()), and the optional
    `waits` ((stream, on_stream, on_span) or StreamWait dicts), `errors` ((call, error_type, message, fatal)
    or CallError dicts) and `faults_fired` (fault names)."""
    cols = raw.get("requests") or {}
    n = len(cols["request_id"]) if cols else 0
    ints: dict[str, Sequence[int]] = {}
    for c in REQUEST_INT_COLUMNS:
        v = cols.get(c)
        ints[c] = [0] * n if v is None else (v.tolist() if isinstance(v, np.ndarray) else list(v))
    tup: dict[str, Sequence[Sequence[int]]] = {
        c: list(cols[c]) if cols.get(c) is not None and len(cols[c]) else [()] * n for c in REQUEST_LIST_COLUMNS
    }
    return tables.StepParts(
        header=raw["header"], num_requests=n, int_cols=ints, tuple_cols=tup, arrays=_arrays(raw),
        spans=[(str(s[0]), str(s[1]), int(s[2]), int(s[3])) for s in raw.get("spans", ())],
        violations=list(raw.get("violations") or ()), waits=_waits(raw), errors=_errors(raw),
        faults_fired=[str(f) for f in raw.get("faults_fired") or ()],
    )  # fmt: skip


def step_from_raw(raw: dict[str, Any]) -> Step:
    """Build a schema Step from the compact form the recorder sends."""
    p = parts_from_raw(raw)
    ic, tc = p.int_cols, p.tuple_cols
    reqs = [RequestState(request_id=int(ic["request_id"][i]), slot=int(ic["slot"][i]),
                         seq_len_before=int(ic["seq_len_before"][i]), seq_len_after=int(ic["seq_len_after"][i]),
                         num_q_tokens=int(ic["num_q_tokens"][i]),
                         draft_tokens=tuple(int(t) for t in tc["draft_tokens"][i]),
                         accepted_tokens=tuple(int(t) for t in tc["accepted_tokens"][i]),
                         accept_length=int(ic["accept_length"][i])).to_dict()
            for i in range(p.num_requests)]  # fmt: skip
    arrays = [ArraySnapshot(name, dtype, tuple(shape), int(ptr), values)
              for name, dtype, shape, ptr, values in p.arrays]
    spans = [StreamSpan(*s).to_dict() for s in p.spans]
    waits = [StreamWait(*w).to_dict() for w in p.waits]
    return step_from_parts(p.header, reqs, arrays, spans, p.violations, waits, p.errors, p.faults_fired)


def unpack(flat: np.ndarray, layout: list[tuple[str, str, tuple[int, ...], int]],
           crop_cols: dict[str, int]) -> list[ArraySnapshot]:
    """Split a packed int64 snapshot back into its arrays (2-D tables cropped to their live columns)."""
    out, off = [], 0
    for name, dtype, shape, ptr in layout:
        n = int(np.prod(shape)) if shape else 1
        v = flat[off:off + n].astype(dtype).reshape(shape)
        off += n
        cols = crop_cols.get(name)
        if cols is not None and v.ndim == 2:
            v = v[:, :cols]
        out.append(ArraySnapshot(name, dtype, tuple(shape), int(ptr), np.ascontiguousarray(v)))
    return out


def raw_from_step(step: Step) -> dict[str, Any]:
    """The compact form of a schema Step (inverse of `step_from_raw`)."""
    # Lists, as the recorder sends them (numpy arrays would cost an unpickle each in the child).
    cols: dict[str, Any] = {c: [getattr(r, c) for r in step.requests] for c in REQUEST_INT_COLUMNS}
    for c in REQUEST_LIST_COLUMNS:
        cols[c] = [list(getattr(r, c)) for r in step.requests]
    return dict(header=step.header_dict(), requests=cols,
                arrays=[(a.name, a.dtype, a.shape, a.data_ptr, a.values) for a in step.arrays],
                spans=[(s.stream, s.name, s.start_ns, s.end_ns) for s in step.spans],
                violations=[v.to_dict() for v in step.violations],
                waits=[(w.stream, w.on_stream, w.on_span) for w in step.waits],
                errors=[e.to_dict() for e in step.errors], faults_fired=list(step.faults_fired))


# -- the pipe's step frames ---------------------------------------------------------------------------------
#
# A step crosses the pipe as one binary frame, not a pickle: `S`, u32 length of a msgpack head, the head, then
# the step's numbers as raw little-endian buffers, each at an 8-byte aligned offset of the frame. The head holds
# the header, spans, waits, errors, faults, violations and, per buffer, where it lies and what it is. The child
# turns the request columns straight into the [fields, n] table the body stores and the arrays into zero-copy
# numpy views, so no per-request Python object is ever made there (unpickling lists of ints and numpy arrays
# would be the child's largest single cost). Anything the frame cannot carry as it is (a non-numeric array, an int
# beyond int64, a ragged column) goes as a pickle and meets the same checks in the child.

FAST_STEP = b"S"
_HEAD_LEN = struct.Struct("<I")
_ALIGN = 8
_NUMERIC_KINDS = "biufc"
_head_encoder = msgspec.msgpack.Encoder(enc_hook=lambda o: o.item() if isinstance(o, np.generic) else _no_hook(o))
_head_decoder = msgspec.msgpack.Decoder()


def _no_hook(o: Any) -> Any:
    raise TypeError(f"{type(o).__name__} does not fit a step frame")


class _Frame:
    """Collects the raw buffers of one frame and their offsets."""

    def __init__(self) -> None:
        self.bufs: list[Any] = []
        self.size = 0

    def add(self, a: np.ndarray) -> list[Any]:
        if a.dtype.kind not in _NUMERIC_KINDS or a.dtype.hasobject:
            raise TypeError("not a numeric array")
        if not a.flags.c_contiguous:
            a = np.ascontiguousarray(a) if a.ndim else a.copy()
        pad = -self.size % _ALIGN
        if pad:
            self.bufs.append(b"\0" * pad)
            self.size += pad
        off = self.size
        self.bufs.append(a if a.ndim else a.reshape(1))
        self.size += a.nbytes
        return [off, a.dtype.str, list(a.shape)]


def _int_columns(cols: dict[str, Any], names: tuple[str, ...], n: int) -> np.ndarray:
    if not n:
        return np.zeros((len(names), 0), np.int64)
    rows = [cols.get(c) for c in names]
    if any(v is None for v in rows):
        rows = [np.zeros(n, np.int64) if v is None else v for v in rows]
    # One conversion for all columns (half the cost of one per column); ragged columns raise ValueError, ints
    # beyond int64 give an object array, floats a float array: all of them go as pickles.
    a = np.array(rows)
    if a.shape != (len(names), n) or a.dtype.kind not in "iub" or a.dtype == np.uint64:
        raise TypeError("request columns are not ints of one length")
    return a


def encode_step_frame(raw: dict[str, Any]) -> list[Any]:
    """The pipe frame of a step in the recorder's compact form, as buffers to write back to back;
    TypeError/ValueError/OverflowError when it needs the pickle form (see above)."""
    cols = raw.get("requests") or {}
    n = len(cols["request_id"]) if cols else 0
    fr = _Frame()
    ints = _int_columns(cols, REQUEST_INT_COLUMNS, n)
    lens, flats = [], []
    for c in REQUEST_LIST_COLUMNS:
        v = cols.get(c)
        if v is None or not len(v):
            lens.append([0] * n)
            continue
        if len(v) != n:
            raise ValueError(f"request column {c} has {len(v)} values for {n} requests")
        ln = [len(t) for t in v]
        lens.append(ln)
        flats.append(np.fromiter(itertools.chain.from_iterable(v), np.int64, count=sum(ln)))
    table = np.empty((len(REQUEST_INT_COLUMNS) + len(REQUEST_LIST_COLUMNS), n), np.int64)
    table[: len(REQUEST_INT_COLUMNS)] = ints
    table[len(REQUEST_INT_COLUMNS) :] = lens
    values = np.concatenate(flats) if flats else np.zeros(0, np.int64)
    arrays = [[str(nm), str(dt), [int(x) for x in sh], int(ptr), fr.add(np.asarray(v))]
              for nm, dt, sh, ptr, v in raw.get("arrays", ())]  # fmt: skip
    packs = [[fr.add(np.asarray(flat, np.int64)), [[str(a), str(b), [int(x) for x in c], int(d)] for a, b, c, d in lay],
              {str(k): int(v) for k, v in crop.items()}] for flat, lay, crop in raw.get("packs", ())]  # fmt: skip
    head = [raw["header"], fr.add(table), fr.add(values), packs, arrays, list(raw.get("spans", ())),
            list(raw.get("violations") or ()), list(raw.get("waits") or ()), list(raw.get("errors") or ()),
            [str(f) for f in raw.get("faults_fired") or ()]]  # fmt: skip
    hb = _head_encoder.encode(head)
    start = len(FAST_STEP) + _HEAD_LEN.size + len(hb)
    pad = -start % _ALIGN  # buffer offsets are relative to the aligned start of the binary section
    return [FAST_STEP + _HEAD_LEN.pack(len(hb)) + hb + b"\0" * pad, *fr.bufs]


_DTYPES: dict[str, np.dtype] = {}


def _view(data: memoryview, base: int, spec: list[Any]) -> np.ndarray:
    off, dt, shape = spec
    dtype = _DTYPES.get(dt)
    if dtype is None:
        dtype = np.dtype(dt)
        if dtype.kind not in _NUMERIC_KINDS:
            raise ValueError(f"step frame array of dtype {dt}")
        if len(_DTYPES) < 256:
            _DTYPES[dt] = dtype
    if len(shape) == 1:
        return np.frombuffer(data, dtype, shape[0], base + off)
    count = 1
    for x in shape:
        count *= x
    arr: np.ndarray = np.frombuffer(data, dtype, count, base + off).reshape(shape)  # wire shape: reshape(Any) is Any
    return arr


def decode_step_frame(data: bytes) -> tables.StepColumns:
    """The numpy columns of a frame made by `encode_step_frame` (arrays are read-only views of `data`)."""
    (hlen,) = _HEAD_LEN.unpack_from(data, len(FAST_STEP))
    hstart = len(FAST_STEP) + _HEAD_LEN.size
    base = hstart + hlen
    base += -base % _ALIGN
    header, table, values, packs, arrays, spans, violations, waits, errors, faults = _head_decoder.decode(
        memoryview(data)[hstart : hstart + hlen])
    mv = memoryview(data)
    raw = {"packs": [(_view(mv, base, flat), layout, crop) for flat, layout, crop in packs],
           "arrays": [(nm, dt, sh, ptr, _view(mv, base, v)) for nm, dt, sh, ptr, v in arrays],
           "waits": waits, "errors": errors}
    return tables.StepColumns(
        header=header, table=tables.narrow_ints(_view(mv, base, table)),
        values=tables.narrow_ints(_view(mv, base, values)), arrays=_arrays(raw),
        spans=[(str(a), str(b), int(c), int(d)) for a, b, c, d in spans],
        violations=violations, waits=_waits(raw), errors=_errors(raw), faults_fired=faults,
    )  # fmt: skip


# In a `steps` batch an array travels as the plain tuple (dtype str, shape, bytes): pickling a numpy array costs the
# engine ~11 µs, those three values ~2 µs; the writer child turns them back into arrays (`unwire_steps`). A plain
# tuple, not a class: a batch frame carries the same three values as a msgpack list, and one `_unwire` reads both.


def _wire(a: Any) -> Any:
    if isinstance(a, np.ndarray) and a.dtype.kind in _NUMERIC_KINDS and not a.dtype.hasobject:
        return (a.dtype.str, a.shape, a.tobytes())
    return a


def _unwire(a: Any) -> Any:
    if (type(a) is tuple or type(a) is list) and len(a) == 3 and isinstance(a[2], bytes):
        dt, shape, data = a
        return np.frombuffer(data, dt).reshape(shape)
    return a


def _map_arrays(raw: dict[str, Any], f: Callable[[Any], Any]) -> dict[str, Any]:
    """`raw` (a copy) with `f` applied to the values of its packs and arrays."""
    out = dict(raw)
    if raw.get("packs"):
        out["packs"] = [(f(flat), lay, crop) for flat, lay, crop in raw["packs"]]
    if raw.get("arrays"):
        out["arrays"] = [(n, dt, sh, ptr, f(v)) for n, dt, sh, ptr, v in raw["arrays"]]
    return out


def wire_steps(raws: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Steps in the recorder's compact form with their arrays as (dtype, shape, bytes) tuples (cheap to pickle)."""
    return [_map_arrays(raw, _wire) for raw in raws]


def unwire_steps(raws: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Inverse of `wire_steps` (arrays come back read-only, as a step frame's do)."""
    return [_map_arrays(raw, _unwire) for raw in raws]


# A `steps` batch goes as `B` + msgpack of the steps in the recorder's compact form, each array as the list
# [dtype str, shape, bytes] (`_batch_hook`; the child's `unwire_steps` makes arrays of them again): about half a
# pickle's cost to the engine (a pickle's per-object work is most of encoding a batch). A batch msgpack cannot
# carry (an int beyond 64 bits, a non-numeric array) goes as a pickle and meets the same checks in the child.
FAST_STEPS = b"B"


def _batch_hook(o: Any) -> Any:
    if isinstance(o, np.ndarray) and o.dtype.kind in _NUMERIC_KINDS and not o.dtype.hasobject:
        return (o.dtype.str, o.shape, o.tobytes())
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(f"{type(o).__name__} does not fit a msgpack batch")


_batch_encoder = msgspec.msgpack.Encoder(enc_hook=_batch_hook)
_batch_decoder = msgspec.msgpack.Decoder()


def encode_frame(kind: str, payload: Any) -> bytes:
    """One message for the writer child, without its length prefix: a step frame or a msgpack batch where it fits,
    else a pickle (a batch's arrays as bytes: `wire_steps`)."""
    if kind == "step":
        try:
            return b"".join(encode_step_frame(payload))
        except (TypeError, ValueError, OverflowError, KeyError, AttributeError, msgspec.EncodeError):
            pass  # the pickle below carries it; the child reports what is wrong with it, if anything
    elif kind == "steps":
        try:
            return FAST_STEPS + _batch_encoder.encode(payload)
        except (TypeError, ValueError, OverflowError, msgspec.EncodeError):
            payload = wire_steps(payload)
    return pickle.dumps((kind, payload), protocol=pickle.HIGHEST_PROTOCOL)


def decode_message(msg: bytes) -> tuple[str, Any]:
    """The child's side of `encode_frame`: ("frame", the step frame), ("steps", compact steps whose arrays are
    wire lists or tuples, see `unwire_steps`), or the pickled (kind, payload)."""
    head = msg[:1]
    if head == FAST_STEP:
        return "frame", msg
    if head == FAST_STEPS:
        return "steps", _batch_decoder.decode(memoryview(msg)[1:])
    message: tuple[str, Any] = pickle.loads(msg)  # what encode_frame pickled: (kind, payload)
    return message


def encode_start(path: str, run: dict[str, Any], overwrite: bool) -> bytes:
    """The first message of a pipe: which trace the child creates, for which run, and whether it may replace a file."""
    return pickle.dumps((path, run, overwrite), protocol=pickle.HIGHEST_PROTOCOL)


def decode_start(msg: bytes) -> tuple[str, dict[str, Any], bool]:
    """The child's side of `encode_start`."""
    path, run, overwrite = pickle.loads(msg)
    return path, run, overwrite
