"""What travels on the pipe from the engine to the writer child: one framing, one typed message union.

Every message is a u64 length (`LENGTH`) and the msgpack encoding of one `Message` (msgspec Structs, tagged by their
class name): `Start` opens the pipe, `Steps` carries a resolving pass's steps as one `step_batch.StepBatch` (numbers
as raw bytes with dtype and shape, which the child reads with `np.frombuffer`), `Request`, `Meta` and `End` carry the
rest of what `TraceWriter` stores, `Refused` stands where a step that cannot travel would have been (the child
reports it as it would the step), and `Flush` / `Close` ask for a status line. Messages are a private protocol
between one version's parent and child, never stored.

The recorder's compact step form (`parts_from_raw`, `step_from_raw`, `raw_from_step`) lives in `step_batch` and is
importable from here too.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

from . import codec, tables
from .errors import TraceError
from .step_batch import LayoutTable, StepBatch, StepBatchBuilder, parts_from_raw, raw_from_step, step_from_raw

__all__ = ["LENGTH", "Close", "End", "Flush", "Message", "Meta", "Refused", "Request", "Start", "Steps", "decode",
           "encode", "encode_steps", "parts_from_raw", "raw_from_step", "step_from_raw"]

LENGTH = struct.Struct("<Q")  # the length prefix of every message on the pipe


class Start(msgspec.Struct, tag=True, array_like=True):
    """The first message: which trace the child creates, for which run, and whether it may replace a file."""

    path: str
    run: dict[str, Any]  # RunInfo.to_dict()
    overwrite: bool


class Steps(msgspec.Struct, tag=True, array_like=True):
    """A resolving pass's steps."""

    batch: StepBatch


class Request(msgspec.Struct, tag=True, array_like=True):
    """A finished request (RequestRecord.to_dict())."""

    record: dict[str, Any]


class Meta(msgspec.Struct, tag=True, array_like=True):
    """A `meta` row."""

    key: str
    value: str


class End(msgspec.Struct, tag=True, array_like=True):
    """How the run ended (`TraceWriter.set_end`)."""

    state: str
    lost_in_flight: int | None
    detail: str
    error_step: int | None


class Refused(msgspec.Struct, tag=True, array_like=True):
    """A step the wire cannot carry, and why in the words the writer would use: the child fails with it."""

    reason: str


class Flush(msgspec.Struct, tag=True, array_like=True):
    """Commit, and answer `flushed` (or the error)."""


class Close(msgspec.Struct, tag=True, array_like=True):
    """Commit, close the trace and answer `closed` (or the error)."""


Message = Start | Steps | Request | Meta | End | Refused | Flush | Close


def _hook(o: Any) -> Any:
    # Values the engine hands over as numpy scalars or arrays (a scalar in a header, an int array as a column).
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    # Subclasses of plain types (torch.__version__ is a str subclass in the run's info): their plain values.
    for plain in (str, int, float):
        if isinstance(o, plain):
            return plain(o)
    if isinstance(o, (list, tuple)):
        return list(o)
    if isinstance(o, dict):
        return dict(o)
    raise TypeError(f"{type(o).__name__} cannot travel to the trace writer")


_encoder = msgspec.msgpack.Encoder(enc_hook=_hook)
_decoder = msgspec.msgpack.Decoder(Message)


def encode(msg: Message) -> bytes:
    """The body of one message (without its length prefix)."""
    return _encoder.encode(msg)


def decode(data: bytes | memoryview) -> Message:
    """The child's side of `encode`; msgspec.DecodeError for a body that is not a message."""
    return _decoder.decode(data)


def encode_steps(raws: Sequence[dict[str, Any]], layouts: LayoutTable | None = None) -> list[bytes]:
    """Steps in the recorder's compact form as message bodies: one `Steps`, or where a step cannot travel, the steps
    before it and a `Refused` that says why (what comes after it is dropped: the receiver stops at the refusal).
    `layouts`: what this sender sent before (see `step_batch.LayoutTable`); the bodies must be sent, in order."""
    table = LayoutTable() if layouts is None else layouts
    b = StepBatchBuilder(table)
    for raw in raws:
        b.add_raw(raw)
    try:
        out = [_encoder.encode(Steps(b.finish()))]
    except Exception:  # noqa: BLE001 - which step, and why, is found below
        pass
    else:
        b.sent()
        return out
    b = StepBatchBuilder(table)
    for raw in raws:
        probe = StepBatchBuilder(table)
        probe.add_raw(raw)
        try:
            _encoder.encode(Steps(probe.finish()))
        except Exception as e:  # noqa: BLE001 - any step the wire refuses is reported by the receiver
            out = [_encoder.encode(Steps(b.finish()))] if len(b) else []
            b.sent()
            return [*out, _encoder.encode(Refused(_why_unstorable(raw, e)))]
        b.add_raw(raw)
    out = [_encoder.encode(Steps(b.finish()))]
    b.sent()
    return out


def _why_unstorable(raw: dict[str, Any], e: Exception) -> str:
    """What the writer would say about a step the wire refused (its own checks, run here), else the wire's error."""
    try:
        tables.encode_columns(tables.columns_from_parts(parts_from_raw(raw)),
                              lambda name, v: b"".join(codec.encode_parts_raw(v))[:0].hex())
    except TraceError as te:
        return str(te)
    except Exception as ce:  # noqa: BLE001 - reported in the child's words
        return f"{type(ce).__name__}: {ce}"
    return f"{type(e).__name__}: {e}"
