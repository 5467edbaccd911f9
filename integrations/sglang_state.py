"""What the SGLang recorder keeps per process: the tracer the patched classes record into (or the factory that opens
it at the first forward), the trtllm_mha_backend modules patched, what each backend told at construction, the live
batch behind a call whose arguments do not carry it, and the one way a recording failure is handled (`safely`)."""

from __future__ import annotations

import contextlib
import contextvars
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from ..tracer import user_env


class SglangTracer(Protocol):
    """What the patched classes and `safely` call on the active tracer (`sglang.SglangTracer`)."""

    closed: bool

    @property
    def opened(self) -> bool:
        """Whether the trace file exists yet."""
        ...

    def next_index(self) -> int:
        """The index the next recorded step gets."""
        ...

    def problem(self, what: str, detail: str, step: int | None = None) -> None:
        """Count one recording failure."""
        ...

    def note_feature(self, feature: str, detail: str, source: str) -> None:
        """An unmodelled feature seen after the run info was written."""
        ...

    def timing(self) -> tuple[int, Any]:
        """A prep call's start: host ns and a device mark (or None)."""
        ...

    def record_prep(self, backend: Any, prep: Any, start_ns: int, mark: Any, error: BaseException | None) -> None:
        """One finished prep call."""
        ...

    def record_in_graph(self, backend: Any, error: BaseException | None) -> None:
        """`init_forward_metadata_in_graph` returned."""
        ...

    def record_fixup(self, backend: Any, spec_info: Any, error: BaseException | None) -> None:
        """The plan-stream fix-up hook ran."""
        ...

ACTIVE: list[SglangTracer] = []  # the tracer the patched classes record into (the last one opened)
# The live batch behind a call whose arguments do not carry it (0.5.12's replay API, the draft wrapper's fan-out).
LIVE: contextvars.ContextVar[Any] = contextvars.ContextVar("specscope_sglang_live", default=None)
WRAPPER: contextvars.ContextVar[Any] = contextvars.ContextVar("specscope_sglang_wrapper", default=None)
IN_PREP: contextvars.ContextVar[bool] = contextvars.ContextVar("specscope_sglang_in_prep", default=False)
MODULES: list[Any] = []  # trtllm_mha_backend modules instrument() patched, the last one is the server's
# What each backend told at construction (`sglang_patch.attach`), oldest first: kept when the backend itself is gone.
BACKEND_FACTS: list[dict[str, Any]] = []
FACTS_SEQ = [0]  # backends attached so far in this process (numbers BACKEND_FACTS' entries)
# Failures before any tracer exists (a backend constructed before the trace opens): handed to the next tracer.
EARLY_PROBLEMS: list[tuple[str, str]] = []
_FACTORY: list[Callable[[], SglangTracer]] = []
_WARNED: list[str] = []


@contextlib.contextmanager
def live_batch(fb: Any) -> Iterator[None]:
    """Tell the recorder which live batch the next prep calls serve (for APIs that pass only padded buffers)."""
    tok = LIVE.set(fb)
    try:
        yield
    finally:
        LIVE.reset(tok)


def set_tracer_factory(factory: Callable[[], SglangTracer] | None) -> None:
    """Open a tracer lazily, at the first prepared forward (the start-up hook's way: the trace is created in
    the process that runs the backend, not in every process that imports it)."""
    _FACTORY[:] = [factory] if factory is not None else []


def active_tracer() -> SglangTracer | None:
    """The tracer patched classes record into, if any (opened by the factory on first use)."""
    if not ACTIVE and _FACTORY:
        factory = _FACTORY.pop()
        safely(factory)  # registers itself in ACTIVE; a bad path is one warning, never a dead server
    return ACTIVE[-1] if ACTIVE else None


def describe(e: BaseException) -> str:
    """The exception and the innermost frame of specscope's that raised it (what a bug report needs)."""
    here = Path(__file__).resolve().parent.parent
    frames = [f for f in traceback.extract_tb(e.__traceback__) if Path(f.filename).resolve().is_relative_to(here)]
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return f"{type(e).__name__}: {e}{where}"


def safely(fn: Callable[[], object], what: str = "recording", tracer: SglangTracer | None = None) -> None:
    """Run a recording step; a failure there is counted in the trace's `meta.recording_problems` (`what`, the
    exception type), said once on stderr, and never reaches SGLang (`SPECSCOPE_DEBUG=1` raises instead)."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the server must not die of its debugger
        if user_env.debug():
            raise
        msg = f"{type(e).__name__}: {e}"
        if msg not in _WARNED:
            _WARNED.append(msg)
            print(f"specscope: warning: sglang recording failed ({' '.join(msg.split())})", file=sys.stderr)
        tr = tracer if tracer is not None else (ACTIVE[-1] if ACTIVE else None)
        label = f"{what}: {type(e).__name__}"
        try:
            if tr is not None and not tr.closed:
                tr.problem(label, describe(e), tr.next_index())
            else:
                EARLY_PROBLEMS.append((label, describe(e)))
        except Exception:  # noqa: BLE001 - the trace itself cannot be written: stderr has said it
            pass
