"""A trace writer in a child process, so encoding and SQLite never compete with the engine for the GIL.

Measured here: a `TraceWriter` thread in the engine's process made a launch-bound Python loop 15x slower
(bs-64 steps, 5 per iteration), because its encoding holds the GIL in the loop's way. The engine's side
of this writer only pickles compact raw steps (numpy columns, no per-request objects) and writes them to a
pipe; the child turns them into schema records and runs an ordinary `TraceWriter`.
"""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
from typing import Any

import numpy as np

from .errors import TraceError
from .schema import ArraySnapshot, RequestRecord, RequestState, RunInfo, Step, StreamSpan, step_from_parts

REQUEST_INT_COLUMNS = ("request_id", "slot", "seq_len_before", "seq_len_after", "num_q_tokens", "accept_length")
REQUEST_LIST_COLUMNS = ("draft_tokens", "accepted_tokens")


def step_from_raw(raw: dict[str, Any]) -> Step:
    """Build a schema Step from the compact form the recorder sends."""
    cols = raw["requests"] or {}
    n = len(cols["request_id"]) if cols else 0
    reqs = [RequestState(*(int(cols[c][i]) for c in REQUEST_INT_COLUMNS[:5]),
                         draft_tokens=tuple(cols["draft_tokens"][i]) if cols.get("draft_tokens") else (),
                         accepted_tokens=tuple(cols["accepted_tokens"][i]) if cols.get("accepted_tokens") else (),
                         accept_length=int(cols["accept_length"][i]) if "accept_length" in cols else 0).to_dict()
            for i in range(n)]
    arrays = [a for pack in raw.get("packs", ()) for a in unpack(*pack)]
    arrays += [ArraySnapshot(name, dtype, tuple(shape), int(ptr), values) for name, dtype, shape, ptr, values
               in raw["arrays"]]
    spans = [StreamSpan(*s).to_dict() for s in raw["spans"]]
    return step_from_parts(raw["header"], reqs, arrays, spans, raw["violations"])


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


_LEN = struct.Struct("<Q")


def _read_msg(stream: Any) -> Any:
    head = stream.read(_LEN.size)
    if len(head) < _LEN.size:
        raise EOFError
    (n,) = _LEN.unpack(head)
    data = stream.read(n)
    if len(data) < n:
        raise EOFError
    return pickle.loads(data)


def _child_main() -> None:
    """The writer process: reads length-prefixed pickles on stdin, answers one line per status on stdout."""
    from .writer import TraceWriter

    inp, out = sys.stdin.buffer, sys.stdout

    def say(line: str) -> None:
        out.write(" ".join(line.split()) + "\n")
        out.flush()

    try:
        path, run, overwrite = _read_msg(inp)
        writer = TraceWriter(path, RunInfo.from_dict(run), overwrite=overwrite)
    except (TraceError, EOFError) as e:
        say(f"error {e}")
        return
    say("ready")
    err = None
    try:
        while True:
            kind, payload = _read_msg(inp)
            if kind == "step":
                writer.write_step(step_from_raw(payload))
            elif kind == "request":
                writer.write_request(RequestRecord.from_dict(payload))
            elif kind == "flush":
                writer.flush()
                say("flushed")
            elif kind == "close":
                break
    except EOFError:
        pass  # the engine died: commit what arrived
    except Exception as e:  # noqa: BLE001 - reported to the engine at close
        err = f"{type(e).__name__}: {e}"
    try:
        writer.close()
    except TraceError as e:
        err = err or str(e)
    say(f"error {err}" if err else "closed")


def _grow_pipe(f: Any) -> None:
    # A 1 MiB pipe absorbs bursts (graph capture, prefill) so the engine rarely waits for the writer.
    try:
        import fcntl

        fcntl.fcntl(f.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
    except (ImportError, OSError):
        pass


class ProcessTraceWriter:
    """Same role as `TraceWriter` (write_step/write_request/flush/close), running in a child process.

    The child is `python -m specscope.tracer.process_writer` with pipes, not a multiprocessing child, so it
    never re-imports the caller's main module and never inherits a CUDA context."""

    def __init__(self, path: str | os.PathLike[str], run: RunInfo, *, overwrite: bool = False) -> None:
        self.path = os.fspath(path)
        self._closed = False
        self._proc = subprocess.Popen([sys.executable, "-m", "specscope.tracer.process_writer"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=False)
        _grow_pipe(self._proc.stdin)
        self._send_obj((self.path, run.to_dict(), overwrite))
        kind, msg = self._status()
        if kind != "ready":
            self._proc.wait()
            raise TraceError(msg or "the trace writer process failed to start", self.path)

    def _status(self) -> tuple[str, str]:
        line = self._proc.stdout.readline().decode(errors="replace").strip()
        if not line:
            return "error", "the trace writer process died"
        kind, _, msg = line.partition(" ")
        return kind, msg

    def _send_obj(self, obj: Any) -> None:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            self._proc.stdin.write(_LEN.pack(len(data)) + data)
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise TraceError("the trace writer process died", self.path) from None

    def _send(self, kind: str, payload: Any) -> None:
        if self._closed:
            raise TraceError("the trace writer is already closed", self.path)
        self._send_obj((kind, payload))

    def write_raw_step(self, raw: dict[str, Any]) -> None:
        """Queue a step in the recorder's compact form (see `step_from_raw`)."""
        self._send("step", raw)

    def write_step(self, step: Step) -> None:
        """Queue a schema Step."""
        self._send("step", raw_from_step(step))

    def write_request(self, rec: RequestRecord) -> None:
        """Queue a finished request."""
        self._send("request", rec.to_dict())

    def flush(self) -> None:
        """Wait until everything sent is committed."""
        self._send("flush", None)
        kind, msg = self._status()
        if kind != "flushed":
            raise TraceError(msg or "the trace writer process failed", self.path)

    def close(self) -> None:
        """Commit everything and stop the process; raises TraceError if writing failed."""
        if self._closed:
            return
        self._send("close", None)
        self._closed = True
        kind, msg = self._status()
        self._proc.stdin.close()
        self._proc.wait(timeout=120)
        if kind != "closed":
            raise TraceError(f"writing the trace failed ({msg})", self.path)


def raw_from_step(step: Step) -> dict[str, Any]:
    """The compact form of a schema Step (inverse of `step_from_raw`)."""
    cols: dict[str, Any] = {c: np.array([getattr(r, c) for r in step.requests], dtype=np.int64)
                            for c in REQUEST_INT_COLUMNS}
    for c in REQUEST_LIST_COLUMNS:
        cols[c] = [list(getattr(r, c)) for r in step.requests]
    return dict(header=step.header_dict(), requests=cols,
                arrays=[(a.name, a.dtype, a.shape, a.data_ptr, a.values) for a in step.arrays],
                spans=[(s.stream, s.name, s.start_ns, s.end_ns) for s in step.spans],
                violations=[v.to_dict() for v in step.violations])


if __name__ == "__main__":
    _child_main()
