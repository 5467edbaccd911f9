"""Measurement-only recorders for `tracer_overhead.py --ab-ablate`: a traced engine with part of the host-side
recording switched off, to tell what that part costs in the same alternating rounds as the real recorder.

A trace recorded through these is incomplete by design (steps or spans are missing), so they live here, beside the
benchmark, and never in the tracer: nothing but `--ab-ablate` builds them.

- `floor`: the graphs are captured as the real recorder captures them (stamp nodes, the snapshot-ring pack) and
  replayed unchanged, but no step after the captures is recorded on the host (no step records, no eager stamps, no
  deferred records, nothing resolved or sent). Its cost over the untraced engine is what recording inside the
  graphs costs on its own: the floor a host path, however cheap, cannot go under.
- `eager-spans`: everything as recorded, except the eager spans ("producers", "metadata" and the forward of an
  eager step), so no stamp is launched from the host; graph-stamped spans stay.
"""

from __future__ import annotations

import contextlib
from typing import Any

from specscope.tracer.probe import _NO_SPAN
from specscope.tracer.recorder import Recorder
from specscope.tracer.schema import GraphPhase

LEVELS = ("floor", "eager-spans")


class FloorRecorder(Recorder):
    """`floor`: only graph captures are recorded (so the graphs carry the real recorder's nodes)."""

    def begin_step(self, **kw: Any) -> Any:
        """A record for a capture; None (nothing recorded) for every other step."""
        return super().begin_step(**kw) if kw["graph"] is GraphPhase.CAPTURE else None

    def span(self, rec: Any, stream: str, name: str, cuda_stream: Any = None) -> contextlib.nullcontext[None]:
        """No eager span."""
        return _NO_SPAN


class NoEagerSpansRecorder(Recorder):
    """`eager-spans`: the real recorder without its eager spans."""

    def span(self, rec: Any, stream: str, name: str, cuda_stream: Any = None) -> contextlib.nullcontext[None]:
        """No eager span."""
        return _NO_SPAN


def recorder_class(level: str) -> type[Recorder]:
    """The recorder class of an ablation level (one of `LEVELS`)."""
    return {"floor": FloorRecorder, "eager-spans": NoEagerSpansRecorder}[level]
