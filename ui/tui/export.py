"""Ctrl+E: the steps around the current one as a bug-report bundle, through the export command's function."""

from __future__ import annotations

import os

HALF_WINDOW = 32


def window(current: int, num_steps: int, half: int = HALF_WINDOW) -> tuple[int, int]:
    """[start, stop) of the exported window around `current`."""
    start = max(0, current - half)
    return start, min(num_steps, max(start + 1, current + half + 1))


def bundle_path(trace: str, start: int, stop: int, folder: str = ".") -> str:
    """Where the bundle goes: beside the working directory, named for the trace and the steps."""
    stem = os.path.splitext(os.path.basename(trace))[0]
    return os.path.join(folder, f"{stem}-steps-{start}-{stop}.zip")


def export_window(trace: str, current: int, num_steps: int, folder: str = ".") -> str:
    """Write the bundle; returns the one-line message the status bar shows."""
    try:
        from specscope.tracer.export.bundle import write_bundle
    except ImportError:
        return "export not available in this build"
    from specscope.tracer.errors import TraceError
    from specscope.tracer.store import TraceReader

    start, stop = window(current, num_steps)
    out = bundle_path(trace, start, stop, folder)
    cmd = f"specscope export {trace} --bundle {out} --steps {start}:{stop}"
    try:
        with TraceReader(trace) as r:
            manifest = write_bundle(r, out, start, stop, trace_path=trace, export_command=cmd)
    except (OSError, ValueError, TraceError) as e:
        return f"export failed: {' '.join(str(e).split())}"
    return f"exported steps {start}:{stop} ({manifest.get('num_steps', stop - start)} steps) to {out}"
