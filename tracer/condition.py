"""A small, safe condition language over step summary fields, for searches and breakpoints (never `eval`).

    condition := or ;  or := and ("or" and)* ;  and := not ("and" not)* ;  not := "not" not | atom
    atom      := "(" condition ")" | operand [ ("==" | "!=" | "<" | "<=" | ">" | ">=") operand ]
    operand   := INT | 'text' | "text" | NAME | prev.NAME | LITERAL

NAME is a summary field (`mode`, `bs`, `padded_bs`, `T`, `K`, `graph`, `iteration`, `step_id`, `errors`,
`duration_us`, ... see `query.summary_fields`) or a step scalar (`max_seq_len_q`, `kernel_q_len`, ...);
`prev.NAME` is that field of the step just before. LITERAL is a forward mode (`TARGET_VERIFY`), a graph
phase (`replay`), a model (`target`, `draft`), `true` / `false`. A bare operand is true when non-zero.
A field a step lacks compares false. Example: `mode == TARGET_VERIFY and bs != prev.bs`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .schema import ForwardMode, GraphPhase

_TOKEN = re.compile(
    r"\s*(?:(\d+)|('[^']*'|\"[^\"]*\")|(==|!=|<=|>=|<|>|\(|\))"
    r"|([A-Za-z_][A-Za-z_0-9]*(?:\.[A-Za-z_][A-Za-z_0-9]*)?))"
)
_LITERALS: dict[str, Any] = {m.value: m.value for m in ForwardMode} | {g.value: g.value for g in GraphPhase} | {
    "target": "target", "draft": "draft", "true": 1, "false": 0,
}  # fmt: skip
_KEYWORDS = ("and", "or", "not")
_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
}  # fmt: skip
_MAX_LEN = 500


class ConditionError(ValueError):
    """A condition that does not parse; `str()` is one line saying where and why."""


_Missing = object()


@dataclass(frozen=True)
class _Operand:
    kind: str  # "lit", "field", "prev"
    value: Any

    def get(self, row: dict[str, Any], prev: dict[str, Any] | None) -> Any:
        if self.kind == "lit":
            return self.value
        src = row if self.kind == "field" else prev
        if src is None:
            return _Missing
        return src.get(self.value, _Missing)


class Condition:
    """A parsed condition; `evaluate(row, prev)` over `query.summary_fields` dicts."""

    def __init__(self, text: str, tree: Any) -> None:
        self.text = text
        self._tree = tree

    def evaluate(self, row: dict[str, Any], prev: dict[str, Any] | None = None) -> bool:
        """True when the step `row` (with the step before it, `prev`) satisfies the condition."""
        return bool(self._eval(self._tree, row, prev))

    def fields(self) -> set[str]:
        """Field names the condition reads (without the `prev.` prefix)."""
        out: set[str] = set()

        def walk(t: Any) -> None:
            if isinstance(t, _Operand):
                if t.kind != "lit":
                    out.add(t.value)
            elif isinstance(t, tuple):
                for x in t[1:]:
                    walk(x)

        walk(self._tree)
        return out

    def _eval(self, t: Any, row: dict[str, Any], prev: dict[str, Any] | None) -> bool:
        if isinstance(t, _Operand):
            v = t.get(row, prev)
            return v is not _Missing and v is not None and bool(v)
        op: str = t[0]  # an inner node: (op, left, right), or ("not", operand)
        if op == "and":
            return self._eval(t[1], row, prev) and self._eval(t[2], row, prev)
        if op == "or":
            return self._eval(t[1], row, prev) or self._eval(t[2], row, prev)
        if op == "not":
            return not self._eval(t[1], row, prev)
        a, b = t[1].get(row, prev), t[2].get(row, prev)
        if a is _Missing or b is _Missing or a is None or b is None:
            return False
        if isinstance(a, str) != isinstance(b, str):
            return op == "!="
        return _OPS[op](a, b)

    def __repr__(self) -> str:
        return f"Condition({self.text!r})"


def parse_condition(text: str, known_fields: Iterable[str] | None = None) -> Condition:
    """Parse `text`; with `known_fields`, a name that is neither a field nor a literal is an error."""
    if not isinstance(text, str) or not text.strip():
        raise ConditionError("empty condition")
    if len(text) > _MAX_LEN:
        raise ConditionError(f"condition longer than {_MAX_LEN} characters")
    toks = _tokenize(text)
    known = None if known_fields is None else set(known_fields)
    p = _Parser(toks, known, text)
    tree = p.parse_or()
    if p.i != len(toks):
        raise ConditionError(f"unexpected {toks[p.i][1]!r} in condition {text!r}")
    return Condition(text, tree)


def _tokenize(text: str) -> list[tuple[str, str]]:
    toks: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            bad = text[pos:].strip()[:1]
            raise ConditionError(f"unexpected character {bad!r} at column {pos + 1} in condition {text!r}")
        num, s, op, name = m.groups()
        if num is not None:
            toks.append(("int", num))
        elif s is not None:
            toks.append(("str", s[1:-1]))
        elif op is not None:
            toks.append(("op", op))
        else:
            toks.append(("kw" if name in _KEYWORDS else "name", name))
        pos = m.end()
    return toks


class _Parser:
    def __init__(self, toks: list[tuple[str, str]], known: set[str] | None, text: str) -> None:
        self.toks, self.known, self.text, self.i = toks, known, text, 0

    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> tuple[str, str]:
        t = self.peek()
        if t is None:
            raise ConditionError(f"condition {self.text!r} ends too early")
        self.i += 1
        return t

    def parse_or(self) -> Any:
        left = self.parse_and()
        while self.peek() == ("kw", "or"):
            self.i += 1
            left = ("or", left, self.parse_and())
        return left

    def parse_and(self) -> Any:
        left = self.parse_not()
        while self.peek() == ("kw", "and"):
            self.i += 1
            left = ("and", left, self.parse_not())
        return left

    def parse_not(self) -> Any:
        if self.peek() == ("kw", "not"):
            self.i += 1
            return ("not", self.parse_not())
        return self.parse_atom()

    def parse_atom(self) -> Any:
        if self.peek() == ("op", "("):
            self.i += 1
            inner = self.parse_or()
            if self.take() != ("op", ")"):
                raise ConditionError(f"missing ')' in condition {self.text!r}")
            return inner
        left = self.operand()
        t = self.peek()
        if t is not None and t[0] == "op" and t[1] in _OPS:
            self.i += 1
            return (t[1], left, self.operand())
        return left

    def operand(self) -> _Operand:
        kind, v = self.take()
        if kind == "int":
            return _Operand("lit", int(v))
        if kind == "str":
            return _Operand("lit", v)
        if kind != "name":
            raise ConditionError(f"expected a field or a value, found {v!r} in condition {self.text!r}")
        if v.startswith("prev."):
            return _Operand("prev", self._field(v[5:]))
        if v in _LITERALS and (self.known is None or v not in self.known):
            return _Operand("lit", _LITERALS[v])
        if v.upper() in _LITERALS and v.upper() in {m.value for m in ForwardMode}:
            return _Operand("lit", v.upper())
        return _Operand("field", self._field(v))

    def _field(self, name: str) -> str:
        if "." in name:
            raise ConditionError(f"unknown name {name!r} in condition {self.text!r} (only prev.FIELD has a dot)")
        if self.known is not None and name not in self.known:
            near = ", ".join(sorted(self.known)[:12])
            raise ConditionError(f"unknown field {name!r} in condition {self.text!r} (fields: {near}, ...)")
        return name
