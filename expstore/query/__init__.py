"""Select rows by metadata and by anything inside the experience's JSON.

Build conditions with :class:`QueryBuilder` (AWorld's fluent API), from AWorld's dict
shape, or from text (:meth:`Condition.parse`, the CLI's ``--where`` language);
:func:`to_sql` compiles them to SQLAlchemy Core for SQLite and Postgres, and
:meth:`Condition.matches` gives the same answers in Python.

>>> from expstore.query import QueryBuilder
>>> print(QueryBuilder().eq("task_id", "t1").and_().gte("exp_data.ext_info.version", 3).build())
task_id = 't1' AND exp_data.ext_info.version >= 3
"""

from __future__ import annotations

from .builder import QueryBuilder
from .compiler import to_sql
from .conditions import (
    And,
    Changed,
    Comparison,
    Condition,
    Or,
    QueryCondition,
    as_condition,
    condition_key,
    parse_where,
)

__all__ = [
    "And",
    "Changed",
    "Comparison",
    "Condition",
    "Or",
    "QueryBuilder",
    "QueryCondition",
    "as_condition",
    "condition_key",
    "parse_where",
    "to_sql",
]
