"""The engine's side of the trace writer: `ProcessTraceWriter` sends steps to a writer in a child process, so
encoding and SQLite never compete with the engine for the GIL.

A `TraceWriter` thread in the engine's process would slow a launch-bound Python loop many times over (bs-64
steps, 5 per iteration: 15x), because its encoding holds the GIL in the loop's way. This side only encodes
compact raw steps (numpy columns, no per-request objects) into one typed batch message per resolving pass
(`pipe_format`, `step_batch`) and writes it to a pipe; the child (`process_writer_child`) encodes them straight
from those columns and commits whenever its input is momentarily empty.

The engine's side never waits forever: every status read has a deadline, and a child that died is reported with
its own last words (its stderr) or the signal that killed it. Checking the trace as it is written is not this
writer's business: the run's session starts the live checker beside it (`live_check.LiveCheck`).
"""

from __future__ import annotations

import collections
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from typing import IO, Any

from .child_process import StatusLines, death, pipe
from .errors import TraceError
from .pipe_format import LENGTH, Close, End, Flush, Message, Meta, Request, Start, encode, encode_steps
from .schema import RequestRecord, RunInfo, Step
from .step_batch import LayoutTable, raw_from_step

STATUS_TIMEOUT_S = 120.0  # a flush or close that takes longer than this is a hung writer, not a slow disk
_POLL_S = 0.25


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


def _grow_pipe(f: IO[bytes]) -> None:
    # A 1 MiB pipe absorbs bursts (graph capture, prefill) so the engine rarely waits for the writer.
    try:
        import fcntl

        fcntl.fcntl(f.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
    except (ImportError, OSError):
        pass


class ProcessTraceWriter:
    """Same role as `TraceWriter` (write_step/write_request/flush/close), running in a child process.

    The child is `python -m specscope.tracer.process_writer_child` with pipes, not a multiprocessing child, so it
    never re-imports the caller's main module and never inherits a CUDA context. The trace exists once the
    constructor returns (a live checker may open it then)."""

    def __init__(self, path: str | os.PathLike[str], run: RunInfo, *, overwrite: bool = False,
                 status_timeout: float = STATUS_TIMEOUT_S) -> None:
        self.path = os.fspath(path)
        self._closed = False
        self._dead: str | None = None
        self._late = 0  # flush answers still owed after a timeout
        self.status_timeout = status_timeout
        self._err = tempfile.TemporaryFile()
        self._proc = subprocess.Popen([sys.executable, "-m", "specscope.tracer.process_writer_child"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err)
        self._lines = StatusLines(self._proc)
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
        self._layouts = LayoutTable()  # snapshot layouts the child has been sent
        _grow_pipe(pipe(self._proc.stdin))
        self._send_data(encode(Start(self.path, run.to_dict(), overwrite)))
        # Starting Python (numpy, zstandard, SQLite) on a loaded machine can take a while: a generous deadline.
        kind, msg = self._status("start", max(self.status_timeout, 60.0))
        if kind != "ready":
            self._stop_child()
            raise TraceError(msg or "the trace writer process failed to start", self.path)
        self._guarded = _WHOLE.install()

    # -- protocol ------------------------------------------------------------------------------------

    def _stop_child(self) -> None:
        try:
            pipe(self._proc.stdin).close()
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
            self._dead = death(self._proc, self._err, "the trace writer process")
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
            self._fd = pipe(self._proc.stdin).fileno()
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
        head = LENGTH.pack(len(data))
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
            self._rest = [LENGTH.pack(len(data)), memoryview(data)]
            self._finish_rest()
        finally:
            if guarded:
                _WHOLE.leave()

    def _finish_rest(self) -> None:
        """Write what is left of the message being written (blocking)."""
        rest = self._rest
        while rest:
            try:
                n = os.writev(pipe(self._proc.stdin).fileno(), rest)
            except (BrokenPipeError, OSError, ValueError):
                rest.clear()
                raise self._pipe_broke() from None
            while rest and n >= len(rest[0]):
                n -= len(rest.pop(0))
            if n:
                rest[0] = memoryview(rest[0])[n:]

    def _pipe_broke(self) -> TraceError:
        """A write to the child failed: remember why it died (its own last words) and return the error to raise."""
        self._dead = death(self._proc, self._err, "the trace writer process")
        return TraceError(self._dead, self.path)

    def _send(self, msg: Message) -> None:
        if self._closed:
            raise TraceError("the trace writer is already closed", self.path)
        self._send_data(encode(msg))

    def write_raw_step(self, raw: dict[str, Any]) -> None:
        """Queue a step in the recorder's compact form (see `step_batch.parts_from_raw`)."""
        self.write_raw_steps([raw])

    def write_raw_steps(self, raws: list[dict[str, Any]]) -> None:
        """Queue steps in the recorder's compact form as one message (a `step_batch.StepBatch`); a step that cannot
        travel fails the writer at the next flush or close, as one it cannot store does."""
        if self._closed:
            raise TraceError("the trace writer is already closed", self.path)
        if not raws:
            return
        for data in encode_steps(raws, self._layouts):
            self._send_data(data)

    def write_step(self, step: Step) -> None:
        """Queue a schema Step."""
        self.write_raw_steps([raw_from_step(step)])

    def write_request(self, rec: RequestRecord) -> None:
        """Queue a finished request."""
        self._send(Request(rec.to_dict()))

    def write_meta(self, key: str, value: str) -> None:
        """Queue a `meta` row (see `TraceWriter.write_meta`)."""
        self._send(Meta(str(key), str(value)))

    def set_end(self, state: str, *, lost_in_flight: int | None, detail: str = "",
                error_step: int | None = None) -> None:
        """Say how the run ended (see `TraceWriter.set_end`); the child stores it when it closes the trace. Without
        it a close records "closed", and a pipe that ends with no close frame records "engine_ended"."""
        self._send(End(str(state), None if lost_in_flight is None else int(lost_in_flight), str(detail),
                       None if error_step is None else int(error_step)))

    def flush(self) -> None:
        """Wait until everything sent is committed."""
        self._send(Flush())
        self._wait_sent()
        kind, msg = self._status("a flush")
        if kind != "flushed":
            raise TraceError(msg or "the trace writer process failed", self.path)

    def close(self) -> None:
        """Commit everything and stop the process; raises TraceError if writing failed. Safe to call again, and
        after the child died."""
        if self._closed:
            return
        self._closed = True
        kind, msg = "error", self._dead or ""
        if not self._dead:
            try:
                self._send_data(encode(Close()))
                self._wait_sent()
                kind, msg = self._status("close")
            except TraceError as e:
                msg = e.problem
        self._stop_sender()
        self._stop_child()
        self._release_sigint()
        if kind != "closed":
            raise TraceError(msg if msg.startswith("the trace writer") else f"writing the trace failed ({msg})",
                             self.path)

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
        """Stop the child without waiting for a clean close (what arrived so far is committed)."""
        self._closed = True
        self._release_sigint()
        if self._proc.poll() is None:
            try:
                pipe(self._proc.stdin).close()
            except OSError:
                pass
