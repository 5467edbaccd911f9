"""Live mode: run `specscope run --control SOCKET` as a child process, follow its trace, and drive it.

The TUI listens on a Unix socket; the engine's control point (backend/control.py) connects to it and the two
speak JSON lines (docs/tui.md, "Control channel"). Exact breakpoints on a violation or a condition use sync
mode: after each step the engine commits it, says {"event": "step"}, and waits; this side feeds the step to the
streaming checker (and evaluates the condition) and answers "ack" or "pause". Step-number breakpoints are the
engine's own (`break_step`), so they cost nothing per step.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specscope.tracer.condition import Condition, ConditionError, parse_condition
from specscope.tracer.errors import TraceError
from specscope.tracer.query import summary_fields
from specscope.tracer.store import TraceReader
from textual.message import Message

if TYPE_CHECKING:
    from textual.app import App

    from .source import TraceSource


# Why a run started paused holds at its first step (the keys to press lead the status line).
START_PAUSED_REASON = "paused at the first step"


class LiveError(Exception):
    """The run could not be started or died before its trace existed; `str()` is one sentence."""


# What the controller tells the app. Messages, not calls: the controller sits below the app (the app drives it), and
# posting is thread-safe in Textual, so the event thread reports without knowing the app's methods.


class LivePaused(Message):
    """The run paused after step `index`, for `reason` (the status line's text)."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__()
        self.index = index
        self.reason = reason


class LiveChanged(Message):
    """The run's state changed (running, finished)."""


class LiveNote(Message):
    """A one-line note for the status bar (the breakpoints just set)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


@dataclass
class Breakpoints:
    """What stops the run: any violation, a step number, a condition over summary fields."""

    on_violation: bool = True
    step: int | None = None
    condition: Condition | None = None

    @property
    def needs_sync(self) -> bool:
        """Violation and condition stops are decided here, so the engine must wait for each verdict."""
        return self.on_violation or self.condition is not None

    def describe(self) -> str:
        """Short text for the status line."""
        parts = (["violation"] if self.on_violation else []) + ([f"step {self.step}"] if self.step is not None
                                                                 else []) + (
            [f"if {self.condition.text}"] if self.condition is not None else [])
        return "break: " + (", ".join(parts) if parts else "none")


class Channel:
    """The TUI's end of the control socket: a listener, one connection, JSON lines both ways."""

    def __init__(self, folder: str) -> None:
        self.path = os.path.join(folder, "control.sock")
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self.path)
        self._server.listen(1)
        self._conn: socket.socket | None = None
        self._buf = b""
        self._send_lock = threading.Lock()

    def accept(self, timeout: float, alive: Callable[[], bool]) -> None:
        """Wait for the engine to connect (while `alive()` says the child still runs)."""
        deadline = time.monotonic() + timeout
        self._server.settimeout(0.1)
        while True:
            try:
                self._conn, _ = self._server.accept()
                self._conn.settimeout(None)
                return
            except TimeoutError:
                if not alive() or time.monotonic() >= deadline:
                    raise LiveError("the run did not connect to the control channel") from None

    def send(self, obj: dict[str, Any]) -> bool:
        """Send one command; False when the engine has gone."""
        if self._conn is None:
            return False
        try:
            with self._send_lock:
                self._conn.sendall((json.dumps(obj) + "\n").encode())
            return True
        except OSError:
            return False

    def recv(self, timeout: float | None) -> dict[str, Any] | None:
        """One event, None on timeout; {"event": "eof"} when the engine hung up."""
        assert self._conn is not None
        while b"\n" not in self._buf:
            try:
                self._conn.settimeout(timeout)  # raises EBADF once the socket is closed under this thread
                chunk = self._conn.recv(65536)
            except TimeoutError:
                return None
            except OSError:
                chunk = b""
            if not chunk:
                return {"event": "eof"}
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        try:
            obj = json.loads(line)
        except ValueError:
            return {}
        return obj if isinstance(obj, dict) else {}

    def close(self) -> None:
        """Close both sockets."""
        for s in (self._conn, self._server):
            if s is not None:
                try:
                    s.close()
                except OSError:
                    pass


class LiveController:
    """Starts the run, keeps the checker beside it, and turns keys into control commands."""

    def __init__(self, run_argv: list[str], trace: str, breakpoints: Breakpoints, *, start_paused: bool = False,
                 python: str = sys.executable) -> None:
        self.run_argv, self.trace, self.breaks = run_argv, trace, breakpoints
        self.start_paused = start_paused
        self.python = python
        self.folder = tempfile.mkdtemp(prefix="specscope-live-")
        self.log_path = os.path.join(self.folder, "run.log")
        self.channel = Channel(self.folder)
        self.proc: subprocess.Popen[bytes] | None = None
        self.app: App[Any] | None = None  # where the messages go
        self.source: TraceSource | None = None  # the app's view of the trace, whose violations the checker fills
        self.state = "starting"  # starting, running, paused, finished
        self.paused_at: int | None = None
        self.reason = ""
        self._pending_reason: str | None = None
        self._checker: Any = None
        self._fed = -1
        self._reader: TraceReader | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._held_once = False  # the engine has paused at least once (a run started paused: at its first step)
        self.events: list[dict[str, Any]] = []  # every event, for tests and the log

    # -- start ------------------------------------------------------------------------------------

    def _alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def launch(self, timeout: float = 120.0) -> None:
        """Start the child, hand it the breakpoints, and wait until its trace can be opened."""
        cmd = [self.python, "-m", "specscope.ui.cli", "run", *self.run_argv, "-o", self.trace, "--quiet",
               "--control", self.channel.path]
        log = open(self.log_path, "wb")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        log.close()
        try:
            self.channel.accept(timeout, self._alive)
        except LiveError:
            raise LiveError(self._child_error() or "the run did not start") from None
        hello = self.channel.recv(timeout)
        if not hello or hello.get("event") != "hello":
            raise LiveError(self._child_error() or "the run did not greet the control channel")
        self.events.append(hello)
        self._send_breakpoints()
        self.channel.send({"cmd": "pause" if self.start_paused else "continue"})
        self.state = "paused" if self.start_paused else "running"
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._reader = TraceReader(self.trace)
                break
            except TraceError:
                if not self._alive():
                    raise LiveError(self._child_error() or "the run ended before writing its trace") from None
                if time.monotonic() >= deadline:
                    raise LiveError("the run's trace did not appear") from None
                time.sleep(0.05)

    def _child_error(self) -> str:
        if self.proc is not None:
            try:
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                lines = [ln.strip() for ln in f if ln.strip()]
        except OSError:
            return ""
        errs = [ln for ln in lines if ln.startswith("specscope: error")]
        line = (errs or lines or [""])[-1]
        return line.removeprefix("specscope: error: ")

    def _send_breakpoints(self) -> None:
        self.channel.send({"cmd": "break_step", "index": self.breaks.step})
        self.channel.send({"cmd": "sync", "on": self.breaks.needs_sync})

    def attach(self, app: App[Any], source: TraceSource) -> None:
        """The app this controller posts its messages to, and the trace source its checker's verdicts go into."""
        self.app, self.source = app, source

    def start(self) -> None:
        """Begin listening for the engine's events (called when the app is mounted)."""
        self._thread = threading.Thread(target=self._loop, name="specscope-live", daemon=True)
        self._thread.start()

    # -- the event loop (its own thread) -----------------------------------------------------------

    def _loop(self) -> None:
        while True:
            ev = self.channel.recv(0.2)
            if ev is None:
                self._catch_up(None)
                if self.state == "finished":
                    self._catch_up(None)
                    if self._reader is not None and self._reader.is_closed():
                        return
                continue
            self.events.append(ev)
            kind = ev.get("event")
            if kind == "step":
                self._verdict(int(ev["index"]))
            elif kind == "paused":
                first = not self._held_once
                self._held_once = True
                self.state, self.paused_at = "paused", int(ev["index"])
                self.reason = self._pending_reason or f"paused after step {ev['index']}"
                if first and self.start_paused and not self._pending_reason:
                    self.reason = START_PAUSED_REASON
                if self.breaks.step is not None and int(ev["index"]) >= self.breaks.step and not self._pending_reason:
                    self.reason = f"breakpoint: step {self.breaks.step}"
                    self.breaks.step = None
                self._pending_reason = None
                self._catch_up(None)
                self._post(LivePaused(int(ev["index"]), self.reason))
            elif kind == "running":
                self.state, self.paused_at = "running", None
                self._post(LiveChanged())
            elif kind in ("done", "eof"):
                self.state = "finished"
                self._post(LiveChanged())
                if kind == "eof":
                    self._catch_up(None)
                    return

    def _post(self, message: Message) -> None:
        app = self.app
        if app is None:
            return
        try:
            app.post_message(message)
        except RuntimeError:
            pass  # the app is shutting down (its event loop closed under this thread)

    def _catch_up(self, through: int | None) -> list[Any]:
        """Feed committed steps to the streaming checker (up to `through`, else all); returns new violations."""
        r, src = self._reader, self.source
        if r is None or src is None:
            return []
        from specscope.tracer.checks import Checker

        if self._checker is None:
            self._checker = Checker.for_trace(r)  # as `check` does
        stop = r.num_steps() if through is None else through + 1
        new: list[Any] = []
        if stop <= self._fed + 1:
            return new
        for st in r.steps(self._fed + 1, stop):
            found = self._checker.feed(st)
            ct = src.checked_through
            new += src.violations.add(v for v in found if ct is None or v.step > ct)
            self._fed = st.index
            src.tui_checked_through = st.index
        return new

    def _verdict(self, index: int) -> None:
        """Sync mode: judge step `index` and answer the engine (pause, or go on)."""
        new = self._catch_up(index)
        reason = None
        if self.breaks.on_violation:
            here = [v for v in new if v.step == index] or new
            if here:
                v = here[0]
                reason = f"violation {v.check_id} at step {v.step}: {v.message}"
        if reason is None and self.breaks.condition is not None and self._reader is not None:
            rows = self._reader.summaries(max(0, index - 1), index + 1)
            cur = next((s for s in rows if s.index == index), None)
            prev = next((s for s in rows if s.index == index - 1), None)
            if cur is not None and self.breaks.condition.evaluate(
                    summary_fields(cur), None if prev is None else summary_fields(prev)):
                reason = f"condition {self.breaks.condition.text!r} at step {index}"
        if reason is not None:
            self._pending_reason = reason
            self.channel.send({"cmd": "pause"})
        else:
            self.channel.send({"cmd": "ack", "index": index})

    # -- commands (UI thread) ---------------------------------------------------------------------

    def toggle(self) -> None:
        """Pause a running run, continue a paused one."""
        if self.state == "paused":
            self.resume()
        elif self.state == "running":
            self._pending_reason = None
            self.channel.send({"cmd": "pause"})

    def resume(self) -> None:
        """Run freely (breakpoints stay armed)."""
        if self.state == "paused":
            self.channel.send({"cmd": "continue"})
            if not self._held_once:
                # Started paused and not held yet: the engine only says "running" when it leaves a hold.
                self.state = "running"

    def step(self) -> None:
        """One forward, then pause."""
        if self.state == "paused":
            self._pending_reason = None
            self.channel.send({"cmd": "step", "n": 1})
        elif self.state == "running":
            self.channel.send({"cmd": "pause"})

    def next_iteration(self) -> None:
        """Run until the first step of the next iteration."""
        if self.state in ("paused", "running"):
            self.channel.send({"cmd": "next_iteration"})

    def breakpoint_text(self, text: str) -> str | None:
        """Apply a breakpoint edit ("violation" / "violation off", "step N" / "N", "off", or a condition); error
        sentence or None."""
        t = " ".join(text.split())
        low = t.lower()
        # Words say what they set: typing "violation" while the violation breakpoint is on must not turn it off.
        if low in ("v", "violation", "violations", "violation on", "violations on", "on violation"):
            self.breaks.on_violation = True
        elif low in ("violation off", "violations off", "no violation", "no violations", "-violation"):
            self.breaks.on_violation = False
        elif low in ("off", "none", "clear"):
            self.breaks = Breakpoints(on_violation=False)
        elif low.removeprefix("step").strip().isdigit():
            self.breaks.step = int(low.removeprefix("step").strip())
        else:
            expr = t[3:] if low.startswith("if ") else t
            try:
                self.breaks.condition = parse_condition(expr)
            except ConditionError as e:
                return str(e)
        self._send_breakpoints()
        self._post(LiveNote(self.breaks.describe()))
        return None

    def follow_tail(self) -> bool:
        """Whether the view jumps to each new step (while the run runs)."""
        return self.state == "running" or self.state == "finished"

    def status_text(self, short: bool = False) -> str:
        """The live part of the status line (`short`: the state and its keys)."""
        if short:
            # The keys of the state come with it: this part leads the status line, so a narrow terminal keeps it.
            if self.state == "paused":
                at = "before the first step" if self.paused_at is None else f"at {self.paused_at}"
                return f"‖ PAUSED {at} · space run · s step · q quit"
            return {"running": "▶ running · space pause · q quit",
                    "finished": "■ run finished · q quit"}.get(self.state, "starting…")
        if self.state == "paused" and self.reason:
            return f"{self.reason}  [{self.breaks.describe()}]  i iteration · b breaks · ? help"
        return f"[{self.breaks.describe()}]  s step · i iteration · b breaks · ? help"

    # -- stop -------------------------------------------------------------------------------------

    async def stop(self, timeout: float = 30.0) -> None:
        """Stop the run cleanly (the engine closes the trace), then wait for the child."""
        await asyncio.to_thread(self.shutdown, timeout)

    def shutdown(self, timeout: float = 30.0) -> None:
        """Blocking stop: "stop" over the channel, then SIGINT, then SIGKILL if the child still runs."""
        if self._stopping or self.proc is None:
            return
        self._stopping = True
        self.channel.send({"cmd": "stop"})
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, signal.SIGINT)
                self.proc.wait(timeout=10)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                self.proc.kill()
                self.proc.wait()
        self.channel.close()
        self.state = "finished"

    def returncode(self) -> int | None:
        """The child's exit status once it ended."""
        return None if self.proc is None else self.proc.poll()
