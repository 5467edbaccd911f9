"""Talking to a child process over pipes without ever waiting forever: its status lines read with deadlines, and
why it died in its own words (its stderr) or the signal that killed it. The trace writer's child and the live
checker are both spoken to this way.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from typing import IO

_POLL_S = 0.25


def pipe(f: IO[bytes] | None) -> IO[bytes]:
    """A child's stdin or stdout."""
    assert f is not None, "children are started with stdin and stdout pipes"
    return f


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


def death(proc: subprocess.Popen[bytes], err: IO[bytes] | None, what: str) -> str:
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


class StatusLines:
    """Status lines from a child's stdout, read with deadlines (never blocks forever)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.fd = pipe(proc.stdout).fileno()
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

