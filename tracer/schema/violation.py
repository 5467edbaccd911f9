"""Violations: an invariant a step broke, and the recorded cells it names."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .dict_form import known_fields
from .enums import Severity


@dataclass(frozen=True)
class Cell:
    """One recorded value a violation names besides its own cell: the other side of the relation it checks."""

    array: str  # as in Violation.array: a Step.arrays name, a scalar name, or a request field
    row: int | None = None
    col: int | None = None
    value: str | None = None  # the value recorded there, as text
    step: int | None = None  # the step it was recorded at, when not the violation's own step (e.g. the capture)

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form, without the unset fields."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Cell:
        """Inverse of `to_dict`."""
        return cls(**known_fields(cls, d))


@dataclass(frozen=True)
class Violation:
    """One invariant that a step broke."""

    check_id: str  # e.g. "I5"
    severity: Severity
    step: int
    message: str  # names the step, the request and the values that disagree
    request_id: int | None = None
    # Where the wrong value is, so a viewer can highlight the cell: the array (as named in Step.arrays, or a
    # request field such as "accept_length"), its row (batch row) and column (e.g. logical page), the value
    # found and the value the invariant expected (as text: a number or a short list).
    array: str | None = None
    row: int | None = None
    col: int | None = None
    found: str | None = None
    expected: str | None = None
    # The other facts the relation ties this cell to, each where it was recorded with its value (e.g. the request
    # row's slot that a page-table cell disagrees with), so a viewer can mark both sides. Empty for single facts.
    related: tuple[Cell, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (`related` only when there is one)."""
        d = dataclasses.asdict(self)
        d["severity"] = self.severity.value
        if self.related:
            d["related"] = [c.to_dict() for c in self.related]
        else:
            del d["related"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Violation:
        """Inverse of `to_dict`."""
        k = known_fields(cls, d)
        k["severity"] = Severity(k["severity"])
        k["related"] = tuple(Cell.from_dict(c) for c in k.get("related") or ())
        return cls(**k)

    def cells(self) -> list[Cell]:
        """Every recorded cell this violation names: its own (value = found) first, then the related ones."""
        own = [Cell(self.array, self.row, self.col, self.found)] if self.array is not None else []
        return own + list(self.related)
