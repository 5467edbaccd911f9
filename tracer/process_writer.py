"""A trace writer in a child process, so encoding and SQLite never compete with the engine for the GIL.

A `TraceWriter` thread in the engine's process would slow a launch-bound Python loop many times over (bs-64
steps, 5 per iteration: 15x), because its encoding holds the GIL in the loop's way. The engine's side
of this writer only pickles compact raw steps (numpy columns, no per-request objects) and writes them to a
pipe; the child encodes them straight from those columns with a synchronous `TraceWriter` (no thread: one
asynchronous boundary, the pipe) and commits whenever its input is momentarily empty.

The child never outlives its purpose: end of input (the engine closed the pipe or died) or a new parent
(the engine died while another process held the pipe) makes it commit what arrived and exit quietly; when
that input ended with no close frame it records the run's end as "engine_ended" (`meta.end_state`).
The engine's side never waits forever: every status read has a deadline, and a child that died is
reported with its own last words (its stderr) or the signal that killed it.

With `check=True` a second child, `python -m specscope.tracer.live_check TRACE`, follows the trace and
writes the catalogue's verdicts as the steps are committed; `close()` waits until it has checked the last
step and keeps its summary in `check_result`.
"""

from __future__ import annotations

import collections
import itertools
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, Any

import msgspec
import numpy as np

from . import tables
from .errors import TraceError
from .schema import (
    ArraySnapshot,
    CallError,
    RequestRecord,
    RequestState,
    RunInfo,
    Step,
    StreamSpan,
    StreamWait,
    Violation,
    step_from_parts,
)

REQUEST_INT_COLUMNS = ("request_id", "slot", "seq_len_before", "seq_len_after", "num_q_tokens", "accept_length")
REQUEST_LIST_COLUMNS = ("draft_tokens", "accepted_tokens")
STATUS_TIMEOUT_S = 120.0  # a flush or close that takes longer than this is a hung writer, not a slow disk
CHECK_TIMEOUT_S = 900.0  # the checker may lag a fast run; it gets this long after the writer closed
_POLL_S = 0.25
_LEN = struct.Struct("<Q")
_READ_CHUNK = 1 << 20
_BUF_BYTES = 4 << 20


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
    return np.frombuffer(data, dtype, count, base + off).reshape(shape)


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
# engine ~11 µs, those three values ~2 µs; the writer child turns them back into arrays (`_unwire_steps`). A plain
# tuple, not a class: the child runs this module as __main__, where a pickled class of it would not be its own.


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


def _unwire_steps(raws: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Inverse of `wire_steps` (arrays come back read-only, as a step frame's do)."""
    return [_map_arrays(raw, _unwire) for raw in raws]


# A `steps` batch goes as `B` + msgpack of the steps in the recorder's compact form, each array as the list
# [dtype str, shape, bytes] (`_batch_hook`; the child's `_unwire_steps` makes arrays of them again): about half a
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
    wire lists or tuples, see `_unwire_steps`), or the pickled (kind, payload)."""
    head = msg[:1]
    if head == FAST_STEP:
        return "frame", msg
    if head == FAST_STEPS:
        return "steps", _batch_decoder.decode(memoryview(msg)[1:])
    return pickle.loads(msg)


# -- the child ------------------------------------------------------------------------------------------------


class _Input:
    """Length-prefixed frames (`encode_frame`) from a file descriptor; "is a whole one waiting?" for group commits."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        # One buffer, read into in place (os.readv): no chunk objects, no appends, and consumed bytes are dropped
        # by moving the unread tail (a partial frame) to the front only when the room at the end runs out.
        self.buf = bytearray(_BUF_BYTES)
        self.pos = 0  # start of the first unread message
        self.end = 0  # end of the bytes read
        self.eof = False
        self._ppid = os.getppid()

    def ready(self) -> bool:
        """A whole message is buffered."""
        left = self.end - self.pos
        if left < _LEN.size:
            return False
        return left >= _LEN.size + _LEN.unpack_from(self.buf, self.pos)[0]

    def _make_room(self) -> None:
        need = _READ_CHUNK
        left = self.end - self.pos
        if left >= _LEN.size:  # a frame larger than the buffer must fit whole
            need = max(need, _LEN.size + _LEN.unpack_from(self.buf, self.pos)[0] - left)
        if len(self.buf) - self.end >= need:
            return
        if self.pos:
            self.buf[:left] = self.buf[self.pos : self.end]
            self.pos, self.end = 0, left
        if len(self.buf) - self.end < need:
            self.buf.extend(bytes(need - (len(self.buf) - self.end)))

    def fill(self, block: bool) -> None:
        """Read what the pipe holds; with `block`, wait for it (watching for the parent's death)."""
        while not self.eof:
            r, _, _ = select.select([self.fd], [], [], _POLL_S if block else 0)
            if r:
                self._make_room()
                with memoryview(self.buf) as mv:
                    n = os.readv(self.fd, [mv[self.end :]])
                if not n:
                    self.eof = True
                self.end += n
                return
            if not block:
                return
            if os.getppid() != self._ppid:  # re-parented: the engine died while someone still holds the pipe
                self.eof = True

    def take(self) -> bytes:
        """The next whole message (call after `ready()`)."""
        (n,) = _LEN.unpack_from(self.buf, self.pos)
        start = self.pos + _LEN.size
        self.pos = start + n
        # A copy: the buffer is overwritten by later reads, and a step frame's arrays become views of these bytes.
        with memoryview(self.buf) as mv:
            return bytes(mv[start : start + n])

    def next(self) -> bytes:
        """Block for the next message; EOFError at end of input."""
        while not self.ready():
            if self.eof:
                raise EOFError
            self.fill(block=True)
        return self.take()


def _child_main() -> int:
    """The writer process: reads length-prefixed frames on stdin, answers one line per status on stdout."""
    from .writer import TraceWriter

    # A closed stdout (the engine died) must not end us with a BrokenPipeError traceback: we still commit.
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the engine closes us
    inp = _Input(sys.stdin.fileno())
    out = sys.stdout

    def say(line: str) -> None:
        try:
            out.write(" ".join(line.split()) + "\n")
            out.flush()
        except (OSError, ValueError):
            pass  # nobody is listening any more

    try:
        path, run, overwrite = pickle.loads(inp.next())
        writer = TraceWriter(path, RunInfo.from_dict(run), overwrite=overwrite, threaded=False)
    except (TraceError, EOFError) as e:
        say(f"error {e}")
        return 0
    say("ready")
    err = None
    ended = False  # the engine sent its end record
    while True:
        try:
            if not inp.ready():
                inp.fill(block=False)
            if not inp.ready():
                # Nothing waiting: commit what arrived (one transaction for a backlog), then block.
                if err is None:
                    writer.commit()
                msg = inp.next()
            else:
                msg = inp.take()
        except EOFError:
            # The pipe ended without a close frame: the engine process is gone (killed, or it exited without closing
            # the trace). Commit what arrived and say so, unless the engine said how its run ended first.
            if not ended:
                cut = inp.end - inp.pos  # bytes of a message the pipe ended inside of
                writer.set_end("engine_ended", lost_in_flight=None,
                               detail=f"the pipe ended inside a message ({cut} bytes cut off)" if cut else "")
            break
        except TraceError as e:
            err = err or str(e)
            continue
        # A step frame is decoded below, where what it cannot hold is reported like any unstorable step.
        kind, payload = decode_message(msg)
        if kind == "close":
            break
        if kind == "flush":
            if err is None:
                try:
                    writer.commit()
                except TraceError as e:
                    err = str(e)
            say(f"error {err}" if err else "flushed")
            continue
        if err is not None:
            continue  # keep draining, so the engine's writes never block on a full pipe
        try:
            if kind == "frame":
                writer.write_columns(decode_step_frame(payload))
            elif kind == "step":
                writer.write_parts(parts_from_raw(payload))
            elif kind == "steps":
                for raw in _unwire_steps(payload):
                    writer.write_parts(parts_from_raw(raw))
            elif kind == "request":
                writer.write_request(RequestRecord.from_dict(payload))
            elif kind == "meta":
                writer.write_meta(*payload)
            elif kind == "end":
                ended = True
                writer.set_end(**payload)
            elif kind == "violations":
                vs, source = payload
                writer.add_violations([Violation.from_dict(v) for v in vs], source)
        except TraceError as e:
            err = str(e)
        except Exception as e:  # noqa: BLE001 - a step the encoder cannot store is reported to the engine
            err = f"{type(e).__name__}: {e}"
    try:
        writer.close()
    except TraceError as e:
        err = err or str(e)
    say(f"error {err}" if err else "closed")
    return 0


# -- the engine's side ----------------------------------------------------------------------------------------


class _WholeMessages:
    """Holds a Ctrl-C back while the engine's thread writes a message into the pipe, and raises it once the message
    is whole. A KeyboardInterrupt raised mid-write (while the pipe is full, or between a write and counting what it
    wrote) would leave the child a torn message: it would read the close frame as the rest of it, and an interrupted
    run would hang on its close and lose its end record. A second Ctrl-C while one is held raises at once (a writer
    that stopped reading must not make Ctrl-C useless). Installed only over Python's default SIGINT handler, from
    the main thread, while a ProcessTraceWriter is open."""

    def __init__(self) -> None:
        self.depth = 0  # messages being written on the main thread (nested: a write that finishes an earlier one)
        self.held = False  # a Ctrl-C came during one
        self.users = 0  # open writers that installed the handler

    def install(self) -> bool:
        """Take over SIGINT (True) if the default handler has it and this is the main thread."""
        if threading.current_thread() is not threading.main_thread():
            return False
        if self.users == 0 and signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            return False  # someone else's handler: leave it alone
        if self.users == 0:
            signal.signal(signal.SIGINT, self._on_sigint)
        self.users += 1
        return True

    def uninstall(self) -> None:
        """Give SIGINT back to the default handler once the last writer that took it is closed."""
        self.users -= 1
        if self.users == 0 and threading.current_thread() is threading.main_thread() \
                and signal.getsignal(signal.SIGINT) == self._on_sigint:
            signal.signal(signal.SIGINT, signal.default_int_handler)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self.depth and not self.held:
            self.held = True
            return
        self.held = False
        raise KeyboardInterrupt

    def enter(self) -> None:
        """A message write begins (main thread)."""
        self.depth += 1

    def leave(self) -> None:
        """It ended: a Ctrl-C held meanwhile is raised now."""
        self.depth -= 1
        if self.held and not self.depth:
            self.held = False
            raise KeyboardInterrupt


_WHOLE = _WholeMessages()



def _pipe(f: IO[bytes] | None) -> IO[bytes]:
    """A child's stdin or stdout."""
    assert f is not None, "both children are started with stdin and stdout pipes"
    return f


def _grow_pipe(f: IO[bytes]) -> None:
    # A 1 MiB pipe absorbs bursts (graph capture, prefill) so the engine rarely waits for the writer.
    try:
        import fcntl

        fcntl.fcntl(f.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
    except (ImportError, OSError):
        pass


def _tail(f: IO[bytes] | None, limit: int = 400) -> str:
    """The last meaningful line(s) a child wrote to its stderr file, on one line."""
    if f is None:
        return ""
    try:
        f.flush()
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - 8192))
        text = f.read().decode(errors="replace")
    except (OSError, ValueError):
        return ""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return ""
    # A Python traceback ends with "Type: message"; that line is the error's own text.
    return " ".join(lines[-1].split())[:limit]


def _death(proc: subprocess.Popen[bytes], err: IO[bytes] | None, what: str) -> str:
    """Why a child is gone, in its own words where it left any."""
    try:
        rc = proc.wait(timeout=2.0)
    except subprocess.TimeoutExpired:
        rc = None
    said = _tail(err)
    if rc is not None and rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        how = f"{what} was killed by {name}"
    elif rc is None:
        how = f"{what} stopped answering"
    else:
        how = f"{what} exited with status {rc}"
    return f"{how}: {said}" if said else how


class _Lines:
    """Status lines from a child's stdout, read with deadlines (never blocks forever)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.fd = _pipe(proc.stdout).fileno()
        self.buf = b""

    def readline(self, timeout: float) -> str | None:
        """The next line, or None if the child closed its stdout (died); TimeoutError past `timeout`."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            r, _, _ = select.select([self.fd], [], [], min(_POLL_S, left))
            if r:
                chunk = os.read(self.fd, 65536)
                if not chunk:
                    return None
                self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode(errors="replace").strip()


@dataclass(frozen=True)
class CheckResult:
    """What the live checker reported when it finished."""

    checked_through: int  # last step index checked (-1: none)
    num_errors: int
    num_warnings: int


class ProcessTraceWriter:
    """Same role as `TraceWriter` (write_step/write_request/flush/close), running in a child process.

    The child is `python -m specscope.tracer.process_writer` with pipes, not a multiprocessing child, so it
    never re-imports the caller's main module and never inherits a CUDA context. With `check=True` the
    live checker runs beside it (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str], run: RunInfo, *, overwrite: bool = False,
                 check: bool = False, status_timeout: float = STATUS_TIMEOUT_S,
                 check_timeout: float = CHECK_TIMEOUT_S) -> None:  # fmt: skip
        self.path = os.fspath(path)
        self._closed = False
        self._dead: str | None = None
        self._late = 0  # flush answers still owed after a timeout
        self.status_timeout = status_timeout
        self.check_timeout = check_timeout
        self.check_result: CheckResult | None = None
        self._checker: subprocess.Popen[bytes] | None = None
        self._checker_err: IO[bytes] | None = None
        self._err = tempfile.TemporaryFile()
        self._proc = subprocess.Popen([sys.executable, "-m", "specscope.tracer.process_writer"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err)
        self._lines = _Lines(self._proc)
        self._sender: threading.Thread | None = None  # see send_in_background
        self._cv = threading.Condition()
        # Messages (their length prefix and body, or what is left of them) waiting for the sender thread.
        self._queue: collections.deque[tuple[bytes | memoryview, ...]] = collections.deque()
        self._queued = 0  # bytes queued or being written
        self._busy = False  # the sender thread is writing a message it took off the queue
        self.backlogged = 0  # messages (or their rest) that did not fit the pipe and went through the sender thread
        self._fd = -1  # the pipe's descriptor, non-blocking once messages may go through the sender thread
        self._rest: list[bytes | memoryview] = []  # what is left of a message an exception cut short (see _write)
        self._guarded = False  # writes on the main thread hold a Ctrl-C back until the message is whole (once started)
        self._limit = 0
        _grow_pipe(_pipe(self._proc.stdin))
        self._send_obj((self.path, run.to_dict(), overwrite))
        # Starting Python (numpy, zstandard, SQLite) on a loaded machine can take a while: a generous deadline.
        kind, msg = self._status("start", max(self.status_timeout, 60.0))
        if kind != "ready":
            self._stop_child()
            raise TraceError(msg or "the trace writer process failed to start", self.path)
        self._guarded = _WHOLE.install()
        if check:
            self._start_checker()

    # -- the checker ---------------------------------------------------------------------------------

    def _start_checker(self) -> None:
        self._checker_err = tempfile.TemporaryFile()
        # A session of its own: a terminal's Ctrl-C must not reach it before it can ignore SIGINT (the engine
        # ends the run and then waits for its last verdicts); it still exits when our pipe closes.
        self._checker = subprocess.Popen([sys.executable, "-m", "specscope.tracer.live_check", self.path],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._checker_err,
                                         start_new_session=True)

    def _finish_checker(self) -> str | None:
        """Tell the checker the run is over, wait for its last verdicts; an error text if it failed."""
        proc = self._checker
        if proc is None:
            return None
        self._checker = None
        try:
            _pipe(proc.stdin).close()
        except OSError:
            pass
        lines = _Lines(proc)
        last = ""
        try:
            while True:
                line = lines.readline(self.check_timeout)
                if line is None:
                    break
                last = line
        except TimeoutError:
            proc.kill()
            proc.wait()
            return f"the trace checker did not finish within {self.check_timeout:.0f} s after the run"
        rc = proc.wait()
        parts = last.split()
        if rc == 0 and len(parts) == 4 and parts[0] == "checked":
            self.check_result = CheckResult(int(parts[1]), int(parts[2]), int(parts[3]))
            return None
        return _death(proc, self._checker_err, "the trace checker")

    # -- protocol ------------------------------------------------------------------------------------

    def _stop_child(self) -> None:
        try:
            _pipe(self._proc.stdin).close()
        except OSError:
            pass
        try:
            self._proc.wait(timeout=self.status_timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def _status(self, what: str, timeout: float | None = None) -> tuple[str, str]:
        if self._dead:
            return "error", self._dead
        timeout = self.status_timeout if timeout is None else timeout
        try:
            line = self._lines.readline(timeout)
            while line and self._late and line.partition(" ")[0] == "flushed":
                self._late -= 1  # the answer to a flush that timed out earlier
                line = self._lines.readline(timeout)
        except TimeoutError:
            self._late += what == "a flush"
            return "error", (f"the trace writer process (pid {self._proc.pid}) did not answer {what} within "
                             f"{timeout:.0f} s")
        if not line:
            self._dead = _death(self._proc, self._err, "the trace writer process")
            return "error", self._dead
        kind, _, msg = line.partition(" ")
        return kind, msg

    def send_in_background(self, limit_bytes: int = 256 << 20) -> None:
        """From now on the caller (the engine's loop) never waits for the writer process while less than
        `limit_bytes` are queued: a message goes straight into the pipe when the pipe has room for it (one
        non-blocking write on the caller's thread), and what does not fit is queued for a thread that writes it
        as the child reads, so a burst, or a run that makes steps faster than the child stores them, does not slow
        the forwards it records. What is queued reaches the file at flush and close; a SIGKILL of this process
        loses at most what is queued.

        Why the thread takes only what does not fit: waking it and taking the GIL back from it cost the engine
        more than the write itself (an uncontended pipe write of a batch is a few µs)."""
        if self._sender is None:
            self._limit = limit_bytes
            self._fd = _pipe(self._proc.stdin).fileno()
            self._finish_rest()  # nothing of an earlier message may be left unwritten now
            os.set_blocking(self._fd, False)
            self._sender = threading.Thread(target=self._send_loop, name="trace-sender", daemon=True)
            self._sender.start()

    def _send_loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue:
                    self._cv.wait()
                data = self._queue.popleft()
                self._busy = True  # the caller must not write past this message until it is in the pipe
            if not data:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()
                return  # the stop mark close() queues last
            if not self._dead:
                try:
                    for part in data:
                        self._write_all(part)
                except TraceError:
                    pass  # self._dead says why; the engine's next write or flush raises it
            with self._cv:
                self._busy = False
                self._queued -= sum(len(b) for b in data)
                self._cv.notify_all()

    def _write_all(self, data: bytes | memoryview) -> None:
        """Write `data` to the non-blocking pipe, waiting for room as the child reads (the sender thread's half)."""
        view = memoryview(data)
        while view:
            try:
                n = os.write(self._fd, view)
            except BlockingIOError:
                select.select([], [self._fd], [], _POLL_S)
                continue
            except (BrokenPipeError, OSError, ValueError):
                raise self._pipe_broke() from None
            view = view[n:]

    def _wait_sent(self) -> None:
        """Return once every queued message has been written (or the child died)."""
        with self._cv:
            while (self._queued or self._busy) and not self._dead:
                self._cv.wait()

    def _send_obj(self, obj: Any) -> None:
        self._send_data(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))

    def _send_data(self, data: bytes) -> None:
        if self._dead:
            raise TraceError(self._dead, self.path)
        if self._sender is None:
            self._write(data)
            return
        guarded = self._guarded and threading.current_thread() is threading.main_thread()
        if guarded:
            _WHOLE.enter()  # a direct write and its queued rest are one message: no Ctrl-C between them
        try:
            self._send_background(data)
        finally:
            if guarded:
                _WHOLE.leave()

    def _send_background(self, data: bytes) -> None:
        """`_send_data` once the sender thread runs: into the pipe directly, or queued for the thread."""
        head = _LEN.pack(len(data))
        with self._cv:
            if not self._queue and not self._busy:
                # Nothing ahead of this message: straight into the pipe if it has room (no thread involved).
                try:
                    n = os.writev(self._fd, (head, data))
                except BlockingIOError:
                    n = 0
                except (BrokenPipeError, OSError, ValueError):
                    raise self._pipe_broke() from None
                if n == len(head) + len(data):
                    return
                rest: tuple[bytes | memoryview, ...] = (
                    (head[n:], data) if n < len(head) else (memoryview(data)[n - len(head):],))
            else:
                rest = (head, data)
            while self._queued > self._limit and not self._dead:
                self._cv.wait()
            if self._dead:
                raise TraceError(self._dead, self.path)
            size = sum(len(b) for b in rest)
            self.backlogged += 1
            self._queue.append(rest)
            self._queued += size
            self._cv.notify_all()

    def _write(self, data: bytes) -> None:
        # One gathered write of prefix and body (a concatenation would copy every frame: megabytes with recorded
        # attention), on the descriptor itself, counting what was written: with Ctrl-C held back meanwhile
        # (`_WholeMessages`) the message goes whole, and after another exception its rest waits in `_rest` for the
        # next write (the end record, the close frame) to finish first.
        guarded = self._guarded and threading.current_thread() is threading.main_thread()
        if guarded:
            _WHOLE.enter()
        try:
            self._finish_rest()
            self._rest = [_LEN.pack(len(data)), memoryview(data)]
            self._finish_rest()
        finally:
            if guarded:
                _WHOLE.leave()

    def _finish_rest(self) -> None:
        """Write what is left of the message being written (blocking)."""
        rest = self._rest
        while rest:
            try:
                n = os.writev(_pipe(self._proc.stdin).fileno(), rest)
            except (BrokenPipeError, OSError, ValueError):
                rest.clear()
                raise self._pipe_broke() from None
            while rest and n >= len(rest[0]):
                n -= len(rest.pop(0))
            if n:
                rest[0] = memoryview(rest[0])[n:]

    def _pipe_broke(self) -> TraceError:
        """A write to the child failed: remember why it died (its own last words) and return the error to raise."""
        self._dead = _death(self._proc, self._err, "the trace writer process")
        return TraceError(self._dead, self.path)

    def _send(self, kind: str, payload: Any) -> None:
        if self._closed:
            raise TraceError("the trace writer is already closed", self.path)
        self._send_data(encode_frame(kind, payload))

    def write_raw_step(self, raw: dict[str, Any]) -> None:
        """Queue a step in the recorder's compact form (see `parts_from_raw`)."""
        self._send("step", raw)

    def write_raw_steps(self, raws: list[dict[str, Any]]) -> None:
        """Queue steps in the recorder's compact form as one message (a msgpack batch, see `FAST_STEPS`)."""
        self._send("steps", raws)

    def write_step(self, step: Step) -> None:
        """Queue a schema Step."""
        self._send("step", raw_from_step(step))

    def write_request(self, rec: RequestRecord) -> None:
        """Queue a finished request."""
        self._send("request", rec.to_dict())

    def write_meta(self, key: str, value: str) -> None:
        """Queue a `meta` row (see `TraceWriter.write_meta`)."""
        self._send("meta", (str(key), str(value)))

    def set_end(self, state: str, *, lost_in_flight: int | None, detail: str = "",
                error_step: int | None = None) -> None:
        """Say how the run ended (see `TraceWriter.set_end`); the child stores it when it closes the trace. Without
        it a close records "closed", and a pipe that ends with no close frame records "engine_ended"."""
        lost = None if lost_in_flight is None else int(lost_in_flight)
        self._send("end", {"state": str(state), "lost_in_flight": lost, "detail": str(detail),
                           "error_step": None if error_step is None else int(error_step)})

    def flush(self) -> None:
        """Wait until everything sent is committed."""
        self._send("flush", None)
        self._wait_sent()
        kind, msg = self._status("a flush")
        if kind != "flushed":
            raise TraceError(msg or "the trace writer process failed", self.path)

    def close(self) -> None:
        """Commit everything, stop the process (and wait for the checker's last verdicts); raises TraceError if
        writing (or checking) failed. Safe to call again, and after the child died."""
        if self._closed:
            return
        self._closed = True
        kind, msg = "error", self._dead or ""
        if not self._dead:
            try:
                self._send_obj(("close", None))
                self._wait_sent()
                kind, msg = self._status("close")
            except TraceError as e:
                msg = e.problem
        self._stop_sender()
        self._stop_child()
        self._release_sigint()
        check_err = self._finish_checker()
        if kind != "closed":
            raise TraceError(msg if msg.startswith("the trace writer") else f"writing the trace failed ({msg})",
                             self.path)
        if check_err:
            raise TraceError(check_err, self.path)

    def _stop_sender(self) -> None:
        if self._sender is not None:
            with self._cv:
                self._queue.append(())
                self._cv.notify_all()
            self._sender.join(timeout=self.status_timeout)
            self._sender = None

    def _release_sigint(self) -> None:
        if self._guarded:
            self._guarded = False
            _WHOLE.uninstall()

    def abort(self) -> None:
        """Stop both children without waiting for a clean close (what arrived so far is committed)."""
        self._closed = True
        self._release_sigint()
        for p in (self._proc, self._checker):
            if p is not None and p.poll() is None:
                try:
                    _pipe(p.stdin).close()
                except OSError:
                    pass


if __name__ == "__main__":
    sys.exit(_child_main())
