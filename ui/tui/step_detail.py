"""The step pane: mode, graph phase, bs vs padded, T vs K, q/k lengths, timings, marked in place."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from specscope.tracer.schema import Step, StepSummary
from specscope.ui.recording_notes import RecordingNotes, replay_without_metadata
from specscope.ui.views import CellMark, fmt_ns

from .lines import Lines, TextPane
from .marks import (
    StepMarks,
    mark_text,
    symbol,
)
from .marks import cell_name as marks_cell
from .pane_style import S_MARK, S_MARK_FOCUS, S_MARK_TEXT, S_NOTE

if TYPE_CHECKING:
    pass


class DetailPanel(TextPane):
    """Forward mode, draft step, graph phase (and its capture), bs vs padded bs, T vs K, max_seq_len_q/k, timings;
    each field a violation names is marked in place with what was found and what the check expected."""

    BASE_HEIGHT = 6  # border and five lines; a step with marked fields takes a line per marked field more

    def show(self, st: Step, s: StepSummary, capture: int | None, kernel: str, nviol: int,
             marks: StepMarks | None = None, tk: Sequence[str] = (), notes: RecordingNotes | None = None) -> None:
        """Draw the detail of one step: short lines that do not wrap (the ends are cut on narrow panes); a marked
        field gets a line of its own, so its found vs expected is never cut. `notes` (what the recording could not
        record) turn a replay without metadata into "not recorded (why)" and a field the backend lacks into
        "(absent in this backend)", not a "-" that reads like a lost value."""
        marks = marks or StepMarks()
        notes = notes or RecordingNotes()
        t = Lines()
        mode = st.mode.value + (f" #{st.step_id}" if st.step_id is not None else "")
        t.append(f"step {st.index}", style="bold")
        t.append(f"  {st.model} {mode}", style="bold #87d7ff")
        t.append(f"  iter {st.iteration}\n")
        g = st.graph.value
        if g == "replay":
            g += f" of capture {capture}" if capture is not None else " (capture not in trace)"
        t.append(g, style="#d7afff")
        pad = st.padded_batch_size - st.batch_size
        t.append(f" · bs {st.batch_size}/{st.padded_batch_size}")
        if pad:
            t.append(f" (+{pad} pad)", style="#ffaf00")
        t.append(f" · T {st.tokens_per_request} K {st.num_draft_tokens}")
        if tk:  # only where a check judged T against the kernel's q length (T ≠ K alone is a healthy runner)
            t.append(f" ✗ {' '.join(tk)}", style=S_MARK)
        t.append("\n")
        sc = st.scalars
        names = [("max_seq_len_q", "max_seq_len_q"), ("max_seq_len_k", "max_seq_len_k")]
        if "kernel_q_len" in sc:
            names.append(("kernel_q_len", "kernel_q_len"))
        if "captured_max_seq_len_q" in sc and st.graph.value == "replay":
            names.append(("captured_max_seq_len_q", "frozen q"))
        marked: list[tuple[str, str, list[CellMark]]] = []
        plain: list[tuple[str, str]] = []  # (key, label) of the fields shown unmarked
        for key, label in names:
            got = marks.scalar(key)
            if got:
                marked.append((label, str(sc.get(key, "-")), got))
            else:
                plain.append((key, label))
        shown = {k for k, _ in names}
        for mk in marks.unplaced(shown):  # a scalar the line above does not list, or an array no pane draws
            if mk.row is None and mk.col is None and mk.array in sc:
                marked.append((mk.array, str(sc[mk.array]), [mk]))
        for label, value, got in marked:
            focus = any(marks.is_focus(mk) for mk in got)
            t.append(f"{symbol(got[0])} {label} {value}", style=S_MARK_FOCUS if focus else S_MARK)
            t.append("  " + "; ".join(f"{mk.check_id}: {mark_text(mk)}" for mk in got) + "\n", style=S_MARK_TEXT)
        if replay_without_metadata(notes, st.graph.value, [a.name for a in st.arrays], list(sc)):
            # The graph computed this replay's metadata where Python never sees it: there is nothing to show, and
            # the capture's values would be stale.
            t.append(f"not recorded ({notes.replay_reason()})", style=S_NOTE)
            t.append(": max_seq_len_q/k, page table, seqlens · header, requests, spans recorded\n", style="grey62")
        else:
            # A field the backend does not have is recorded absent, never made up: its own line says so (a "-"
            # would read as a value lost), short enough for an 80-column terminal's pane.
            absent = [label for key, label in plain if key not in sc and notes.is_absent(key)]
            t.append(" · ".join(f"{label} {sc.get(key, '-')}" for key, label in plain if label not in absent) + "\n")
            for label in absent:
                t.append(f"{label} ")
                t.append("(absent in this backend)\n", style=S_NOTE)
        for mk in marks.unplaced(shown):
            if mk.row is None and mk.col is None and mk.array in sc:
                continue
            t.append(f"{symbol(mk)} {marks_cell(mk)} = {mark_text(mk)}", style=S_MARK)
            t.append(f"  {mk.check_id}\n", style=S_MARK_TEXT)
        t.append(f"{kernel} · host {fmt_ns(st.end_ns - st.start_ns, compact=True)}", style="grey70")
        for sp in st.spans:
            t.append(f" · {sp.stream}:{sp.name} {fmt_ns(sp.end_ns - sp.start_ns, compact=True)}", style="grey70")
        if st.errors:
            t.append(f"\n{len(st.errors)} call error(s): {st.errors[0].call}: {st.errors[0].message}", style="bold red")
        lines = len(t.rows)
        want = max(self.BASE_HEIGHT, lines + 1)
        if self.styles.height is None or self.styles.height.value != want:
            self.styles.height = want  # a layout pass only when the number of marked fields changes
        self.update(t)
