"""The SQL a condition compiles to: Postgres for the fixed cases, SQLite for its rewrites.

Every value, JSON key and index is a bound parameter; the SQL text holds only column names.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.dialects import postgresql, sqlite

from expstore.db.schema import rows
from expstore.errors import QueryError
from expstore.query import QueryBuilder, to_sql

DIALECTS = {"postgresql": postgresql.dialect(), "sqlite": sqlite.dialect()}


def compiled(builder: QueryBuilder, dialect: str = "postgresql") -> tuple[str, dict[str, Any]]:
    expression = to_sql(builder.build(), rows, dialect)
    assert expression is not None
    result = expression.compile(
        dialect=DIALECTS[dialect], compile_kwargs={"render_postcompile": True}
    )
    return str(result), result.params


def test_column_equality() -> None:
    assert compiled(QueryBuilder().eq("exp_meta.task_id", "t1")) == (
        "expstore_rows.task_id = %(param_1)s::VARCHAR",
        {"param_1": "t1"},
    )


def test_float_against_an_integer_column_is_bound_as_a_float() -> None:
    assert compiled(QueryBuilder().gt("step", 2.5)) == (
        "expstore_rows.step > %(param_1)s",
        {"param_1": 2.5},
    )


def test_string_ordering_uses_code_point_collation() -> None:
    assert compiled(QueryBuilder().lt("agent_id", "m")) == (
        '(expstore_rows.agent_id COLLATE "C") < %(param_1)s::VARCHAR',
        {"param_1": "m"},
    )


def test_in_list() -> None:
    assert compiled(QueryBuilder().in_("agent_id", ["a", "b"])) == (
        "expstore_rows.agent_id IN (%(param_1)s::VARCHAR, %(param_2)s::VARCHAR)",
        {"param_1": "a", "param_2": "b"},
    )


def test_empty_in_is_false() -> None:
    assert compiled(QueryBuilder().in_("agent_id", [])) == ("false", {})


def test_empty_not_in_is_not_null() -> None:
    assert compiled(QueryBuilder().not_in("pre_agent", [])) == (
        "expstore_rows.pre_agent IS NOT NULL",
        {},
    )


def test_like_escapes_with_backslash() -> None:
    assert compiled(QueryBuilder().like("task_id", "50\\%_")) == (
        "expstore_rows.task_id LIKE %(param_1)s::VARCHAR ESCAPE '\\'",
        {"param_1": "50\\%_"},
    )


def test_between() -> None:
    assert compiled(QueryBuilder().between("exp_data.reward_t", 0, 1.5)) == (
        "expstore_rows.reward_t BETWEEN %(param_1)s::BIGINT AND %(param_2)s",
        {"param_1": 0, "param_2": 1.5},
    )


def test_and_or_precedence_needs_no_parentheses() -> None:
    sql, _ = compiled(
        QueryBuilder().eq("task_id", "a").or_().eq("task_id", "b").and_().eq("step", 1)
    )
    assert sql == (
        "expstore_rows.task_id = %(param_1)s::VARCHAR OR "
        "expstore_rows.task_id = %(param_2)s::VARCHAR AND expstore_rows.step = %(param_3)s::BIGINT"
    )


def test_nested_or_inside_and_is_parenthesised() -> None:
    inner = QueryBuilder().eq("agent_id", "a").or_().eq("agent_id", "b")
    sql, _ = compiled(QueryBuilder().eq("task_id", "t").and_().nested(inner))
    assert sql == (
        "expstore_rows.task_id = %(param_1)s::VARCHAR AND "
        "(expstore_rows.agent_id = %(param_2)s::VARCHAR OR "
        "expstore_rows.agent_id = %(param_3)s::VARCHAR)"
    )


def test_json_equality_is_jsonb_equality_which_tells_types_apart() -> None:
    assert compiled(QueryBuilder().eq("exp_data.state.url", "u")) == (
        "((expstore_rows.data -> %(param_1)s::VARCHAR) -> %(param_2)s::VARCHAR) "
        "= %(param_3)s::JSONB",
        {"param_1": "state", "param_2": "url", "param_3": "u"},
    )


def test_json_range_checks_the_type_then_compares_as_jsonb() -> None:
    assert compiled(QueryBuilder().gte("exp_data.ext_info.score", 0.1)) == (
        "jsonb_typeof((expstore_rows.data -> %(param_1)s::VARCHAR) -> %(param_2)s::VARCHAR) "
        "= %(param_3)s::VARCHAR AND ((expstore_rows.data -> %(param_1)s::VARCHAR) -> "
        "%(param_2)s::VARCHAR) >= %(param_4)s::JSONB",
        {"param_1": "ext_info", "param_2": "score", "param_3": "number", "param_4": 0.1},
    )


def test_json_ne_checks_the_type() -> None:
    sql, params = compiled(QueryBuilder().ne("exp_data.ext_info.flag", True))
    assert sql == (
        "jsonb_typeof((expstore_rows.data -> %(param_1)s::VARCHAR) -> %(param_2)s::VARCHAR) "
        "= %(param_3)s::VARCHAR AND ((expstore_rows.data -> %(param_1)s::VARCHAR) -> "
        "%(param_2)s::VARCHAR) != %(param_4)s::JSONB"
    )
    assert params["param_3"] == "boolean" and params["param_4"] is True


def test_json_string_ordering_reads_text_in_code_point_order() -> None:
    assert compiled(QueryBuilder().lt("exp_data.state.url", "m")) == (
        "jsonb_typeof((expstore_rows.data -> %(param_1)s::VARCHAR) -> %(param_2)s::VARCHAR) "
        "= %(param_3)s::VARCHAR AND (((expstore_rows.data -> %(param_1)s::VARCHAR) ->> "
        '%(param_4)s::VARCHAR) COLLATE "C") < %(param_5)s::VARCHAR',
        {
            "param_1": "state",
            "param_2": "url",
            "param_3": "string",
            "param_4": "url",
            "param_5": "m",
        },
    )


def test_json_index_step_is_taken_only_on_an_array() -> None:
    # jsonb -> 0 on a scalar returns the scalar, so the index step checks for an array.
    assert compiled(QueryBuilder().eq("exp_data.actions.0", 1)) == (
        "jsonb_typeof(expstore_rows.data -> %(param_1)s::VARCHAR) = %(param_2)s::VARCHAR AND "
        "((expstore_rows.data -> %(param_1)s::VARCHAR) -> %(param_3)s::INTEGER) "
        "= %(param_4)s::JSONB",
        {"param_1": "actions", "param_2": "array", "param_3": 0, "param_4": 1},
    )


def test_json_is_null_covers_missing_and_null() -> None:
    assert compiled(QueryBuilder().is_null("exp_data.state.url")) == (
        "coalesce(jsonb_typeof((expstore_rows.data -> %(param_1)s::VARCHAR) -> "
        "%(param_2)s::VARCHAR), %(param_3)s::VARCHAR) = %(param_3)s::VARCHAR",
        {"param_1": "state", "param_2": "url", "param_3": "null"},
    )


def test_json_is_not_null() -> None:
    assert compiled(QueryBuilder().is_not_null("exp_data.state")) == (
        "jsonb_typeof(expstore_rows.data -> %(param_1)s::VARCHAR) != %(param_2)s::VARCHAR",
        {"param_1": "state", "param_2": "null"},
    )


# -- SQLite's rewrites -----------------------------------------------------------------------


def test_sqlite_like_becomes_case_sensitive_glob() -> None:
    assert compiled(QueryBuilder().like("task_id", "a*%_[\\%"), "sqlite") == (
        "expstore_rows.task_id GLOB ?",
        {"param_1": "a[*]*?[[]%"},
    )


def test_sqlite_not_like_is_not_glob() -> None:
    assert compiled(QueryBuilder().not_like("task_id", "a%"), "sqlite") == (
        "NOT (expstore_rows.task_id GLOB ?)",
        {"param_1": "a*"},
    )


def test_sqlite_json_path_is_a_literal_and_the_type_is_checked_second() -> None:
    # The path is written into the SQL (an index on json_extract(data, '$.path') serves
    # only the same literal); values stay bound.
    assert compiled(QueryBuilder().gt("exp_data.actions.0.score", 1), "sqlite") == (
        'json_extract(expstore_rows.data, \'$."actions"[0]."score"\') > ? AND '
        'json_type(expstore_rows.data, \'$."actions"[0]."score"\') IN (?, ?)',
        {"param_2": 1, "param_3": "integer", "param_4": "real"},
    )


def test_sqlite_json_path_literals_are_escaped() -> None:
    sql, params = compiled(QueryBuilder().eq("exp_data.state.it's", 1), "sqlite")
    assert sql.startswith("json_extract(expstore_rows.data, '$.\"state\".\"it''s\"') = ?")
    assert params == {"param_2": 1, "param_3": "integer", "param_4": "real"}


def test_sqlite_non_ascii_key_is_tried_under_both_spellings() -> None:
    sql, params = compiled(QueryBuilder().is_not_null("exp_data.state.clé"), "sqlite")
    assert sql == (
        'coalesce(json_type(expstore_rows.data, \'$."state"."cl\\u00e9"\'), '
        'json_type(expstore_rows.data, \'$."state"."clé"\')) != ?'
    )
    assert params == {"param_3": "null"}


def test_none_compiles_to_none() -> None:
    assert to_sql(None, rows, "sqlite") is None


def test_dicts_compile_like_conditions() -> None:
    expression = to_sql({"field": "task_id", "value": "t", "op": "eq"}, rows, "sqlite")
    assert str(expression) == "expstore_rows.task_id = :param_1"


def test_unknown_dialect_is_refused() -> None:
    with pytest.raises(QueryError, match=r"cannot compile conditions for the 'mysql' dialect"):
        to_sql(QueryBuilder().eq("step", 1).build(), rows, "mysql")


def test_json_text_writes_the_path_and_reads_it_with_the_arrow() -> None:
    from expstore.query.compiler import json_text
    from expstore.query.fields import resolve_field

    field = resolve_field("exp_data.state.level")
    assert field.column is None
    expression = json_text(field, rows, "sqlite").compile(
        dialect=DIALECTS["sqlite"], compile_kwargs={"render_postcompile": True}
    )
    assert str(expression) == 'expstore_rows.data -> \'$."state"."level"\''


@pytest.mark.parametrize(
    "value", ["easy", "é", 3, -2.5, 1.0, True, False, None, [1, "a"], {"k": [True]}, "", 0]
)
def test_json_text_without_the_arrow_gives_what_the_arrow_gives(value: object) -> None:
    """The spelling for SQLite before 3.38 (no ``->``) reads every JSON value as the arrow
    does, checked on this SQLite, which has both."""
    import json
    import sqlite3

    from sqlalchemy import select

    from expstore.query.compiler import json_text
    from expstore.query.fields import resolve_field

    texts = []
    for path in ("exp_data.state.v", "exp_data.state.w", "exp_data.state.v.0", "exp_data.state.é"):
        field = resolve_field(path)
        assert field.column is None
        for arrow in (True, False):
            statement = select(json_text(field, rows, "sqlite", sqlite_arrow=arrow)).compile(
                dialect=DIALECTS["sqlite"], compile_kwargs={"render_postcompile": True}
            )
            params = [statement.params[name] for name in statement.positiontup or ()]
            connection = sqlite3.connect(":memory:")
            connection.execute("CREATE TABLE expstore_rows (data TEXT)")
            document = {"state": {"v": value, "é": value}}
            connection.execute("INSERT INTO expstore_rows VALUES (?)", (json.dumps(document),))
            (text,) = connection.execute(str(statement), params).fetchone()
            texts.append(None if text is None else json.loads(text))
    # Per path, both spellings agree; and the value read back is the value stored.
    assert texts[0::2] == texts[1::2]
    assert texts[0] == value and texts[6] == value and texts[2] is None
