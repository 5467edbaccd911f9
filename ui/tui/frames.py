"""The main screen draws the frame after a move as soon as it is idle, not on Textual's next 60 fps tick.

Textual coalesces repaints: a widget's refresh reaches the screen as a message, and when the screen is idle it
resumes a 1/60 s interval timer whose tick lays out and renders. That timer's grid starts when the screen does, and
after a tick that ran longer than one period it skips one period too many (Textual 8.2's `Timer._run`: `count =
int(elapsed / interval + 1)`, then it waits for `count + 1`), so a key that lands just after a frame got its frame
17-33 ms after that one: on the 100k-step benchmark's back-to-back keys the frame waited 13 ms (median, up to 30)
after the move was done, the gap between the UI thread's CPU p99 and the wall p99. A move marks the screen
(`frame_now`); the screen's next idle moment -- every widget's refresh of that move has arrived by then, they are
posted in the same loop turn -- runs the tick's own work at once. Everything else (mouse, scrolling, modal screens)
keeps Textual's pace.
"""

from __future__ import annotations

from textual import events
from textual.screen import Screen

_TICK = getattr(Screen, "_on_timer_update", None)  # the timer's work; a Textual without it keeps its own pace


class MainScreen(Screen):
    """The default screen of the app; `frame_now` asks for the next frame as soon as the screen is idle."""

    frame_now = False
    idle_frames = 0  # frames drawn this way (tests and benchmarks read it)

    async def _on_idle(self, event: events.Idle) -> None:
        # Screen._on_idle (which resumes the frame timer) runs after this unless the event's default is prevented.
        if not (self.frame_now and callable(_TICK)) or not self.is_current or \
                bool(getattr(self.app, "_batch_count", 0)):
            return
        self.frame_now = False
        if (getattr(self, "_layout_required", False) or getattr(self, "_scroll_required", False) or
                getattr(self, "_repaint_required", False) or getattr(self, "_dirty_widgets", None)):
            event.prevent_default()
            self.idle_frames += 1
            _TICK(self)  # the timer's tick, now: layout, dirty widgets, compositor, display
