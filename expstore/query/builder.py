"""QueryBuilder: AWorld's fluent chain of conditions and operators, built into a Condition.

>>> query = (
...     QueryBuilder()
...     .eq("exp_meta.task_id", "123")
...     .and_()
...     .nested(QueryBuilder().eq("exp_meta.agent_id", "111").or_().eq("exp_meta.agent_id", "222"))
...     .build()
... )
>>> print(query)
exp_meta.task_id = '123' AND (exp_meta.agent_id = '111' OR exp_meta.agent_id = '222')

``and_`` binds tighter than ``or_``, as in SQL and Python: ``a.or_().b.and_().c`` means
``a OR (b AND c)``. AWorld's builder folds strictly left to right (``(a OR b) AND c``);
use ``nested()`` to group explicitly.

Like AWorld's, the builder is mutable: each method adds to the chain and returns the
builder itself. Mistakes raise QueryError at the call that makes them, naming the call's
position in the chain (1 for the first call after ``QueryBuilder()``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import QueryError
from .conditions import And, Changed, Comparison, Condition, Or, as_condition

__all__ = ["QueryBuilder"]


@dataclass(frozen=True)
class _Step:
    """One call in the chain: a condition, or an operator (``and``/``or``)."""

    condition: Condition | None
    operator: str | None
    call: str
    position: int


class QueryBuilder:
    """Build a :class:`~expstore.query.Condition` by chaining comparisons and operators.

        Comparisons: ``eq, ne, gt, gte, lt, lte`` (a field and a value), ``in_, not_in`` (a field
        and a list), ``like, not_like`` (a field and a LIKE pattern), ``between`` (a field and
        two bounds), ``is_null, is_not_null`` (a field), ``changed, unchanged`` (a field, compared
    with the previous step of the trajectory). Operators: ``and_()``, ``or_()``.
        Groups: ``nested(builder)``. Then ``build()``.
    """

    def __init__(self) -> None:
        self._steps: list[_Step] = []

    def __repr__(self) -> str:
        calls = "".join(f".{step.call}" for step in self._steps)
        return f"QueryBuilder(){calls}"

    # -- comparisons --------------------------------------------------------------------
    def eq(self, field: str, value: Any) -> QueryBuilder:
        """``field = value``."""
        return self._compare("eq", field, value, f"eq({field!r}, {value!r})")

    def ne(self, field: str, value: Any) -> QueryBuilder:
        """``field != value`` (a missing or null field never matches)."""
        return self._compare("ne", field, value, f"ne({field!r}, {value!r})")

    def gt(self, field: str, value: Any) -> QueryBuilder:
        """``field > value``."""
        return self._compare("gt", field, value, f"gt({field!r}, {value!r})")

    def gte(self, field: str, value: Any) -> QueryBuilder:
        """``field >= value``."""
        return self._compare("gte", field, value, f"gte({field!r}, {value!r})")

    def lt(self, field: str, value: Any) -> QueryBuilder:
        """``field < value``."""
        return self._compare("lt", field, value, f"lt({field!r}, {value!r})")

    def lte(self, field: str, value: Any) -> QueryBuilder:
        """``field <= value``."""
        return self._compare("lte", field, value, f"lte({field!r}, {value!r})")

    def in_(self, field: str, values: Sequence[Any]) -> QueryBuilder:
        """``field IN (values)``; an empty list matches nothing."""
        return self._compare("in", field, values, f"in_({field!r}, {values!r})")

    def not_in(self, field: str, values: Sequence[Any]) -> QueryBuilder:
        """``field NOT IN (values)``; an empty list matches every non-null value."""
        return self._compare("not_in", field, values, f"not_in({field!r}, {values!r})")

    def like(self, field: str, pattern: str) -> QueryBuilder:
        """``field LIKE pattern``, case-sensitive: ``%`` any run, ``_`` one character.

        A backslash makes the next character literal: ``like(f, "100\\%")`` matches ``100%``.
        """
        return self._compare("like", field, pattern, f"like({field!r}, {pattern!r})")

    def not_like(self, field: str, pattern: str) -> QueryBuilder:
        """``field NOT LIKE pattern`` (a string that does not match)."""
        return self._compare("not_like", field, pattern, f"not_like({field!r}, {pattern!r})")

    def between(self, field: str, low: Any, high: Any) -> QueryBuilder:
        """``low <= field <= high``."""
        call = f"between({field!r}, {low!r}, {high!r})"
        return self._compare("between", field, (low, high), call)

    def is_null(self, field: str) -> QueryBuilder:
        """``field IS NULL``: true for a null and for a missing JSON path."""
        return self._compare("is_null", field, None, f"is_null({field!r})")

    def is_not_null(self, field: str) -> QueryBuilder:
        """``field IS NOT NULL``: the field is present and not null."""
        return self._compare("is_not_null", field, None, f"is_not_null({field!r})")

    # -- operators and groups ---------------------------------------------------------------
    def and_(self) -> QueryBuilder:
        """Join the conditions on either side with AND."""
        return self._operator("and", "and_()")

    def or_(self) -> QueryBuilder:
        """Join the conditions on either side with OR (AND binds tighter)."""
        return self._operator("or", "or_()")

    def nested(self, builder: QueryBuilder | Condition | Mapping[str, Any]) -> QueryBuilder:
        """Add ``builder``'s whole chain as one parenthesised condition."""
        position = len(self._steps) + 1
        if isinstance(builder, QueryBuilder):
            if not builder._steps:
                raise QueryError(
                    f"nested() (call {position}) got an empty QueryBuilder; give it at least "
                    "one condition, such as QueryBuilder().eq('exp_meta.agent_id', 'a1'), "
                    "or drop the nested() call"
                )
            try:
                condition: Condition | None = builder.build()
            except QueryError as exc:
                raise QueryError(
                    f"in the builder given to nested() (call {position}): {exc}"
                ) from None
        else:
            try:
                condition = as_condition(builder)
            except QueryError as exc:
                raise QueryError(
                    f"nested() (call {position}) takes a QueryBuilder or a Condition; {exc}"
                ) from None
            if condition is None:
                raise QueryError(
                    f"nested() (call {position}) takes a QueryBuilder or a Condition; got None"
                )
        # Not the condition's text in the call's name: building it at every level of a
        # deep nesting would make building quadratic.
        return self._add(condition, None, "nested(...)")

    def build(self) -> Condition:
        """The Condition this chain describes; QueryError if the chain is incomplete."""
        if not self._steps:
            raise QueryError(
                "QueryBuilder.build(): the chain has no condition; add one, as in "
                "QueryBuilder().eq('exp_meta.task_id', 't1').build(). To select every row, "
                "pass query_condition=None instead"
            )
        last = self._steps[-1]
        if last.operator is not None:
            raise QueryError(
                f"QueryBuilder.build(): the chain ends with {last.call} (call {last.position}); "
                "add a condition after it, or remove it"
            )
        groups: list[list[Condition]] = [[]]
        for step in self._steps:
            if step.operator == "or":
                groups.append([])
            elif step.condition is not None:
                groups[-1].append(step.condition)
        terms = [group[0] if len(group) == 1 else And(tuple(group)) for group in groups]
        return terms[0] if len(terms) == 1 else Or(tuple(terms))

    # -- changes between steps ------------------------------------------------------------
    def changed(self, field: str, towards: str = "previous") -> QueryBuilder:
        """Steps whose value at ``field`` differs from the previous step of the same
        trajectory (the first step counts as changed), or with ``towards="next"`` from the
        next step (the action changed the page; the last step counts as changed); see
        :class:`~expstore.query.Changed`."""
        return self._change(field, True, towards, f"changed({field!r})")

    def unchanged(self, field: str, towards: str = "previous") -> QueryBuilder:
        """Steps whose value at ``field`` is the same as in the previous (or ``"next"``)
        step of the same trajectory; see :class:`~expstore.query.Changed`."""
        return self._change(field, False, towards, f"unchanged({field!r})")

    def _change(self, field: str, changed: bool, towards: str, call: str) -> QueryBuilder:
        try:
            condition = Changed(field, changed, towards)
        except QueryError as exc:
            raise QueryError(f"{call} (call {len(self._steps) + 1}): {exc}") from None
        return self._add(condition, None, call)

    # -- chain bookkeeping ------------------------------------------------------------------
    def _compare(self, op: str, field: str, value: Any, call: str) -> QueryBuilder:
        try:
            condition = Comparison(field, op, value)
        except QueryError as exc:
            raise QueryError(f"{call} (call {len(self._steps) + 1}): {exc}") from None
        return self._add(condition, None, call)

    def _operator(self, operator: str, call: str) -> QueryBuilder:
        return self._add(None, operator, call)

    def _add(self, condition: Condition | None, operator: str | None, call: str) -> QueryBuilder:
        position = len(self._steps) + 1
        previous = self._steps[-1] if self._steps else None
        if operator is not None and previous is None:
            raise QueryError(
                f"{call} (call {position}) starts the chain; a chain starts with a condition, "
                "as in QueryBuilder().eq('exp_meta.task_id', 't1').and_().eq(...)"
            )
        if operator is not None and previous is not None and previous.operator is not None:
            raise QueryError(
                f"{call} (call {position}) follows {previous.call} (call {previous.position}); "
                "put a condition between two operators"
            )
        if condition is not None and previous is not None and previous.operator is None:
            raise QueryError(
                f"{call} (call {position}) follows {previous.call} (call {previous.position}) "
                "with no operator between them; put .and_() or .or_() between the two conditions"
            )
        self._steps.append(_Step(condition, operator, call, position))
        return self
