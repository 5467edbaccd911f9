"""The engine-side control point against a real socket (the viewer's side played by the test)."""

from __future__ import annotations

import json
import os
import socket
import threading

from specscope.backend.control import ControlPoint, RunStopped
from tui_fixtures import _at_root  # noqa: F401 - fixtures


class Viewer:
    """A listening socket that speaks the protocol by hand."""

    def __init__(self, folder: str) -> None:
        self.path = os.path.join(folder, "c.sock")
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self.path)
        self.server.listen(1)
        self.conn: socket.socket | None = None
        self.file = None

    def accept(self) -> None:
        self.conn, _ = self.server.accept()
        self.file = self.conn.makefile("r")

    def send(self, **obj: object) -> None:
        assert self.conn is not None
        self.conn.sendall((json.dumps(obj) + "\n").encode())

    def recv(self) -> dict:
        assert self.file is not None
        return json.loads(self.file.readline())


def _connect(viewer: Viewer, *first: dict) -> ControlPoint:
    out: list[ControlPoint] = []
    t = threading.Thread(target=lambda: out.append(ControlPoint(viewer.path)))
    t.start()
    viewer.accept()
    assert viewer.recv()["event"] == "hello"
    for cmd in first:
        viewer.send(**cmd)
    t.join(5)
    return out[0]


def test_break_step_pause_step_and_stop(tmp_path) -> None:
    v = Viewer(str(tmp_path))
    cp = _connect(v, {"cmd": "break_step", "index": 2}, {"cmd": "continue"})
    flushed: list[int] = []
    result: list[str] = []

    def engine() -> None:
        try:
            for i in range(10):
                cp.after_step(i, i // 3, lambda i=i: flushed.append(i))
        except RunStopped:
            result.append("stopped")

    t = threading.Thread(target=engine)
    t.start()
    assert v.recv() == {"event": "paused", "index": 2, "iteration": 0}
    assert flushed == [2]  # running freely costs no flush; a pause commits the step first
    v.send(cmd="step", n=1)
    assert v.recv() == {"event": "running"}
    assert v.recv() == {"event": "paused", "index": 3, "iteration": 1}
    v.send(cmd="stop")
    t.join(5)
    assert result == ["stopped"] and flushed == [2, 3]
    cp.close()


def test_sync_mode_waits_for_the_ack_and_a_pause_answer_holds(tmp_path) -> None:
    v = Viewer(str(tmp_path))
    cp = _connect(v, {"cmd": "sync", "on": True}, {"cmd": "continue"})
    done = threading.Event()

    def engine() -> None:
        cp.after_step(0, 0, lambda: None)
        cp.after_step(1, 0, lambda: None)
        done.set()

    t = threading.Thread(target=engine)
    t.start()
    assert v.recv() == {"event": "step", "index": 0, "iteration": 0}
    assert not done.is_set()
    v.send(cmd="ack", index=0)
    assert v.recv() == {"event": "step", "index": 1, "iteration": 0}
    v.send(cmd="pause")  # the verdict: break here
    assert v.recv() == {"event": "paused", "index": 1, "iteration": 0}
    v.send(cmd="continue")
    assert v.recv() == {"event": "running"}
    t.join(5)
    assert done.is_set()
    cp.close()
    assert v.recv() == {"event": "done"}


def test_viewer_hanging_up_stops_the_run(tmp_path) -> None:
    v = Viewer(str(tmp_path))
    cp = _connect(v, {"cmd": "next_iteration"})
    result: list[str] = []

    def engine() -> None:
        try:
            cp.after_step(0, 3, lambda: None)  # no step seen before: the first one is the next iteration
            cp.after_step(1, 3, lambda: None)
        except RunStopped:
            result.append("stopped")

    t = threading.Thread(target=engine)
    t.start()
    assert v.recv()["event"] == "paused"
    assert v.conn is not None and v.file is not None
    v.file.close()
    v.conn.close()  # the viewer went away while holding the run
    t.join(5)
    assert result == ["stopped"]
