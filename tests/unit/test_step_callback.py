"""Live control is the engine's step callback, not part of recording: over a real control socket (the viewer's side
played by the test with the TUI's own `Channel`), the index and iteration the engine reports after every forward are
the trace's step index and iteration (captures included, CUDA graphs and the plan stream on), a pause holds only
once the paused step is readable in the trace, and with no trace at all the same steps are reported and the run
still pauses where it is told."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from specscope.backend.control import ControlPoint  # noqa: E402
from specscope.backend.engine_config import EngineConfig  # noqa: E402
from specscope.backend.session import run_session  # noqa: E402
from specscope.tracer.schema import GraphPhase  # noqa: E402
from specscope.tracer.store import TraceReader  # noqa: E402
from specscope.ui.tui.live import Channel  # noqa: E402

CFG = dict(model="tiny", draft="tiny-draft", device="cpu", dtype="float32", batch_size=2, num_requests=3,
           max_new_tokens=10, spec_steps=3, seed=0, prompt_len=(16, 32), cuda_graph=True, plan_stream=True,
           graph_batch_sizes=(1, 2))
BREAK_AT = 9  # past the captures (2 sizes x (verify, 2 draft steps, draft extend): steps 0-7)


class SyncViewer:
    """The viewer's end in sync mode: acks every announced step, records it, and at the pause checks that the paused
    step is already in the trace (when there is one) before it lets the run go on."""

    def __init__(self, folder: str, trace: str | None) -> None:
        self.channel = Channel(folder)
        self.trace = trace
        self.steps: list[tuple[int, int]] = []
        self.paused: list[tuple[int, int]] = []
        self.readable_at_pause: list[bool] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.channel.accept(30.0, lambda: True)
        assert (self.channel.recv(30.0) or {}).get("event") == "hello"
        self.channel.send({"cmd": "break_step", "index": BREAK_AT})
        self.channel.send({"cmd": "sync", "on": True})
        self.channel.send({"cmd": "continue"})
        while True:
            ev: dict[str, Any] = self.channel.recv(60.0) or {"event": "timeout"}
            kind = ev.get("event")
            if kind == "step":
                self.steps.append((ev["index"], ev["iteration"]))
                self.channel.send({"cmd": "ack", "index": ev["index"]})
            elif kind == "paused":
                self.paused.append((ev["index"], ev["iteration"]))
                self.steps.append((ev["index"], ev["iteration"]))
                if self.trace is not None:
                    with TraceReader(self.trace) as r:
                        self.readable_at_pause.append(ev["index"] in {s.index for s in r.steps()})
                self.channel.send({"cmd": "continue"})
            elif kind != "running":
                return  # done, eof or a timeout

    def finish(self) -> None:
        self.thread.join(60.0)
        self.channel.close()


def _run(tmp_path: Path, name: str, traced: bool) -> tuple[SyncViewer, str | None]:
    folder = tmp_path / name
    folder.mkdir()
    trace = str(folder / "run.db") if traced else None
    viewer = SyncViewer(str(folder), trace)
    control = ControlPoint(viewer.channel.path)
    run_session(EngineConfig(**CFG), trace, command="pytest step callback", control=control, check=False)
    viewer.finish()
    return viewer, trace


def test_the_reported_steps_are_the_traces_steps_and_need_no_trace(tmp_path: Path) -> None:
    traced, trace = _run(tmp_path, "traced", traced=True)
    assert trace is not None
    with TraceReader(trace) as r:
        steps = list(r.steps())
    # Every forward reported once, in order, with the index and iteration the trace gives it.
    assert traced.steps == [(s.index, s.iteration) for s in steps]
    captures = sum(s.graph == GraphPhase.CAPTURE for s in steps)
    assert [s.graph == GraphPhase.CAPTURE for s in steps[:captures + 1]] == [True] * captures + [False]
    assert 0 < captures < BREAK_AT and any(s.graph == GraphPhase.REPLAY for s in steps)
    # The break held after step BREAK_AT, which the viewer could already read (the callback's flush wrote it).
    assert [i for i, _ in traced.paused] == [BREAK_AT] and traced.readable_at_pause == [True]

    # The same run with recording off: the same forwards reported, and the break still holds there.
    untraced, _ = _run(tmp_path, "untraced", traced=False)
    assert untraced.steps == traced.steps
    assert untraced.paused == traced.paused
