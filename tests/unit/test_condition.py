"""The condition language of searches and breakpoints (tracer/condition.py): what parses, what it means, and
that nothing is ever evaluated as Python."""

from __future__ import annotations

import pytest
from specscope.tracer.condition import ConditionError, parse_condition
from specscope.tracer.query import StepFilter

ROW = {"mode": "TARGET_VERIFY", "bs": 8, "padded_bs": 8, "T": 4, "K": 4, "graph": "replay", "model": "target",
       "step_id": None, "errors": 0, "max_seq_len_q": 4, "iteration": 12}  # fmt: skip
PREV = {"mode": "DRAFT_DECODE", "bs": 6, "graph": "replay", "model": "draft", "errors": 2}


@pytest.mark.parametrize("text, want", [
    ("mode == TARGET_VERIFY", True),
    ("mode == target_verify", True),  # mode literals are case-insensitive
    ("mode != TARGET_VERIFY", False),
    ("bs != prev.bs", True),
    ("mode == TARGET_VERIFY and bs != prev.bs", True),
    ("bs > 8 or T == 4", True),
    ("bs > 8 or T == 5", False),
    ("not bs > 8", True),
    ("not (bs >= 8 and T <= 4)", False),
    ("bs >= 8 and T < 4 or K == 4", True),  # and binds tighter than or
    ("bs >= 8 and (T < 4 or K == 5)", False),
    ("graph == replay and model == target", True),
    ("graph == 'replay'", True),
    ('model == "draft"', False),
    ("prev.errors", True),  # a bare operand is true when non-zero
    ("errors", False),
    ("step_id", False),  # None is false
    ("step_id == 0", False),  # None compares false
    ("missing_field == 3", False),  # a field a step lacks compares false
    ("missing_field != 3", False),
    ("mode == 3", False),  # text against a number: only != holds
    ("mode != 3", True),
    ("max_seq_len_q == T", True),  # step scalars by their own names
    ("iteration >= 12 and iteration <= 12", True),
    ("true", True),
    ("false or bs == 8", True),
])  # fmt: skip
def test_valid_conditions(text: str, want: bool) -> None:
    assert parse_condition(text).evaluate(ROW, PREV) is want


def test_prev_without_a_previous_step_is_false() -> None:
    c = parse_condition("bs != prev.bs")
    assert c.evaluate(ROW, None) is False
    assert c.fields() == {"bs"}


@pytest.mark.parametrize("text", [
    "", "   ", "bs ==", "== 3", "(bs == 3", "bs == 3)", "bs = 3", "bs === 3", "bs == 3 and", "and", "not",
    "bs; 3", "bs == 3 # comment", "1 + 2", "bs == [1]", "prev.a.b == 1", "a.b == 1", "bs == 3 bs == 4",
    "__import__('os').system('true')", "exec('x')", "lambda: 1", "bs if 1 else 2", "'unterminated",
    "x" * 600,
])  # fmt: skip
def test_invalid_conditions_are_one_line_errors(text: str) -> None:
    with pytest.raises(ConditionError) as e:
        parse_condition(text)
    assert "\n" not in str(e.value) and str(e.value)


def test_never_evaluated_as_python(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    def boom(*a: object, **k: object) -> None:
        raise AssertionError("eval/exec was called")

    monkeypatch.setattr(builtins, "eval", boom)
    monkeypatch.setattr(builtins, "exec", boom)
    monkeypatch.setattr(builtins, "compile", boom)
    assert parse_condition("bs == 8 and not (T > 4)").evaluate(ROW) is True
    with pytest.raises(ConditionError):
        parse_condition("__import__('os')")


def test_known_fields_are_enforced() -> None:
    assert parse_condition("bs == 3", known_fields={"bs"}).text == "bs == 3"
    with pytest.raises(ConditionError, match="unknown field 'nope'"):
        parse_condition("nope == 3", known_fields={"bs"})
    with pytest.raises(ConditionError, match="unknown field"):
        parse_condition("prev.nope == 3", known_fields={"bs"})


@pytest.mark.parametrize("text, want", [
    ("request 12", StepFilter(request_id=12)), ("r12", StepFilter(request_id=12)),
    ("req 7", StepFilter(request_id=7)), ("I6", StepFilter(check_id="I6")), ("i21", StepFilter(check_id="I21")),
    ("verify", StepFilter(mode="TARGET_VERIFY")), ("DRAFT_EXTEND", StepFilter(mode="DRAFT_EXTEND")),
    ("prefill", StepFilter(mode="EXTEND")), ("replay", StepFilter(graph="replay")),
    ("violations", StepFilter(has_violation=True)), ("errors", StepFilter(severity="error")),
    ("warning", StepFilter(severity="warning")), ("bs change", StepFilter(bs_change=True)),
    ("bs > 4", StepFilter(condition="bs > 4")),
])  # fmt: skip
def test_search_box_texts(text: str, want: StepFilter) -> None:
    assert StepFilter.parse(text) == want


@pytest.mark.parametrize("text", ["", "   ", "bs >", "what is this", "r 12 13"])
def test_bad_search_box_texts(text: str) -> None:
    with pytest.raises(ConditionError):
        StepFilter.parse(text)
