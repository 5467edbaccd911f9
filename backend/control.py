"""The engine-side control point of live mode: a run pauses between forwards when a viewer asks it to.

`specscope run --control PATH` connects to the Unix socket a viewer (the live TUI) listens on, and after each
forward the engine calls `ControlPoint.after_step` (its step callback, `Engine.on_step_end`), with the trace on or
off: with one, the index it reports is the trace's step index and its flush makes the step readable there. Both
sides speak JSON lines; the protocol is documented in docs/tui.md ("Control channel"). The engine never imports the
viewer, the viewer never imports the engine: this socket is the whole interface.

Engine -> viewer: {"event": "hello", "protocol": 1, "pid": N}, {"event": "step", "index": i, "iteration": it}
(sync mode only), {"event": "paused", "index": i, "iteration": it}, {"event": "running"}, {"event": "done"}.
Viewer -> engine: {"cmd": "continue" | "pause" | "stop" | "next_iteration"}, {"cmd": "step", "n": N},
{"cmd": "break_step", "index": N | null}, {"cmd": "sync", "on": bool}, {"cmd": "ack", "index": i}.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from typing import Any

PROTOCOL = 1
_RUN_COMMANDS = ("continue", "pause", "step", "next_iteration", "stop")


class RunStopped(Exception):
    """The viewer asked the run to stop (or went away); the session closes the trace cleanly."""


class ControlError(ValueError):
    """The control socket cannot be reached or spoke something else than the protocol."""


class ControlPoint:
    """The engine's end of the control channel; `after_step` blocks while the viewer holds the run."""

    def __init__(self, path: str, connect_timeout_s: float = 10.0) -> None:
        self.path = path
        deadline = time.monotonic() + connect_timeout_s
        while True:
            try:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self._sock.connect(path)
                break
            except OSError as e:
                self._sock.close()
                if time.monotonic() >= deadline:
                    raise ControlError(f"cannot connect to the control socket {path} ({e.strerror or e})") from None
                time.sleep(0.05)
        self._buf = b""
        self.paused = False
        self.steps_left: int | None = None  # "step N": pause after N more forwards
        self.until_iteration: int | None = None  # "next_iteration": pause at the first step of a later iteration
        self.break_step: int | None = None
        self.sync = False  # wait for the viewer's ack after every step (exact violation/condition breakpoints)
        self.stopped = False
        self.last_iteration: int | None = None
        self._send({"event": "hello", "protocol": PROTOCOL, "pid": os.getpid()})
        # Configuration (breakpoints, sync) comes first; the run starts at the first run-state command.
        while True:
            if self._apply(self._read(block=True)) in _RUN_COMMANDS:
                break

    # -- the wire --------------------------------------------------------------------------------

    def _send(self, obj: dict[str, Any]) -> None:
        try:
            self._sock.sendall((json.dumps(obj) + "\n").encode())
        except OSError:
            self.stopped = True  # the viewer went away: stop at the next control point

    def _read(self, block: bool) -> dict[str, Any] | None:
        """One command, or None when none is waiting (non-blocking) or the viewer hung up (then stopped)."""
        while b"\n" not in self._buf:
            self._sock.setblocking(block)
            try:
                chunk = self._sock.recv(65536)
            except BlockingIOError:
                return None
            except OSError:
                chunk = b""
            if not chunk:
                self.stopped = True
                return {"cmd": "stop"}
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        try:
            obj = json.loads(line)
        except ValueError:
            return {}
        return obj if isinstance(obj, dict) else {}

    def _apply(self, msg: dict[str, Any] | None) -> str | None:
        """Apply one command to the state; returns its name."""
        if msg is None:
            return None
        cmd = msg.get("cmd")
        if cmd == "continue":
            self.paused, self.steps_left, self.until_iteration = False, None, None
        elif cmd == "pause":
            self.paused = True
        elif cmd == "step":
            self.paused, self.until_iteration = False, None
            self.steps_left = max(1, int(msg.get("n", 1)))
        elif cmd == "next_iteration":
            self.paused, self.steps_left, self.until_iteration = False, None, self.last_iteration
            if self.last_iteration is None:  # no step yet: the first one starts the next iteration
                self.steps_left = 1
        elif cmd == "break_step":
            v = msg.get("index")
            self.break_step = None if v is None else int(v)
        elif cmd == "sync":
            self.sync = bool(msg.get("on"))
        elif cmd == "stop":
            self.stopped = True
        return cmd if isinstance(cmd, str) else None

    # -- the control point -------------------------------------------------------------------------

    def after_step(self, index: int, iteration: int, flush: Callable[[], None]) -> None:
        """Called once per forward (captures included): apply waiting commands, then pause or wait for the ack if
        asked; `flush` makes every ended step readable in the trace before the viewer hears of this one."""
        while True:
            msg = self._read(block=False)
            if msg is None:
                break
            self._apply(msg)
        if self.stopped:
            raise RunStopped(f"stopped by the viewer after step {index}")
        self.last_iteration = iteration
        hold = self.paused
        if self.steps_left is not None:
            self.steps_left -= 1
            hold = hold or self.steps_left <= 0
        if self.until_iteration is not None and iteration != self.until_iteration:
            hold = True
        if self.break_step is not None and index >= self.break_step:
            self.break_step = None
            hold = True
        if not (hold or self.sync):
            return
        flush()  # the step is committed before the viewer hears of it, so it can read it at once
        if not hold:
            self._send({"event": "step", "index": index, "iteration": iteration})
            while True:
                msg = self._read(block=True)
                cmd = self._apply(msg)
                if self.stopped:
                    raise RunStopped(f"stopped by the viewer after step {index}")
                if cmd == "ack" and msg is not None and int(msg.get("index", -1)) >= index:
                    return
                if cmd == "pause":
                    break
                if cmd in ("continue", "step", "next_iteration"):
                    return
        self._hold(index, iteration)

    def _hold(self, index: int, iteration: int) -> None:
        self.paused, self.steps_left, self.until_iteration = True, None, None
        self._send({"event": "paused", "index": index, "iteration": iteration})
        while True:
            cmd = self._apply(self._read(block=True))
            if self.stopped:
                raise RunStopped(f"stopped by the viewer after step {index}")
            if cmd in ("continue", "step", "next_iteration"):
                self._send({"event": "running"})
                return

    def close(self) -> None:
        """The run ended (or stopped): say so and hang up."""
        self._send({"event": "done"})
        try:
            self._sock.close()
        except OSError:
            pass
