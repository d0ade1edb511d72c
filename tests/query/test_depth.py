"""One depth limit for and/or nesting, however a condition is built, with a QueryError."""

from __future__ import annotations

import pytest

from expstore import Condition, QueryBuilder, QueryError
from expstore.query.conditions import MAX_CONDITION_DEPTH, And


def nested_builder(levels: int) -> QueryBuilder:
    builder = QueryBuilder().eq("exp_meta.step", 0)
    for _ in range(levels):
        builder = QueryBuilder().nested(builder).and_().eq("exp_meta.agent_id", "a")
    return builder


def test_the_limit_is_a_hundred_levels() -> None:
    assert MAX_CONDITION_DEPTH == 100
    condition = nested_builder(MAX_CONDITION_DEPTH).build()
    assert isinstance(condition, And) and condition.depth == MAX_CONDITION_DEPTH
    assert Condition.from_dict(condition.to_dict()) == condition  # every path at the limit
    assert Condition.parse(str(condition)) == condition


@pytest.mark.parametrize("levels", [MAX_CONDITION_DEPTH + 1, 199, 3000])
def test_deeper_builders_raise_a_query_error(levels: int) -> None:
    with pytest.raises(QueryError, match="nest more than 100 levels"):
        nested_builder(levels).build()


def test_a_deep_dict_raises_a_query_error_naming_where() -> None:
    data: dict = {"field": "exp_meta.step", "op": "eq", "value": 0}
    for _ in range(3000):
        data = {"and_": [data]}
    with pytest.raises(QueryError, match=r"condition\.and_\[0\].*nest more than 100 levels"):
        Condition.from_dict(data)
    nested: dict = {"field": "exp_meta.step", "op": "eq", "value": 0}
    for _ in range(3000):
        nested = {"nested": nested}
    with pytest.raises(QueryError, match="nest more than 100 levels"):
        Condition.from_dict(nested)


def test_deep_parentheses_in_where_text_point_at_the_column() -> None:
    with pytest.raises(QueryError, match="column 101: parentheses nest more than 100 deep"):
        Condition.parse("(" * 3000 + "step = 0" + ")" * 3000)
    assert Condition.parse("(" * 100 + "step = 0" + ")" * 100) == Condition.parse("step = 0")


def test_a_nested_call_is_named_without_the_whole_condition() -> None:
    builder = QueryBuilder().nested(nested_builder(50)).and_()
    with pytest.raises(QueryError, match=r"ends with and_\(\)"):
        builder.build()
