"""The --where language parses into the same Conditions QueryBuilder builds, safely."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from expstore import QueryError
from expstore.query import And, Comparison, Condition, Or, QueryBuilder, parse_where


def test_comparison_operators_map_to_condition_ops() -> None:
    ops = {"=": "eq", "!=": "ne", "<>": "ne", ">": "gt", ">=": "gte", "<": "lt", "<=": "lte"}
    for text, op in ops.items():
        assert parse_where(f"step {text} 3") == Comparison("step", op, 3)


def test_the_issue_example_parses_into_the_expected_tree() -> None:
    got = parse_where(
        "task_id = 't1' and (agent_id in ('a', 'b') or step >= 3) "
        "and exp_data.state.url like '%login%'"
    )
    assert got == And(
        (
            Comparison("task_id", "eq", "t1"),
            Or((Comparison("agent_id", "in", ("a", "b")), Comparison("step", "gte", 3))),
            Comparison("exp_data.state.url", "like", "%login%"),
        )
    )


def test_and_binds_tighter_than_or_unlike_aworlds_left_to_right_fold() -> None:
    got = parse_where("step = 1 or step = 2 and done = true")
    assert got == Or(
        (
            Comparison("step", "eq", 1),
            And((Comparison("step", "eq", 2), Comparison("done", "eq", True))),
        )
    )


def test_keywords_are_case_insensitive() -> None:
    assert parse_where("step BETWEEN 1 AND 2 Or reward_t IS NOT NULL") == Or(
        (Comparison("step", "between", (1, 2)), Comparison("reward_t", "is_not_null"))
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("task_id not in ('a')", Comparison("task_id", "not_in", ("a",))),
        ("step in ()", Comparison("step", "in", ())),
        ("exp_data.state.url not like 'x%'", Comparison("exp_data.state.url", "not_like", "x%")),
        ("pre_agent is null", Comparison("pre_agent", "is_null")),
        ("done = false", Comparison("done", "eq", False)),
        ("reward_t > -0.5", Comparison("reward_t", "gt", -0.5)),
        ("reward_t < 1e-3", Comparison("reward_t", "lt", 0.001)),
        ("task_id = 'it''s'", Comparison("task_id", "eq", "it's")),
        ("exp_data.actions.0.name = 'click'", Comparison("exp_data.actions.0.name", "eq", "click")),
        ('"exp_data.ext_info.my-key" = 1', Comparison("exp_data.ext_info.my-key", "eq", 1)),
    ],
)
def test_each_form_of_comparison_parses(text: str, expected: Condition) -> None:
    assert parse_where(text) == expected


def test_empty_text_means_no_condition() -> None:
    assert parse_where("   ") is None


def test_matches_what_query_builder_builds() -> None:
    built = (
        QueryBuilder()
        .eq("exp_meta.task_id", "t1")
        .and_()
        .nested(QueryBuilder().eq("exp_meta.agent_id", "a").or_().eq("exp_meta.agent_id", "b"))
        .build()
    )
    parsed = parse_where(
        "exp_meta.task_id = 't1' and (exp_meta.agent_id = 'a' or exp_meta.agent_id = 'b')"
    )
    assert parsed is not None
    assert parsed.to_dict() == built.to_dict()


def _error(text: str) -> str:
    with pytest.raises(QueryError) as info:
        parse_where(text)
    return str(info.value)


def test_a_missing_value_is_reported_at_its_column_with_a_caret() -> None:
    assert _error("task_id = and step > 1") == (
        "column 11: expected a value after '=', got 'and'\n  task_id = and step > 1\n            ^"
    )


@pytest.mark.parametrize(
    ("text", "column", "words"),
    [
        ("task_id = 't1", 11, "unterminated string"),
        ("(step > 1", 1, "never closed"),
        ("step > 1)", 9, "unmatched ')'"),
        ("foo = 1", 1, "unknown field 'foo'"),
        ("step = null", 8, "is null"),
        ("not step = 1", 1, "NOT before a condition is not supported"),
        ("task_id = t1", 11, "quote strings"),
        ("step in (1, 2", 14, "expected ',' or ')'"),
        ("task_id = 1", 1, "cannot match 1"),
        ("step ~ 3", 6, "unexpected character '~'"),
        ("in = 3", 1, "must be double-quoted"),
        ("step between 1 or 2", 16, "expected and between the two bounds"),
        ("step", 5, "expected an operator"),
        ("step = 1 step", 10, "expected and, or or the end"),
    ],
)
def test_errors_name_the_column_where_they_happen(text: str, column: int, words: str) -> None:
    message = _error(text)
    first, shown, caret = message.split("\n")
    assert first.startswith(f"column {column}: ")
    assert words in first
    assert shown == f"  {text}"
    assert caret == "  " + " " * (column - 1) + "^"


def test_nothing_in_the_text_is_evaluated() -> None:
    message = _error("__import__('os').system('true') = 1")
    assert "column" in message


# -- round trip: str(condition) is valid --where text --------------------------------------

_fields = st.sampled_from(
    ["task_id", "exp_meta.agent_id", "exp_data.state.url", "exp_data.actions.0.name"]
)
_numbers = st.sampled_from(["step", "reward_t", "exp_data.ext_info.version"])
_text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8)
_finite = st.floats(allow_nan=False, allow_infinity=False, width=64) | st.integers(-(2**62), 2**62)


def _comparisons() -> st.SearchStrategy[Condition]:
    strings = st.builds(
        lambda f, op, v: Comparison(f, op, v),
        _fields,
        st.sampled_from(["eq", "ne", "gt", "lte"]),
        _text,
    )
    numbers = st.builds(
        lambda f, op, v: Comparison(f, op, v),
        _numbers,
        st.sampled_from(["eq", "gte", "lt"]),
        _finite,
    )
    lists = st.builds(
        lambda f, op, v: Comparison(f, op, tuple(v)),
        _fields,
        st.sampled_from(["in", "not_in"]),
        st.lists(_text, max_size=3),
    )
    between = st.builds(
        lambda f, a, b: Comparison(f, "between", (a, b)), _numbers, _finite, _finite
    )
    likes = st.builds(
        lambda f, op, v: Comparison(f, op, v),
        _fields,
        st.sampled_from(["like", "not_like"]),
        st.text(alphabet="ab%_'", max_size=6),
    )
    nulls = st.builds(
        lambda f, op: Comparison(f, op), _fields, st.sampled_from(["is_null", "is_not_null"])
    )
    bools = st.builds(lambda v: Comparison("done", "eq", v), st.booleans())
    return strings | numbers | lists | between | likes | nulls | bools


_conditions = st.recursive(
    _comparisons(),
    lambda children: (
        st.builds(lambda cs: And(tuple(cs)), st.lists(children, min_size=2, max_size=3))
        | st.builds(lambda cs: Or(tuple(cs)), st.lists(children, min_size=2, max_size=3))
    ),
    max_leaves=8,
)


@settings(max_examples=150, deadline=None)
@given(_conditions)
def test_str_of_any_condition_parses_back_to_it(condition: Condition) -> None:
    assert parse_where(str(condition)) == condition


@pytest.mark.parametrize(
    "text",
    [
        "task_id = 't1'",
        "step >= 3 and (agent_id in ('a', 'b') or exp_data.state.url like '%x%')",
        "reward_t is not null or done = true",
    ],
)
def test_condition_parse_is_the_where_language_from_python(text: str) -> None:
    condition = Condition.parse(text)
    assert condition is not None and condition == parse_where(text)
    assert Condition.parse(str(condition)) == condition


def test_condition_parse_of_blank_text_is_none_and_a_mistake_shows_a_caret() -> None:
    assert Condition.parse("  ") is None
    with pytest.raises(QueryError, match=r"column 11: .*\n.*\n +\^"):
        Condition.parse("task_id = and step > 1")
