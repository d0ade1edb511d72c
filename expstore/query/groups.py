"""Conditions on whole groups of rows, compiled to SQL aggregates (GRPO's group filters).

A group condition compares a statistic of a group's rows with a number::

    GroupStat.spread("reward_t") > 0           # rewards vary within the group (DAPO)
    GroupStat.mean("reward_t") >= 0.2
    (GroupStat.max("reward_t") > 0.5) & (GroupStat.count() == 8)

Statistics: ``count()``, ``mean``, ``min``, ``max``, ``sum`` and ``spread`` (max - min) of
a numeric or boolean column of the row (``reward_t``, ``adv_t``, ``v_t``, ``step``,
``policy_version``, ``done``...). Conditions are immutable data; :meth:`GroupCondition.to_sql`
turns one into a SQLAlchemy expression over a grouped query, with every number a bound
parameter. Aggregates skip NULLs, as SQL's do; a comparison with a statistic that is NULL
(every row of the group without a reward, say) is false.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import Integer, and_, func, literal, or_
from sqlalchemy.sql.elements import ColumnElement

from ..errors import QueryError, UnsupportedTypeError
from .fields import resolve_field

__all__ = ["GroupCondition", "GroupStat"]

Statistic = Literal["count", "mean", "min", "max", "sum", "spread"]
_OPERATORS: dict[str, Callable[[Any, Any], Any]] = {
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
}


@dataclass(frozen=True)
class GroupStat:
    """A statistic of a group's rows; compare it with a number to get a condition."""

    statistic: Statistic
    column: str | None = None

    @classmethod
    def count(cls) -> GroupStat:
        """How many rows the group has."""
        return cls("count")

    @classmethod
    def mean(cls, field: str) -> GroupStat:
        return cls("mean", _numeric_column(field))

    @classmethod
    def min(cls, field: str) -> GroupStat:
        return cls("min", _numeric_column(field))

    @classmethod
    def max(cls, field: str) -> GroupStat:
        return cls("max", _numeric_column(field))

    @classmethod
    def sum(cls, field: str) -> GroupStat:
        return cls("sum", _numeric_column(field))

    @classmethod
    def spread(cls, field: str) -> GroupStat:
        """max - min: above 0 exactly when the values are not all equal (std > 0)."""
        return cls("spread", _numeric_column(field))

    def _compare(self, op: str, value: Any) -> GroupCondition:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UnsupportedTypeError(f"a group statistic compares with a number, got {value!r}")
        if not math.isfinite(value):
            raise QueryError(f"a group statistic compares with a finite number, got {value!r}")
        return GroupCondition(self, op, value)

    def __gt__(self, value: Any) -> GroupCondition:
        return self._compare(">", value)

    def __ge__(self, value: Any) -> GroupCondition:
        return self._compare(">=", value)

    def __lt__(self, value: Any) -> GroupCondition:
        return self._compare("<", value)

    def __le__(self, value: Any) -> GroupCondition:
        return self._compare("<=", value)

    def __eq__(self, value: Any) -> GroupCondition:  # type: ignore[override]
        if isinstance(value, GroupStat):
            return NotImplemented
        return self._compare("==", value)

    def __ne__(self, value: Any) -> GroupCondition:  # type: ignore[override]
        if isinstance(value, GroupStat):
            return NotImplemented
        return self._compare("!=", value)

    __hash__ = object.__hash__

    def to_sql(self, columns: Mapping[str, ColumnElement[Any]]) -> ColumnElement[Any]:
        """The aggregate over ``columns`` (the grouped query's columns by name)."""
        if self.statistic == "count":
            return func.count()
        assert self.column is not None
        column = columns[self.column]
        if self.column == "done":  # booleans: as 0/1 for every statistic
            column = column.cast(Integer)
        if self.statistic == "mean":
            return func.avg(column)
        if self.statistic == "spread":
            return func.max(column) - func.min(column)
        return getattr(func, self.statistic)(column)  # type: ignore[no-any-return]

    def __str__(self) -> str:
        return f"{self.statistic}({self.column or ''})"


@dataclass(frozen=True)
class GroupCondition:
    """``statistic op value``, or several joined with ``&`` (all) or ``|`` (any)."""

    stat: GroupStat | None
    op: str
    value: float | tuple[GroupCondition, ...]

    def __and__(self, other: GroupCondition) -> GroupCondition:
        return _join("and", self, other)

    def __or__(self, other: GroupCondition) -> GroupCondition:
        return _join("or", self, other)

    @property
    def columns(self) -> frozenset[str]:
        """The row columns the condition reads."""
        if self.stat is None:
            assert isinstance(self.value, tuple)
            return frozenset().union(*(part.columns for part in self.value))
        return frozenset({self.stat.column} - {None})  # type: ignore[arg-type]

    def to_sql(self, columns: Mapping[str, ColumnElement[Any]]) -> ColumnElement[bool]:
        """The condition as a SQL expression over the grouped query's ``columns``."""
        if self.stat is None:
            assert isinstance(self.value, tuple)
            parts = [part.to_sql(columns) for part in self.value]
            return and_(*parts) if self.op == "and" else or_(*parts)
        return _OPERATORS[self.op](self.stat.to_sql(columns), literal(self.value))  # type: ignore[no-any-return]

    def __str__(self) -> str:
        if self.stat is None:
            assert isinstance(self.value, tuple)
            joiner = " & " if self.op == "and" else " | "
            return "(" + joiner.join(map(str, self.value)) + ")"
        return f"{self.stat} {self.op} {self.value:g}"


def _join(op: str, left: Any, right: Any) -> GroupCondition:
    if not isinstance(right, GroupCondition):
        raise UnsupportedTypeError(
            f"group conditions join with other group conditions, got {type(right).__name__}"
        )
    parts: list[GroupCondition] = []
    for part in (left, right):
        if part.stat is None and part.op == op and isinstance(part.value, tuple):
            parts.extend(part.value)
        else:
            parts.append(part)
    return GroupCondition(None, op, tuple(parts))


def _numeric_column(field: str) -> str:
    path = resolve_field(field)
    column = path.column
    if column is None or column.kind not in ("number", "bool"):
        raise QueryError(
            f"group statistics read a numeric column of the row (reward_t, adv_t, v_t, "
            f"step, policy_version, done...), got {field!r}"
        )
    return column.name
