"""The records' plain-JSON form: what every `from_dict` shares."""

from __future__ import annotations

import dataclasses
from typing import Any


def known_fields(cls: type, d: dict[str, Any]) -> dict[str, Any]:
    """The items of `d` that name a field of dataclass `cls` (a later minor version's keys are dropped)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in d.items() if k in names}
