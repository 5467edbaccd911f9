"""Argument conventions shared by the subcommands.

Numbers: `integer(...)` / `real(...)` give `add_argument` keywords that parse the value and refuse one out of
range (or nan / inf) at parse time, with one line naming the flag: "--tol must be a finite number >= 0, got
nan". Names: `one_of(...)` takes one of a fixed list (or an alias of one), refused the same way otherwise.
Steps: a command that takes one step says `--step N`, a range says `--steps A:B`; each accepts the other
spelling as an alias (`export --step N` is one step, `replay --steps N` is `--step N`). Output files:
`check_writable` proves an output path can be created before any slow work starts. Flags that would be
ignored in combination are refused with `conflict`.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

INT64_MAX = 2**63 - 1


class _Bounded(argparse.Action):
    """Store a number that must be finite and lie within [lo, hi]; anything else is a usage error (exit 2)."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, lo: float | None = None,
                 hi: float | None = None, what: str | None = None, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.lo, self.hi = lo, hi
        self.what = what or _expectation(lo, hi, kwargs.get("type") is float)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        """Store `values`, or end with a one-line usage error when out of range."""
        v = values
        bad = isinstance(v, float) and not math.isfinite(v)
        bad = bad or (self.lo is not None and v < self.lo) or (self.hi is not None and v > self.hi)
        if bad:
            shown = f"{v:g}" if isinstance(v, float) else str(v)
            parser.error(f"{option_string or self.dest} must be {self.what}, got {shown}")
        setattr(namespace, self.dest, v)


def _expectation(lo: float | None, hi: float | None, is_float: bool) -> str:
    if is_float:
        if lo is not None and hi is not None:
            return f"a finite number between {lo:g} and {hi:g}"
        return f"a finite number >= {lo:g}" if lo is not None else "a finite number"
    if lo is not None and hi is not None:
        return f"between {lo} and {hi}"
    if lo == 0:
        return "0 or more"
    return f"at least {lo}" if lo is not None else "an integer"


def integer(lo: int | None = None, hi: int | None = None, what: str | None = None) -> dict[str, Any]:
    """`add_argument` keywords for an integer in [lo, hi] (either bound optional); `what` words the range."""
    return {"type": int, "action": _Bounded, "lo": lo, "hi": hi, "what": what}


def real(lo: float | None = None, hi: float | None = None, what: str | None = None) -> dict[str, Any]:
    """`add_argument` keywords for a finite float in [lo, hi]: nan and +-inf are always refused."""
    return {"type": float, "action": _Bounded, "lo": lo, "hi": hi, "what": what}


class _OneOf(argparse.Action):
    """Store one of `names` (case-insensitive; an `aliases` spelling is stored as the name it maps to); anything
    else is a usage error (exit 2) naming the values."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, names: Sequence[str] = (),
                 aliases: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.names, self.aliases = tuple(names), dict(aliases or {})

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        """Store the name `values` spells, or end with a one-line usage error."""
        v = str(values).strip().lower()
        v = self.aliases.get(v, v)
        if v not in self.names:
            parser.error(f"{option_string or self.dest} must be one of {', '.join(self.names)}, got {values!r}")
        setattr(namespace, self.dest, v)


def one_of(names: Sequence[str], aliases: Mapping[str, str] | None = None) -> dict[str, Any]:
    """`add_argument` keywords for one of `names` (`aliases`: other spellings and the name each stands for)."""
    return {"action": _OneOf, "names": names, "aliases": aliases, "metavar": "|".join(names)}


class _OneStep(argparse.Action):
    """`--step N` (alias `--steps N`): one step index; a range is refused with where ranges are taken."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        """Store the step index, or end with a one-line usage error."""
        text = str(values).strip()
        try:
            n = int(text)
        except ValueError:
            if ":" in text:
                parser.error(f"{option_string} {text}: this command takes one step, --step N (a range A:B is for "
                             "`specscope export --steps A:B`)")
            parser.error(f"{option_string} {text}: expected a step index N")
        if n < 0:
            parser.error(f"{option_string} must be 0 or more, got {n}")
        setattr(namespace, self.dest, n)


def add_step(p: argparse.ArgumentParser | argparse._ArgumentGroup, help: str, *, required: bool = False,
             default: int | None = None) -> None:
    """Register `--step N` (and its alias `--steps N`) for a command that works on one step."""
    p.add_argument("--step", "--steps", dest="step", action=_OneStep, required=required, default=default,
                   metavar="N", help=help + " (--steps N is accepted too)")


def check_writable(path: str, what: str = "") -> str | None:
    """Why `path` cannot be created or replaced (one sentence), or None when it can; creates and removes a
    probe file beside it, because permission bits say nothing for root or for /proc and read-only mounts."""
    label = f"{what} {path}".strip()
    if os.path.isdir(path):
        return f"{label} is a directory; give a file name"
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        return f"cannot write {label}: folder {parent} does not exist"
    try:
        fd, probe = tempfile.mkstemp(dir=parent, prefix=".specscope-probe-")
    except OSError as e:
        return f"cannot write {label}: no file can be created in {parent} ({e.strerror or e})"
    os.close(fd)
    os.unlink(probe)
    return None


def conflict(flag: str, other: str, why: str) -> str:
    """The one-line refusal for two flags of which one would be ignored."""
    return f"{flag} and {other} do not combine: {why}; pass one of them"
