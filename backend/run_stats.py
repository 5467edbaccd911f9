"""What a run did (`RunStats`, the end-of-run summary's numbers) and the engine's per-forward callback type."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

# Called after every forward (captures included) with its step index, its iteration (-1 for a capture) and a flush
# that makes every ended step readable in the trace (nothing without one): `ControlPoint.after_step`'s signature.
StepCallback = Callable[[int, int, Callable[[], None]], None]


@dataclass
class RunStats:
    """What a run did, for the end-of-run summary."""

    iterations: int = 0
    output_tokens: int = 0
    verify_rows: int = 0
    accepted_total: int = 0  # tokens committed by verifies, bonus included
    accepted_by_position: list[int] = field(default_factory=list)
    wall_s: float = 0.0
    iteration_s: list[float] = field(default_factory=list)  # wall time of each iteration
    iteration_bs: list[int] = field(default_factory=list)  # requests decoded in it
    iteration_prefill: list[bool] = field(default_factory=list)  # whether it also prefilled newcomers

    @property
    def mean_accept_length(self) -> float | None:
        """Tokens committed per verify row, bonus included."""
        return self.accepted_total / self.verify_rows if self.verify_rows else None
