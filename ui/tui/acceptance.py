"""Acceptance by draft position: the whole run beside a window around the current step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from . import model as m
from .lines import Lines, TextPane

if TYPE_CHECKING:
    pass


class AcceptPanel(TextPane):
    """Acceptance per draft position: the whole run and a window of steps around the current one."""

    def show(self, run_hist: Sequence[int] | None, window_hist: Sequence[int], window: tuple[int, int]) -> None:
        """Draw two columns of per-position bars."""
        t = Lines()
        w = 10
        run_rates = m.accept_by_position(run_hist) if run_hist else []
        win_rates = m.accept_by_position(window_hist)
        mr = m.mean_accept(run_hist) if run_hist else None
        mw = m.mean_accept(window_hist)
        t.append(f"{'pos':<4}{'run':<{w + 6}}steps {window[0]}–{window[1]}\n", style="bold")
        for j in range(max(len(run_rates), len(win_rates))):
            a = run_rates[j] if j < len(run_rates) else None
            b = win_rates[j] if j < len(win_rates) else None
            t.append(f"d{j:<3}")
            t.append(m.bar(a or 0.0, w), style="green")
            t.append(f"{'' if a is None else f'{a:.2f}':>5} ")
            t.append(m.bar(b or 0.0, w), style="cyan")
            t.append(f"{'' if b is None else f'{b:.2f}':>5}\n")
        t.append(f"accept len  run {'-' if mr is None else f'{mr:.2f}'}  window {'-' if mw is None else f'{mw:.2f}'}",
                 style="grey70")
        if run_hist is None:
            t.append("  (run totals loading…)", style="grey50")
        self.update(t)
