"""Where a go-to box or a search takes the view: pure functions of the trace source and the current step."""

from __future__ import annotations

from specscope.tracer.query import StepFilter

from .source import TraceSource


def goto_target(src: TraceSource, current: int, text: str) -> int | str:
    """The step a go-to box names (a number, +N / -N rows, end, or iN: iteration N's first), or an error sentence."""
    t = text.strip().lower()
    try:
        if t in ("end", "$", "last"):
            target = src.last_index()
        elif t.startswith(("+", "-")):
            # N steps on, as `]` moves one: rows of the list, so a bundle's gap counts as no steps.
            row = src.row_of(current) + int(t)
            held = src.index_at(row)
            target = current + int(t) if held is None else held
        elif t.startswith("i"):
            hits = src.reader.find_steps(StepFilter(iteration=int(t[1:])), limit=1)
            if not hits:
                return f"no step in iteration {t[1:]}"
            target = hits[0]
        else:
            target = int(t)
    except ValueError:
        return f"not a step number: {text!r} (a number, +N, -N, end, or iN for iteration N)"
    if not src.has(target):  # indexes, not rows: a bundle keeps the original run's numbers
        return f"no step {target} (the trace has {src.steps_text()})"
    return target


def search(src: TraceSource, current: int, f: StepFilter, backward: bool = False) -> tuple[int, bool] | None:
    """The next (previous) step after `current` that `f` matches, wrapping around: (step, wrapped), or None."""
    hit = src.find(f, current, backward=backward)
    if hit is not None:
        return hit, False
    hit = src.find(f, -1 if not backward else src.last_index() + 1, backward=backward)
    return None if hit is None else (hit, True)
