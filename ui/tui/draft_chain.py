"""The draft chain of the current verify: accepted, rejected and bonus tokens per row."""

from __future__ import annotations

from typing import TYPE_CHECKING

from specscope.tracer.schema import Step

from . import model as m
from .lines import Lines, TextPane
from .pane_style import S_NOTE

if TYPE_CHECKING:
    pass


class ChainPanel(TextPane):
    """The draft chain of the verify this step belongs to: accepted tokens marked ✓, rejected ✗, bonus +."""

    def show(self, verify: Step | None, byte_level: bool, here: int) -> None:
        """Draw the chains of a verify step's rows."""
        if verify is None:
            self.update(Lines("no verify step in this iteration", style="grey50"))
            return
        t = Lines()
        t.append(f"verify step {verify.index}" + (" (this step)" if verify.index == here else "") + "\n",
                 style="bold")
        by_count = any(r.draft_tokens and not r.accepted_tokens and r.accept_length for r in verify.requests)
        room = (max(1, self.size.height - 2) if self.size.height else 8) - by_count
        shown = verify.requests if len(verify.requests) <= room else verify.requests[: room - 1]
        for r in shown:
            t.append(f"r{r.request_id:<3} ", style="bold")
            t.append("● ", style="grey62")
            for link in m.draft_chain(r.draft_tokens, r.accepted_tokens, r.accept_length):
                tok = m.token_text(link.token, byte_level)
                if link.bonus:
                    t.append(f"+{tok} ", style="bold cyan")
                elif link.accepted:
                    t.append(f"{tok}✓ ", style="bold green")
                else:
                    t.append(f"{tok}✗ ", style="red")
            t.append(f" acc {r.accept_length}\n", style="grey62")
        if len(shown) < len(verify.requests):
            t.append(f"… {len(verify.requests) - len(shown)} more rows (the requests table has them all)\n",
                     style="grey50")
        if by_count:  # the backend saw accept lengths, not tokens: ✓ / ✗ are counted, not compared
            t.append("tokens not recorded: ✓ by accept len", style=S_NOTE)
        self.update(t)
