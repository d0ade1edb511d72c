"""Conditions: immutable, readable, AWorld's dict shape both ways, validated once."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
import pytest
from pydantic import BaseModel

from expstore import DataRow, Experience, ExpMeta
from expstore.errors import QueryError
from expstore.query import And, Comparison, Condition, Or, QueryBuilder, as_condition

# What AWorld's QueryBuilder returns for `(task_id = "123" and agent_id = "111") or
# (task_id = "456" and agent_id = "222")`, as its own tests document it.
AWORLD_DICT = {
    "or_": [
        {
            "and_": [
                {"field": "task_id", "value": "123", "op": "eq"},
                {"field": "agent_id", "value": "111", "op": "eq"},
            ]
        },
        {
            "and_": [
                {"field": "task_id", "value": "456", "op": "eq"},
                {"field": "agent_id", "value": "222", "op": "eq"},
            ]
        },
    ]
}


def row(**data: Any) -> DataRow:
    meta = ExpMeta(task_id="t1", agent_id="a1", step=3, pre_agent=None)
    return DataRow(exp_meta=meta, exp_data=Experience(**data), id="r1")


# -- dict shape -----------------------------------------------------------------------------


def test_aworld_dict_loads_and_dumps_back_unchanged() -> None:
    condition = Condition.from_dict(AWORLD_DICT)
    assert str(condition) == (
        "(task_id = '123' AND agent_id = '111') OR (task_id = '456' AND agent_id = '222')"
    )
    assert condition.to_dict() == AWORLD_DICT


def test_aworld_dict_survives_a_json_round_trip() -> None:
    condition = Condition.from_dict(json.loads(json.dumps(AWORLD_DICT)))
    assert Condition.from_dict(json.loads(json.dumps(condition.to_dict()))) == condition


def test_aworld_in_op_and_null_test_without_value_load() -> None:
    condition = Condition.from_dict(
        {
            "and_": [
                {"field": "step", "value": [1, 2], "op": "in"},
                {"field": "pre_agent", "op": "is_null"},
            ]
        }
    )
    assert condition == And((Comparison("step", "in", (1, 2)), Comparison("pre_agent", "is_null")))
    assert condition.to_dict() == {
        "and_": [
            {"field": "step", "value": [1, 2], "op": "in"},
            {"field": "pre_agent", "value": None, "op": "is_null"},
        ]
    }


def test_older_aworld_and_or_keys_and_nested_wrappers_load() -> None:
    condition = Condition.from_dict(
        {
            "and": [
                {"field": "step", "value": 1, "op": "eq"},
                {"nested": {"or": [{"field": "step", "value": 2, "op": "eq"}]}},
            ]
        }
    )
    assert condition == And((Comparison("step", "eq", 1), Or((Comparison("step", "eq", 2),))))


@pytest.mark.parametrize(
    "builder",
    [
        QueryBuilder().between("exp_data.ext_info.v", 1, 2.5),
        QueryBuilder().not_in("exp_data.state.url", []),
        QueryBuilder().like("task_id", "a\\%b_").or_().is_not_null("exp_data.actions.0.name"),
        QueryBuilder().eq("exp_data.done", True).and_().nested(QueryBuilder().lt("id", "m")),
    ],
)
def test_to_dict_from_dict_round_trip(builder: QueryBuilder) -> None:
    condition = builder.build()
    assert Condition.from_dict(condition.to_dict()) == condition


def test_from_dict_rejects_unknown_keys_saying_which() -> None:
    with pytest.raises(
        QueryError, match=r"unexpected keys \['extra'\]; a comparison has field, op and value"
    ):
        Condition.from_dict({"field": "step", "value": 1, "op": "eq", "extra": 1})


def test_from_dict_rejects_empty_logical_list_with_its_path() -> None:
    with pytest.raises(
        QueryError, match=r"^condition.and_\[1\].or_: the list of conditions is empty"
    ):
        Condition.from_dict({"and_": [{"field": "step", "value": 1, "op": "eq"}, {"or_": []}]})


def test_from_dict_rejects_unknown_operator_listing_the_valid_ones() -> None:
    with pytest.raises(
        QueryError, match=r"unknown operator 'contains'; expected one of eq, ne, gt"
    ):
        Condition.from_dict({"field": "step", "value": 1, "op": "contains"})


def test_from_dict_rejects_a_comparison_without_value() -> None:
    with pytest.raises(QueryError, match=r"the 'eq' comparison on 'step' has no value"):
        Condition.from_dict({"field": "step", "op": "eq"})


def test_from_dict_rejects_shapeless_dicts() -> None:
    with pytest.raises(QueryError, match=r"expected a comparison .* got keys \['foo'\]"):
        Condition.from_dict({"foo": 1})


def test_as_condition_accepts_condition_dict_and_none() -> None:
    condition = Comparison("step", "eq", 1)
    assert as_condition(condition) is condition
    assert as_condition(condition.to_dict()) == condition
    assert as_condition(None) is None


def test_as_condition_rejects_a_builder_saying_to_build_it() -> None:
    with pytest.raises(QueryError, match=r"got QueryBuilder; call .build\(\) on the QueryBuilder"):
        as_condition(QueryBuilder().eq("step", 1))  # type: ignore[arg-type]


def test_as_condition_rejects_other_types() -> None:
    with pytest.raises(QueryError, match=r"must be a Condition .* or None; got str"):
        as_condition("step = 1")  # type: ignore[arg-type]


# -- immutability and display -------------------------------------------------------------


def test_conditions_are_frozen_and_hashable() -> None:
    condition = QueryBuilder().in_("step", [1, 2]).and_().eq("task_id", "t").build()
    assert isinstance(condition, And)
    with pytest.raises(dataclasses.FrozenInstanceError):
        condition.conditions = ()  # type: ignore[misc]
    first = condition.conditions[0]
    assert isinstance(first, Comparison)
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.value = (3,)  # type: ignore[misc]
    assert first.value == (1, 2)  # the list became a tuple
    assert hash(condition) == hash(
        QueryBuilder().in_("step", [1, 2]).and_().eq("task_id", "t").build()
    )


def test_str_reads_like_a_where_clause() -> None:
    condition = (
        QueryBuilder()
        .eq("task_id", "it's")
        .and_()
        .nested(QueryBuilder().in_("step", [1, 2]).or_().is_null("pre_agent"))
        .and_()
        .between("exp_data.ext_info.v", 0.5, 2)
        .or_()
        .not_like("agent_id", "a%")
        .and_()
        .ne("exp_data.done", False)
        .build()
    )
    assert str(condition) == (
        "(task_id = 'it''s' AND (step IN (1, 2) OR pre_agent IS NULL) AND "
        "exp_data.ext_info.v BETWEEN 0.5 AND 2) OR "
        "(agent_id NOT LIKE 'a%' AND exp_data.done != FALSE)"
    )


# -- validation ------------------------------------------------------------------------------


def test_unknown_field_lists_the_valid_fields() -> None:
    with pytest.raises(QueryError) as info:
        QueryBuilder().eq("exp_meta.taskid", "t")
    message = str(info.value)
    assert "unknown field 'exp_meta.taskid'; the valid fields are id, exp_meta.task_id, " in message
    assert "exp_data.done (or their bare names, such as task_id)" in message
    assert "paths into exp_data.state, exp_data.actions, exp_data.messages" in message


def test_unknown_payload_field_is_an_unknown_field() -> None:
    with pytest.raises(QueryError, match=r"unknown field 'exp_data.observation.x'"):
        Comparison("exp_data.observation.x", "eq", 1)


def test_path_into_a_column_is_refused() -> None:
    with pytest.raises(
        QueryError, match=r"exp_data.reward_t is a column holding a single number, with no path"
    ):
        Comparison("exp_data.reward_t.x", "eq", 1)


def test_field_names_must_be_strings() -> None:
    with pytest.raises(QueryError, match=r"a field name must be a string .* got 3 \(int\)"):
        Comparison(3, "eq", 1)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "message"),
    [
        ("exp_data.state..x", "has an empty path segment"),
        ('exp_data.state.a"b', "holds a double quote"),
        ("exp_data.actions.99999999999", "list index 99999999999 is too large"),
    ],
)
def test_bad_json_paths_are_refused(field: str, message: str) -> None:
    with pytest.raises(QueryError, match=message):
        Comparison(field, "eq", 1)


def test_column_value_of_the_wrong_type_is_refused() -> None:
    with pytest.raises(QueryError) as info:
        Comparison("exp_meta.step", "eq", "5")
    assert str(info.value) == (
        "eq() on 'exp_meta.step': that field holds numbers, so it cannot match '5' (str); "
        "compare it with an int or a float"
    )


@pytest.mark.parametrize(
    ("op", "value", "message"),
    [
        ("eq", None, r"got None; comparisons with null never match, so test for it with is_null"),
        ("eq", float("nan"), r"got nan; only finite numbers can be compared"),
        ("eq", {"a": 1}, r"compares with a str, int, float or bool; got \{'a': 1\} \(dict\)"),
        ("gt", True, r"orders numbers or strings; got the bool True"),
        ("in", "abc", r"takes a list of values; got 'abc' \(str\)"),
        ("in", [1, "a"], r"takes values of one type"),
        ("between", [1], r"takes exactly two bounds, low and high; got 1"),
        ("between", [1, "z"], r"takes two bounds of one type"),
        ("like", 5, r"takes a string pattern such as 'web_%'; got 5 \(int\)"),
        ("like", "ab\\", r"ends with the escape character"),
        ("is_null", 1, r"takes no value; got 1"),
        ("eq", "a\x00b", r"cannot hold NUL"),
        ("eq", 2**64, r"beyond the 64-bit integer range"),
    ],
)
def test_bad_values_are_refused_with_what_to_do(op: str, value: object, message: str) -> None:
    with pytest.raises(QueryError, match=message):
        Comparison("exp_data.ext_info.v", op, value)


# -- matches() -------------------------------------------------------------------------------


class Page(BaseModel):
    url: str
    tags: tuple[str, ...]


def test_matches_reads_columns() -> None:
    r = row(reward_t=1.5, done=True)
    assert QueryBuilder().eq("task_id", "t1").and_().gt("exp_data.reward_t", 1).build().matches(r)
    assert QueryBuilder().eq("exp_data.done", True).build().matches(r)
    assert QueryBuilder().eq("id", "r1").build().matches(r)
    assert not QueryBuilder().ne("exp_meta.pre_agent", "x").build().matches(r)
    assert QueryBuilder().is_null("pre_agent").build().matches(r)


def test_matches_sees_pydantic_models_as_dumps_and_tuples_as_lists() -> None:
    r = row(state=Page(url="https://x", tags=("a", "b")))
    assert QueryBuilder().eq("exp_data.state.url", "https://x").build().matches(r)
    assert QueryBuilder().eq("exp_data.state.tags.1", "b").build().matches(r)


def test_matches_is_type_aware() -> None:
    r = row(ext_info={"n": 1, "s": "1", "b": True})
    assert QueryBuilder().eq("exp_data.ext_info.n", 1.0).build().matches(r)
    assert not QueryBuilder().eq("exp_data.ext_info.s", 1).build().matches(r)
    assert not QueryBuilder().ne("exp_data.ext_info.s", 1).build().matches(r)
    assert not QueryBuilder().eq("exp_data.ext_info.b", 1).build().matches(r)
    assert QueryBuilder().eq("exp_data.ext_info.b", True).build().matches(r)


def test_matches_null_semantics() -> None:
    r = row(ext_info={"none": None})
    for field in (
        "exp_data.ext_info.none",
        "exp_data.ext_info.missing",
        "exp_data.state.deeper.still",
    ):
        assert QueryBuilder().is_null(field).build().matches(r)
        assert not QueryBuilder().is_not_null(field).build().matches(r)
        assert not QueryBuilder().ne(field, 1).build().matches(r)
        assert not QueryBuilder().not_in(field, [1]).build().matches(r)
        assert not QueryBuilder().not_in(field, []).build().matches(r)
        assert not QueryBuilder().not_like(field, "x").build().matches(r)


def test_in_empty_matches_nothing_and_not_in_empty_every_non_null_value() -> None:
    r = row(ext_info={"d": {"k": 1}})
    assert not QueryBuilder().in_("exp_data.ext_info.d", []).build().matches(r)
    assert QueryBuilder().not_in("exp_data.ext_info.d", []).build().matches(r)


def test_matches_like_is_case_sensitive_with_escapes() -> None:
    r = row(ext_info={"s": "100% Sure_thing"})
    assert QueryBuilder().like("exp_data.ext_info.s", "100\\% S%\\_t_ing").build().matches(r)
    assert not QueryBuilder().like("exp_data.ext_info.s", "100\\% s%").build().matches(r)
    assert not QueryBuilder().like("exp_data.ext_info.s", "100\\_%").build().matches(r)


def test_tensors_and_non_finite_floats_never_compare() -> None:
    r = row(ext_info={"arr": np.zeros(2), "nan": float("nan")})
    assert not QueryBuilder().ne("exp_data.ext_info.nan", 1.0).build().matches(r)
    assert QueryBuilder().is_not_null("exp_data.ext_info.nan").build().matches(r)
    assert not QueryBuilder().eq("exp_data.ext_info.arr.0", 0).build().matches(r)
    assert QueryBuilder().is_not_null("exp_data.ext_info.arr").build().matches(r)


def test_digit_segments_index_lists_only() -> None:
    r = row(ext_info={"0": "key", "list": ["item"]})
    assert not QueryBuilder().is_not_null("exp_data.ext_info.0").build().matches(r)
    assert QueryBuilder().eq("exp_data.ext_info.list.0", "item").build().matches(r)
    assert not QueryBuilder().is_not_null("exp_data.ext_info.list.1").build().matches(r)
