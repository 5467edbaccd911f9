"""The trace writer's child process: `python -m specscope.tracer.process_writer_child`, started by
`ProcessTraceWriter` (`process_writer.py`).

It reads length-prefixed messages (`pipe_format.Message`) on stdin, decodes them and writes them with a synchronous
`TraceWriter` (no thread: one asynchronous boundary, the pipe), commits whenever its input is momentarily empty (one
transaction for a backlog), and answers one line per status request on stdout: `ready`, `flushed`, `closed` or
`error TEXT`.

It never outlives its purpose: end of input (the engine closed the pipe or died) or a new parent (the engine died
while another process held the pipe) makes it commit what arrived and exit quietly; when that input ended with no
close message it records the run's end as "engine_ended" (`meta.end_state`).
"""

from __future__ import annotations

import os
import select
import signal
import sys
from typing import Any

import msgspec

from .errors import TraceError
from .pipe_format import LENGTH, Close, End, Flush, Meta, Refused, Request, Start, Steps, decode
from .schema import RequestRecord, RunInfo
from .step_batch import batch_columns
from .writer import TraceWriter

_POLL_S = 0.25  # how often a blocked read looks for a new parent
_READ_CHUNK = 1 << 20
_BUF_BYTES = 4 << 20


class _Input:
    """Length-prefixed messages (`pipe_format`) from a file descriptor; "is a whole one waiting?" for group commits."""

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
        if left < LENGTH.size:
            return False
        length: int = LENGTH.unpack_from(self.buf, self.pos)[0]
        return left >= LENGTH.size + length

    def _make_room(self) -> None:
        need = _READ_CHUNK
        left = self.end - self.pos
        if left >= LENGTH.size:  # a frame larger than the buffer must fit whole
            need = max(need, LENGTH.size + LENGTH.unpack_from(self.buf, self.pos)[0] - left)
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
        (n,) = LENGTH.unpack_from(self.buf, self.pos)
        start = self.pos + LENGTH.size
        self.pos = start + n
        # A copy: the buffer is overwritten by later reads.
        with memoryview(self.buf) as mv:
            return bytes(mv[start : start + n])

    def next(self) -> bytes:
        """Block for the next message; EOFError at end of input."""
        while not self.ready():
            if self.eof:
                raise EOFError
            self.fill(block=True)
        return self.take()


def main() -> int:
    """The writer process: reads length-prefixed messages on stdin, answers one line per status on stdout."""
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
        start = decode(inp.next())
        if not isinstance(start, Start):
            raise TraceError(f"the trace writer's first message is a {type(start).__name__}, not a Start")
        writer = TraceWriter(start.path, RunInfo.from_dict(start.run), overwrite=start.overwrite, threaded=False)
    except (TraceError, EOFError, msgspec.DecodeError) as e:
        say(f"error {e}")
        return 0
    say("ready")
    err = None
    layouts: list[Any] = []  # the snapshot layouts the engine sent, by number (see step_batch.LayoutTable)
    ended = False  # the engine sent its end record
    while True:
        try:
            if not inp.ready():
                inp.fill(block=False)
            if not inp.ready():
                # Nothing waiting: commit what arrived (one transaction for a backlog), then block.
                if err is None:
                    writer.commit()
                msg_bytes = inp.next()
            else:
                msg_bytes = inp.take()
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
        try:
            msg = decode(msg_bytes)
        except msgspec.DecodeError as e:
            msg = Refused(f"a message the writer cannot read ({e})")
        if isinstance(msg, Close):
            break
        if isinstance(msg, Flush):
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
            if isinstance(msg, Steps):
                for cols in batch_columns(msg.batch, layouts):
                    writer.write_columns(cols)
            elif isinstance(msg, Request):
                writer.write_request(RequestRecord.from_dict(msg.record))
            elif isinstance(msg, Meta):
                writer.write_meta(msg.key, msg.value)
            elif isinstance(msg, End):
                ended = True
                writer.set_end(msg.state, lost_in_flight=msg.lost_in_flight, detail=msg.detail,
                               error_step=msg.error_step)
            elif isinstance(msg, Refused):
                err = msg.reason
            else:
                err = f"an unexpected {type(msg).__name__} message"
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


if __name__ == "__main__":
    sys.exit(main())
