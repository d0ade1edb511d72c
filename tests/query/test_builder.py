"""QueryBuilder: AWorld's chains, precedence, and errors that say what and where."""

from __future__ import annotations

import pytest

from expstore.errors import QueryError
from expstore.query import And, Comparison, Or, QueryBuilder


def eq(field: str, value: object) -> Comparison:
    return Comparison(field, "eq", value)


def test_aworld_readme_nested_example_builds_verbatim() -> None:
    query = (
        QueryBuilder()
        .eq("exp_meta.task_id", "123")
        .and_()
        .nested(QueryBuilder().eq("exp_meta.agent_id", "111").or_().eq("exp_meta.agent_id", "222"))
        .build()
    )
    assert query == And(
        (
            eq("exp_meta.task_id", "123"),
            Or((eq("exp_meta.agent_id", "111"), eq("exp_meta.agent_id", "222"))),
        )
    )


def test_aworld_simple_and_complex_examples_build_verbatim() -> None:
    assert QueryBuilder().eq("exp_meta.task_id", "123").build() == eq("exp_meta.task_id", "123")
    query = (
        QueryBuilder().eq("exp_meta.task_id", "123").and_().eq("exp_meta.agent_id", "456").build()
    )
    assert query == And((eq("exp_meta.task_id", "123"), eq("exp_meta.agent_id", "456")))


def test_and_binds_tighter_than_or() -> None:
    query = QueryBuilder().eq("step", 1).or_().eq("step", 2).and_().eq("step", 3).build()
    assert query == Or((eq("step", 1), And((eq("step", 2), eq("step", 3)))))


def test_and_binds_tighter_than_or_on_the_left_too() -> None:
    query = QueryBuilder().eq("step", 1).and_().eq("step", 2).or_().eq("step", 3).build()
    assert query == Or((And((eq("step", 1), eq("step", 2))), eq("step", 3)))


def test_chain_of_ands_is_one_flat_and() -> None:
    query = QueryBuilder().eq("step", 1).and_().eq("step", 2).and_().eq("step", 3).build()
    assert query == And((eq("step", 1), eq("step", 2), eq("step", 3)))


def test_nested_groups_keep_their_parentheses() -> None:
    inner = QueryBuilder().eq("step", 1).or_().eq("step", 2)
    query = QueryBuilder().nested(inner).and_().eq("step", 3).build()
    assert query == And((Or((eq("step", 1), eq("step", 2))), eq("step", 3)))
    assert str(query) == "(step = 1 OR step = 2) AND step = 3"


def test_nesting_to_depth_four() -> None:
    builder = QueryBuilder().eq("step", 0)
    for depth in range(1, 4):
        builder = QueryBuilder().eq("step", depth).or_().nested(builder)
    assert str(builder.build()) == "step = 3 OR (step = 2 OR (step = 1 OR step = 0))"


def test_nested_accepts_a_built_condition() -> None:
    inner = QueryBuilder().eq("step", 1).or_().eq("step", 2).build()
    assert QueryBuilder().nested(inner).build() == inner


def test_every_operator_method_builds_its_comparison() -> None:
    built = (
        QueryBuilder()
        .eq("step", 1).and_().ne("step", 2).and_().gt("step", 3).and_().gte("step", 4)
        .and_().lt("step", 5).and_().lte("step", 6).and_().in_("step", [7, 8])
        .and_().not_in("step", [9]).and_().like("task_id", "t%").and_().not_like("task_id", "x_")
        .and_().between("step", 1, 9).and_().is_null("pre_agent").and_().is_not_null("pre_agent")
        .build()
    )  # fmt: skip
    assert isinstance(built, And)
    ops = [c.op for c in built.conditions if isinstance(c, Comparison)]
    assert ops == [
        "eq", "ne", "gt", "gte", "lt", "lte", "in", "not_in",
        "like", "not_like", "between", "is_null", "is_not_null",
    ]  # fmt: skip


def test_builder_is_mutable_like_aworlds_so_unchained_calls_count() -> None:
    qb = QueryBuilder()
    qb.eq("task_id", "t1")
    qb.and_()
    qb.eq("agent_id", "a1")
    assert qb.build() == And((eq("task_id", "t1"), eq("agent_id", "a1")))
    assert qb.build() == qb.build()


def test_build_of_empty_chain_says_there_is_no_condition() -> None:
    with pytest.raises(QueryError, match=r"the chain has no condition; add one"):
        QueryBuilder().build()


def test_two_conditions_without_operator_name_both_calls() -> None:
    with pytest.raises(QueryError) as info:
        QueryBuilder().eq("task_id", "t1").eq("agent_id", "a1")
    assert str(info.value) == (
        "eq('agent_id', 'a1') (call 2) follows eq('task_id', 't1') (call 1) with no operator "
        "between them; put .and_() or .or_() between the two conditions"
    )


def test_operator_at_start_is_refused_at_that_call() -> None:
    with pytest.raises(QueryError) as info:
        QueryBuilder().and_()
    assert str(info.value).startswith(
        "and_() (call 1) starts the chain; a chain starts with a condition"
    )


def test_operator_at_end_is_refused_by_build_with_its_position() -> None:
    with pytest.raises(QueryError) as info:
        QueryBuilder().eq("step", 1).and_().eq("step", 2).or_().build()
    assert str(info.value) == (
        "QueryBuilder.build(): the chain ends with or_() (call 4); "
        "add a condition after it, or remove it"
    )


def test_two_operators_in_a_row_are_refused() -> None:
    with pytest.raises(QueryError) as info:
        QueryBuilder().eq("step", 1).and_().or_()
    assert str(info.value) == (
        "or_() (call 3) follows and_() (call 2); put a condition between two operators"
    )


def test_nested_empty_builder_is_refused_with_its_position() -> None:
    with pytest.raises(QueryError) as info:
        QueryBuilder().eq("step", 1).and_().nested(QueryBuilder())
    assert str(info.value).startswith("nested() (call 3) got an empty QueryBuilder")


def test_malformed_nested_builder_reports_where_it_was_nested() -> None:
    with pytest.raises(QueryError) as info:
        QueryBuilder().nested(QueryBuilder().eq("step", 1).and_())
    assert str(info.value).startswith(
        "in the builder given to nested() (call 1): "
        "QueryBuilder.build(): the chain ends with and_() (call 2)"
    )


def test_nested_of_something_else_is_refused() -> None:
    with pytest.raises(
        QueryError, match=r"nested\(\) \(call 1\) takes a QueryBuilder or a Condition; .*got int"
    ):
        QueryBuilder().nested(3)  # type: ignore[arg-type]


def test_bad_field_in_chain_names_the_call_and_position() -> None:
    with pytest.raises(QueryError, match=r"^eq\('nope', 1\) \(call 3\): unknown field 'nope'"):
        QueryBuilder().eq("step", 1).and_().eq("nope", 1)


def test_failed_call_leaves_the_chain_as_it_was() -> None:
    qb = QueryBuilder().eq("step", 1)
    with pytest.raises(QueryError):
        qb.eq("step", 2)
    assert qb.build() == eq("step", 1)


def test_query_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        QueryBuilder().build()


def test_repr_shows_the_chain() -> None:
    assert repr(QueryBuilder().eq("step", 1).and_()) == "QueryBuilder().eq('step', 1).and_()"
