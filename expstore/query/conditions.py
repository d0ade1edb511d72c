"""Conditions: immutable data saying which rows to select, with the same answers in Python.

A :class:`Condition` is a :class:`Comparison` (a field, an operator, a value) or an
:class:`And` / :class:`Or` of conditions. Conditions are frozen dataclasses, validated when
built; :mod:`expstore.query.compiler` turns them into SQL, :meth:`Condition.matches`
evaluates them in Python.

Semantics, identical in SQL and in ``matches()``:

- The Python type of the value decides what it can match: a number matches only numbers,
  a string only strings, a bool only booleans. A stored value of another type (or a dict,
  a list, a tensor) never matches, whatever the operator.
- A missing JSON path or a null never matches a comparison, ``ne`` and ``not_in``
  included; ``is_null`` is true for both, ``is_not_null`` for everything else.
- ``in_([])`` matches nothing; ``not_in([])`` matches every non-null value.
- ``like`` patterns are SQL LIKE patterns, case-sensitive, with ``\\`` as the escape
  character (see :mod:`expstore.query._like`).

And/Or groups nest at most :data:`MAX_CONDITION_DEPTH` levels, however a condition is
built (QueryBuilder.nested, a dict, a ``--where`` text): deeper raises QueryError. A group
may hold any number of conditions (the compiler nests wide groups so SQLite's expression
depth limit is never met).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from .._args import check_query_text
from ..codec import encode_payload
from ..errors import QueryError
from ..model.layout import Kind
from ..model.paths import MISSING, FieldPath, read_path, walk
from ._like import check_pattern, like_to_regex
from .fields import resolve_field

if TYPE_CHECKING:
    from ..model.rows import DataRow

__all__ = [
    "MAX_CONDITION_DEPTH",
    "And",
    "Changed",
    "Comparison",
    "Condition",
    "OPERATORS",
    "Or",
    "QueryCondition",
    "as_condition",
    "condition_key",
    "depth_error",
    "has_changed",
    "parse_where",
    "value_kind",
]

#: How many levels And/Or groups may nest (a comparison is level 0).
MAX_CONDITION_DEPTH = 100


def depth_error(where: str = "") -> QueryError:
    prefix = f"{where}: " if where else ""
    return QueryError(
        f"{prefix}conditions nest more than {MAX_CONDITION_DEPTH} levels of and/or groups; "
        "flatten them (an and_ or or_ takes any number of conditions at one level)"
    )


#: Operator names, as AWorld spells them in its dicts (``in``, not ``in_``).
OPERATORS = (
    "eq",
    "ne",
    "gt",
    "gte",
    "lt",
    "lte",
    "in",
    "not_in",
    "like",
    "not_like",
    "between",
    "is_null",
    "is_not_null",
)
_ORDERING = frozenset({"gt", "gte", "lt", "lte", "between"})
_ALIASES = {"in_": "in", "not_in_": "not_in", "ge": "gte", "le": "lte"}
_SQL_OPS = {"eq": "=", "ne": "!=", "gt": ">", "gte": ">=", "lt": "<", "lte": "<="}
_LOGICAL_KEYS = {"and_": "and", "or_": "or", "and": "and", "or": "or"}
_MAX_INT = 2**63 - 1


def value_kind(value: object) -> Kind | None:
    """The kind of a comparable value ("string", "number" or "bool"); None for anything else.

    Non-finite floats count as None: the codec stores them as ``{"__float__": ...}``.
    """
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, str):
        return "string"
    if isinstance(value, int):
        return "number"
    if isinstance(value, float):
        return "number" if math.isfinite(value) else None
    return None


class Condition(ABC):
    """Which rows to select: a :class:`Comparison`, an :class:`And` or an :class:`Or`.

    >>> c = Condition.from_dict({"field": "exp_meta.task_id", "value": "t1", "op": "eq"})
    >>> str(c)
    "exp_meta.task_id = 't1'"
    """

    __slots__ = ()

    @abstractmethod
    def matches(self, row: DataRow) -> bool:
        """Whether ``row`` satisfies this condition, with the same answer as the SQL."""

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """AWorld's dict shape: ``{"field", "value", "op"}``, ``{"and_": []}``, ``{"or_": []}``."""

    @abstractmethod
    def __str__(self) -> str:
        """The condition written like a SQL WHERE clause."""

    @staticmethod
    def parse(text: str) -> Condition | None:
        """The condition ``text`` spells in the ``--where`` language (what ``str()`` of a
        condition prints), or None for blank text; QueryError with a caret under the
        mistake otherwise (see :func:`parse_where`).

        >>> print(Condition.parse("task_id = 't1' and step >= 3"))
        task_id = 't1' AND step >= 3
        """
        return parse_where(text)

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> Condition:
        """Read AWorld's dict shape back; QueryError says what is wrong with a bad dict.

        Also reads ``{"and": [...]}``, ``{"or": [...]}`` and ``{"nested": {...}}``, which
        other AWorld versions write.
        """
        return _from_dict(data, "condition")


@dataclass(frozen=True)
class Comparison(Condition):
    """``field op value``: one test of one field.

    ``value`` is a string, number or bool; a tuple of them for ``in`` and ``not_in``; a
    ``(low, high)`` pair for ``between``; None for ``is_null`` and ``is_not_null``. Lists are
    stored as tuples, so a Comparison is hashable.
    """

    field: str
    op: str
    value: Any = None
    target: FieldPath = dataclasses.field(init=False, repr=False, compare=False)
    kind: Kind | None = dataclasses.field(init=False, repr=False, compare=False)
    _regex: re.Pattern[str] | None = dataclasses.field(
        init=False, repr=False, compare=False, default=None
    )

    def __post_init__(self) -> None:
        op = _ALIASES.get(self.op, self.op) if isinstance(self.op, str) else self.op
        if op not in OPERATORS:
            raise QueryError(
                f"unknown operator {self.op!r}; expected one of {', '.join(OPERATORS)}"
            )
        target = resolve_field(self.field)
        value, kind = _check_value(self.field, op, self.value)
        column = target.column
        if column is not None and kind is not None and kind != column.kind:
            raise QueryError(
                f"{op}() on {self.field!r}: that field holds "
                f"{'booleans' if column.kind == 'bool' else column.kind + 's'}, "
                f"so it cannot match {_show(self.value)} ({type(self.value).__name__}); "
                f"compare it with {_PY_TYPE[column.kind]}"
            )
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "value", value)
        object.__setattr__(self, "target", target)
        object.__setattr__(self, "kind", kind)
        if op in ("like", "not_like"):
            object.__setattr__(self, "_regex", like_to_regex(value))

    # -- Python evaluation --------------------------------------------------------------
    def matches(self, row: DataRow) -> bool:
        return self.test(_read(self.target, row))

    def test(self, actual: Any) -> bool:
        """Whether a stored value (``MISSING`` for an absent path) satisfies this test."""
        op = self.op
        if op == "is_null":
            return actual is MISSING or actual is None
        if op == "is_not_null":
            return actual is not MISSING and actual is not None
        if op == "not_in" and not self.value:
            return actual is not MISSING and actual is not None
        if value_kind(actual) != self.kind:
            return False
        value = self.value
        if op == "eq":
            return bool(actual == value)
        if op == "ne":
            return bool(actual != value)
        if op == "gt":
            return bool(actual > value)
        if op == "gte":
            return bool(actual >= value)
        if op == "lt":
            return bool(actual < value)
        if op == "lte":
            return bool(actual <= value)
        if op == "in":
            return any(actual == v for v in value)
        if op == "not_in":
            return all(actual != v for v in value)
        if op == "between":
            return bool(value[0] <= actual <= value[1])
        assert self._regex is not None
        found = self._regex.fullmatch(actual) is not None
        return found if op == "like" else not found

    # -- shapes ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        value = list(self.value) if isinstance(self.value, tuple) else self.value
        return {"field": self.field, "value": value, "op": self.op}

    def __str__(self) -> str:
        name, op, value = self.field, self.op, self.value
        if op in _SQL_OPS:
            return f"{name} {_SQL_OPS[op]} {_sql_literal(value)}"
        if op in ("in", "not_in"):
            items = ", ".join(_sql_literal(v) for v in value)
            return f"{name} {'IN' if op == 'in' else 'NOT IN'} ({items})"
        if op in ("like", "not_like"):
            return f"{name} {'LIKE' if op == 'like' else 'NOT LIKE'} {_sql_literal(value)}"
        if op == "between":
            return f"{name} BETWEEN {_sql_literal(value[0])} AND {_sql_literal(value[1])}"
        return f"{name} {'IS NULL' if op == 'is_null' else 'IS NOT NULL'}"


@dataclass(frozen=True)
class _Group(Condition):
    conditions: tuple[Condition, ...]
    word: ClassVar[str]
    key: ClassVar[str]
    #: How many levels of groups this one holds, itself included (set when built).
    depth: ClassVar[int] = 1

    def __post_init__(self) -> None:
        conditions = self.conditions
        if isinstance(conditions, list):
            conditions = tuple(conditions)
        if not isinstance(conditions, tuple) or not conditions:
            raise QueryError(
                f"{type(self).__name__}() needs a non-empty tuple of conditions; "
                f"got {self.conditions!r}"
            )
        for item in conditions:
            if not isinstance(item, Condition):
                raise QueryError(
                    f"{type(self).__name__}() holds conditions only; got {item!r} "
                    f"({type(item).__name__})"
                )
        depth = 1 + max(getattr(c, "depth", 0) for c in conditions)
        if depth > MAX_CONDITION_DEPTH:
            raise depth_error()
        object.__setattr__(self, "conditions", conditions)
        object.__setattr__(self, "depth", depth)

    def to_dict(self) -> dict[str, Any]:
        return {self.key: [c.to_dict() for c in self.conditions]}

    def __str__(self) -> str:
        parts = (f"({c})" if isinstance(c, _Group) else str(c) for c in self.conditions)
        return f" {self.word} ".join(parts)


@dataclass(frozen=True)
class And(_Group):
    """All of ``conditions`` hold."""

    word: ClassVar[str] = "AND"
    key: ClassVar[str] = "and_"

    def matches(self, row: DataRow) -> bool:
        return all(c.matches(row) for c in self.conditions)


@dataclass(frozen=True)
class Or(_Group):
    """At least one of ``conditions`` holds."""

    word: ClassVar[str] = "OR"
    key: ClassVar[str] = "or_"

    def matches(self, row: DataRow) -> bool:
        return any(c.matches(row) for c in self.conditions)


@dataclass(frozen=True)
class Changed(Condition):
    """``changed(field)``: the value at ``field`` differs from the same field in the
    previous step of the same trajectory (the row of the same ``task_id`` with the largest
    ``step`` below this one); ``unchanged(field)`` (``changed=False``): it is the same.
    ``towards="next"`` (``changed(field, next)``) compares with the next step instead (the
    smallest step above): whether this step's action changed the page, as WebGym's
    ``filter_same_screenshot`` asks.

    What is compared is what the database sees: the digest of an array stored by digest
    (64 KiB or more: a screenshot), the JSON of any other payload value, the value of a
    column. An array kept in its row's blob (smaller) has no digest, so it is never
    *unchanged*, unless the buffer tracks the path (``buffer.track_changes(path)``): then
    each row's digest of the value, whatever its size, and flags kept by every write answer
    it (see :mod:`expstore.tracking.changes`). The first step of a trajectory has no
    previous step: it counts as changed (and with ``next``, the last step has no next one:
    it counts as changed). Compiled to SQL only: a single row cannot tell, so
    :meth:`matches` raises QueryError.

    >>> print(Changed("exp_data.state.screenshot"))
    changed(exp_data.state.screenshot)
    """

    field: str
    changed: bool = True
    towards: str = "previous"
    target: FieldPath = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if type(self.changed) is not bool:
            raise QueryError(f"changed must be True or False, got {self.changed!r}")
        if self.towards not in ("previous", "next"):
            raise QueryError(
                f"{self.op}() compares with the 'previous' or the 'next' step, got {self.towards!r}"
            )
        object.__setattr__(self, "target", resolve_field(self.field))

    @property
    def op(self) -> str:
        return "changed" if self.changed else "unchanged"

    def matches(self, row: DataRow) -> bool:
        raise QueryError(
            f"{self} compares a row with the previous step of its trajectory, which one row "
            "does not hold; it is evaluated by the database (use it in a query, a sampler or "
            "a claim)"
        )

    def to_dict(self) -> dict[str, Any]:
        if self.towards == "next":
            return {"field": self.field, "op": self.op, "value": "next"}
        return {"field": self.field, "op": self.op}

    def __str__(self) -> str:
        return f"{self.op}({self.field}{', next' if self.towards == 'next' else ''})"


#: What every call that selects rows takes: a :class:`Condition`, AWorld's dict shape of
#: one, or None (every row).
QueryCondition = Condition | dict[str, Any] | None


def as_condition(condition: Condition | Mapping[str, Any] | None) -> Condition | None:
    """A Condition from a Condition, AWorld's dict shape, or None (which stays None)."""
    if condition is None or isinstance(condition, Condition):
        return condition
    if isinstance(condition, Mapping):
        return Condition.from_dict(condition)
    hint = (
        "; call .build() on the QueryBuilder" if type(condition).__name__ == "QueryBuilder" else ""
    )
    raise QueryError(
        "query_condition must be a Condition (from QueryBuilder().build()), its dict form, "
        f"or None; got {type(condition).__name__}{hint}"
    )


def has_changed(query_condition: QueryCondition) -> bool:
    """Whether the condition holds a ``changed()``/``unchanged()`` anywhere."""
    condition = as_condition(query_condition)
    if isinstance(condition, Changed):
        return True
    if isinstance(condition, (And, Or)):
        return any(has_changed(c) for c in condition.conditions)
    return False


def condition_key(query_condition: QueryCondition) -> str:
    """A text that is equal for equal conditions, to cache by."""
    condition = as_condition(query_condition)
    if condition is None:
        return ""
    return json.dumps(condition.to_dict(), sort_keys=True, default=repr)


# -- validation -------------------------------------------------------------------------

_PY_TYPE = {"string": "a str", "number": "an int or a float", "bool": "a bool"}


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _scalar(field_name: str, op: str, value: Any) -> Kind:
    """Check one comparison value and return its kind."""
    if value is None:
        raise QueryError(
            f"{op}() on {field_name!r} got None; comparisons with null never match, "
            f"so test for it with is_null({field_name!r}) or is_not_null({field_name!r})"
        )
    kind = value_kind(value)
    if kind is None:
        if isinstance(value, float):
            raise QueryError(
                f"{op}() on {field_name!r} got {value!r}; only finite numbers can be compared"
            )
        raise QueryError(
            f"{op}() on {field_name!r} compares with a str, int, float or bool; got "
            f"{_show(value)} ({type(value).__name__}). To test a value inside a dict or "
            "list, give its path, such as exp_data.state.url or exp_data.actions.0.name"
        )
    if kind == "string":
        check_query_text(value, f"the value of {op}() on {field_name!r}")
    if kind == "number" and not isinstance(value, float) and abs(value) > _MAX_INT:
        raise QueryError(
            f"{op}() on {field_name!r} got {value}, beyond the 64-bit integer range; "
            "compare with a float instead"
        )
    if kind == "bool" and op in _ORDERING:
        raise QueryError(
            f"{op}() on {field_name!r} orders numbers or strings; got the bool {value!r}. "
            "Compare booleans with eq() or ne()"
        )
    return kind


def _check_value(field_name: str, op: str, value: Any) -> tuple[Any, Kind | None]:
    """Validate ``value`` for ``op`` and return it normalised, with its kind."""
    if op in ("is_null", "is_not_null"):
        if value is not None:
            raise QueryError(f"{op}() on {field_name!r} takes no value; got {_show(value)}")
        return None, None
    if op in ("in", "not_in"):
        name = "in_" if op == "in" else op
        if isinstance(value, (str, bytes, Mapping)) or not isinstance(
            value, (list, tuple, set, frozenset)
        ):
            raise QueryError(
                f"{name}() on {field_name!r} takes a list of values; got {_show(value)} "
                f"({type(value).__name__}); write {name}({field_name!r}, [value, ...])"
            )
        items = tuple(value)
        if isinstance(value, (set, frozenset)):
            try:  # a stable order, so equal sets give equal conditions
                items = tuple(sorted(value))
            except TypeError:
                pass
        kinds = {_scalar(field_name, op, item) for item in items}
        if len(kinds) > 1:
            raise QueryError(
                f"{name}() on {field_name!r} takes values of one type (strings, numbers or "
                f"booleans); got {_show(list(items))}. Use or_() to combine types"
            )
        return items, (kinds.pop() if kinds else None)
    if op == "between":
        if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, (list, tuple)):
            raise QueryError(
                f"between() on {field_name!r} takes two bounds, low and high; got {_show(value)}"
            )
        if len(value) != 2:
            raise QueryError(
                f"between() on {field_name!r} takes exactly two bounds, low and high; "
                f"got {len(value)}: {_show(value)}"
            )
        low, high = value
        low_kind, high_kind = _scalar(field_name, op, low), _scalar(field_name, op, high)
        if low_kind != high_kind:
            raise QueryError(
                f"between() on {field_name!r} takes two bounds of one type; got "
                f"{_show(low)} and {_show(high)}"
            )
        return (low, high), low_kind
    if op in ("like", "not_like"):
        if not isinstance(value, str):
            raise QueryError(
                f"{op}() on {field_name!r} takes a string pattern such as 'web_%'; "
                f"got {_show(value)} ({type(value).__name__})"
            )
        check_query_text(value, f"the pattern of {op}() on {field_name!r}")
        check_pattern(value)
        return value, "string"
    return value, _scalar(field_name, op, value)


def _sql_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value)


# -- reading rows -------------------------------------------------------------------------


def _read(target: FieldPath, row: DataRow) -> Any:
    """The stored value ``target`` names in ``row``, as the database holds it."""
    if target.is_column:
        return read_path(row, target)
    top = str(target.top)
    # The JSON the database holds: pydantic models as dumps, tuples as lists, tensors and
    # non-finite floats as placeholder dicts. Reading it here keeps Python and SQL in step.
    doc, _ = encode_payload({top: getattr(row.exp_data, top)})
    return walk(doc[top], target.steps)


# -- reading dicts ------------------------------------------------------------------------


def _from_dict(data: Any, where: str, depth: int = 0) -> Condition:
    if isinstance(data, Condition):
        return data
    if depth > MAX_CONDITION_DEPTH:
        raise depth_error(where[:60] + ("..." if len(where) > 60 else ""))
    if not isinstance(data, Mapping):
        raise QueryError(
            f"{where}: expected a dict such as {{'field': 'exp_meta.task_id', 'value': 't1', "
            f"'op': 'eq'}} or {{'and_': [...]}}; got {_show(data)} ({type(data).__name__})"
        )
    keys = set(data)
    if keys == {"nested"}:
        return _from_dict(data["nested"], f"{where}.nested", depth + 1)
    logical = keys & set(_LOGICAL_KEYS)
    if logical:
        if len(keys) != 1:
            raise QueryError(
                f"{where}: a logical condition has exactly one key (and_ or or_); "
                f"got keys {sorted(keys)}"
            )
        (key,) = logical
        items = data[key]
        if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, (list, tuple)):
            raise QueryError(f"{where}.{key}: expected a list of conditions; got {_show(items)}")
        if not items:
            raise QueryError(f"{where}.{key}: the list of conditions is empty; give at least one")
        children = tuple(
            _from_dict(item, f"{where}.{key}[{i}]", depth + 1) for i, item in enumerate(items)
        )
        return And(children) if _LOGICAL_KEYS[key] == "and" else Or(children)
    if "field" in keys and data.get("op") in ("changed", "unchanged"):
        if not keys <= {"field", "op", "value"} or data.get("value", "previous") not in (
            "previous",
            "next",
        ):
            raise QueryError(
                f"{where}: a {data['op']} condition has field, op and optionally value "
                f"'previous' or 'next'; got {_show(dict(data))}"
            )
        try:
            return Changed(data["field"], data["op"] == "changed", data.get("value", "previous"))
        except QueryError as exc:
            raise QueryError(f"{where}: {exc}") from None
    if "field" in keys and "op" in keys:
        extra = keys - {"field", "op", "value"}
        if extra:
            raise QueryError(
                f"{where}: unexpected keys {sorted(extra)}; a comparison has field, op and value"
            )
        op = data["op"]
        if "value" not in keys and op not in ("is_null", "is_not_null"):
            raise QueryError(f"{where}: the {op!r} comparison on {data['field']!r} has no value")
        try:
            return Comparison(data["field"], op, data.get("value"))
        except QueryError as exc:
            raise QueryError(f"{where}: {exc}") from None
    raise QueryError(
        f"{where}: expected a comparison {{'field', 'value', 'op'}} or a logical "
        f"{{'and_': [...]}} / {{'or_': [...]}}; got keys {sorted(map(str, keys))}"
    )


# -- the --where language: conditions as text ------------------------------------------------
# The ``--where`` language: a small, safe text form of query conditions.
#
# :func:`parse_where` turns text into a :class:`~expstore.query.Condition` with a hand-written
# tokenizer and recursive-descent parser; nothing is ever evaluated. The grammar::
#
#     condition  := conjunction ( OR conjunction )*
#     conjunction:= primary ( AND primary )*            -- AND binds tighter than OR
#     primary    := "(" condition ")" | change | comparison
#     change     := ( CHANGED | UNCHANGED ) "(" field [ "," NEXT | PREVIOUS ] ")"
#     comparison := field ( "=" | "!=" | "<>" | ">" | ">=" | "<" | "<=" ) value
#                 | field [NOT] IN "(" [ value ( "," value )* ] ")"
#                 | field [NOT] LIKE string
#                 | field [NOT] BETWEEN value AND value
#                 | field IS [NOT] NULL
#     value      := string | number | TRUE | FALSE
#     field      := name ( "." name | "." digits )*  |  "double-quoted field"
#
# Keywords are case-insensitive; strings take single quotes with ``''`` for a quote inside;
# numbers are ints or floats (``3``, ``-0.5``, ``1e-3``). Fields are those of
# :mod:`expstore.query` (``task_id``, ``exp_meta.step``, ``exp_data.state.url``...). This is
# what ``str(condition)`` prints, so ``parse_where(str(c)) == c``.
#
# >>> print(parse_where("task_id = 't1' and (agent_id in ('a', 'b') or step >= 3)"))
# task_id = 't1' AND (agent_id IN ('a', 'b') OR step >= 3)
#
# Errors are :class:`~expstore.QueryError` naming the column, with the text and a caret::
#
#     column 11: expected a value after '=', got 'and'
#       task_id = and step > 1
#                 ^
KEYWORDS = frozenset({"and", "or", "not", "in", "like", "between", "is", "null", "true", "false"})
_COMPARE = {
    "=": "eq",
    "==": "eq",
    "!=": "ne",
    "<>": "ne",
    ">": "gt",
    ">=": "gte",
    "<": "lt",
    "<=": "lte",
}

_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<number>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)(?![A-Za-z_])
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*(?:\.(?:[A-Za-z0-9_]+))*)
  | (?P<op><>|!=|==|>=|<=|=|>|<)
  | (?P<punct>[(),])
  | (?P<string>')
  | (?P<quoted>")
    """,
    re.VERBOSE,
)


@dataclass(frozen=True)
class Token:
    """One token: its kind, its value and where it starts (0-based)."""

    kind: str  # "name", "keyword", "string", "number", "op", "punct", "end"
    value: Any
    pos: int
    text: str

    def describe(self) -> str:
        if self.kind == "end":
            return "the end of the text"
        return repr(self.text)


def _fail(text: str, pos: int, message: str) -> QueryError:
    shown = re.sub(r"\s", " ", text)
    return QueryError(f"column {pos + 1}: {message}\n  {shown}\n  {' ' * pos}^")


def _read_quoted(text: str, start: int, quote: str) -> tuple[str, int]:
    """The content of a quoted token starting at ``start`` and the position after it."""
    out: list[str] = []
    i = start + 1
    while i < len(text):
        ch = text[i]
        if ch == quote:
            if text.startswith(quote * 2, i):
                out.append(quote)
                i += 2
                continue
            return "".join(out), i + 1
        out.append(ch)
        i += 1
    what = "string" if quote == "'" else "quoted field name"
    raise _fail(text, start, f"unterminated {what}: add the closing {quote}")


def tokenize(text: str) -> list[Token]:
    """The tokens of ``text``, ending with an ``end`` token."""
    tokens: list[Token] = []
    pos = 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise _fail(
                text,
                pos,
                f"unexpected character {text[pos]!r}; expected a field, a value, an "
                "operator (= != > >= < <=) or a parenthesis",
            )
        kind = match.lastgroup
        assert kind is not None
        if kind == "space":
            pos = match.end()
            continue
        if kind in ("string", "quoted"):
            value, end = _read_quoted(text, pos, "'" if kind == "string" else '"')
            tokens.append(
                Token("string" if kind == "string" else "name", value, pos, text[pos:end])
            )
            pos = end
            continue
        raw = match.group()
        if kind == "number":
            number: int | float
            if re.fullmatch(r"[-+]?\d+", raw):
                number = int(raw)
            else:
                number = float(raw)
            tokens.append(Token("number", number, pos, raw))
        elif kind == "name" and raw.lower() in KEYWORDS:
            tokens.append(Token("keyword", raw.lower(), pos, raw))
        else:
            tokens.append(Token(kind, raw, pos, raw))
        pos = match.end()
    tokens.append(Token("end", None, len(text), ""))
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = tokenize(text)
        self.i = 0
        self.depth = 0  # parentheses open around the current token

    # -- helpers ----------------------------------------------------------------------
    @property
    def tok(self) -> Token:
        return self.tokens[self.i]

    def advance(self) -> Token:
        token = self.tokens[self.i]
        self.i += 1
        return token

    def at_keyword(self, *words: str) -> bool:
        return self.tok.kind == "keyword" and self.tok.value in words

    def at_punct(self, char: str) -> bool:
        return self.tok.kind == "punct" and self.tok.value == char

    def error(self, message: str, token: Token | None = None) -> QueryError:
        token = token or self.tok
        return _fail(self.text, token.pos, message)

    def expect_punct(self, char: str, context: str) -> None:
        if not self.at_punct(char):
            raise self.error(f"expected {char!r} {context}, got {self.tok.describe()}")
        self.advance()

    # -- grammar ----------------------------------------------------------------------
    def parse(self) -> Condition:
        condition = self.disjunction()
        if self.tok.kind != "end":
            if self.at_punct(")"):
                raise self.error("unmatched ')'")
            raise self.error(f"expected and, or or the end, got {self.tok.describe()}")
        return condition

    def disjunction(self) -> Condition:
        parts = [self.conjunction()]
        while self.at_keyword("or"):
            self.advance()
            parts.append(self.conjunction())
        return parts[0] if len(parts) == 1 else Or(tuple(parts))

    def conjunction(self) -> Condition:
        parts = [self.primary()]
        while self.at_keyword("and"):
            self.advance()
            parts.append(self.primary())
        return parts[0] if len(parts) == 1 else And(tuple(parts))

    def primary(self) -> Condition:
        if self.at_punct("("):
            opening = self.advance()
            self.depth += 1
            if self.depth > MAX_CONDITION_DEPTH:
                raise self.error(
                    f"parentheses nest more than {MAX_CONDITION_DEPTH} deep here; flatten "
                    "the condition (and/or take any number of terms at one level)",
                    opening,
                )
            inner = self.disjunction()
            self.depth -= 1
            if not self.at_punct(")"):
                if self.tok.kind == "end":
                    raise self.error("this '(' is never closed; add ')'", opening)
                raise self.error(f"expected and, or or ')', got {self.tok.describe()}")
            self.advance()
            return inner
        if self.at_keyword("not"):
            raise self.error(
                "NOT before a condition is not supported; write the negated test instead "
                "(!=, not in, not like, is not null, unchanged(...))"
            )
        token = self.tok
        if (
            token.kind == "name"
            and token.value.lower() in ("changed", "unchanged")
            and self.i + 1 < len(self.tokens)
            and self.tokens[self.i + 1].kind == "punct"
            and self.tokens[self.i + 1].value == "("
        ):
            return self.change()
        return self.comparison()

    def change(self) -> Condition:
        word = self.advance()
        self.expect_punct("(", f"after {word.text}")
        field_token = self.field()
        towards = "previous"
        if self.at_punct(","):
            self.advance()
            token = self.tok
            if token.kind != "name" or token.value.lower() not in ("previous", "next"):
                raise self.error(
                    f"expected previous or next after ',' in {word.text}(...), "
                    f"got {token.describe()}"
                )
            towards = self.advance().value.lower()
        if not self.at_punct(")"):
            raise self.error(
                f"expected ')' after the field of {word.text}(...), got {self.tok.describe()}"
            )
        self.advance()
        try:
            return Changed(field_token.value, word.value.lower() == "changed", towards)
        except QueryError as exc:
            raise self.error(str(exc), field_token) from None

    def field(self) -> Token:
        token = self.tok
        if token.kind == "name":
            return self.advance()
        if token.kind == "keyword":
            raise self.error(
                f"expected a field name, got the keyword {token.text!r}; "
                f'a field named {token.text!r} must be double-quoted ("{token.text}")'
            )
        if token.kind == "end":
            raise self.error("expected a condition such as task_id = 't1'")
        raise self.error(
            f"expected a field name such as task_id or exp_data.state.url, got {token.describe()}"
        )

    def value(self, after: str) -> Any:
        token = self.tok
        if token.kind in ("string", "number"):
            self.advance()
            return token.value
        if self.at_keyword("true", "false"):
            self.advance()
            return token.value == "true"
        if self.at_keyword("null"):
            raise self.error(
                "comparisons with null never match; test for it with 'is null' or 'is not null'"
            )
        if token.kind == "name":
            raise self.error(
                f"expected a value after {after}, got {token.describe()}; "
                "quote strings with single quotes ('...')"
            )
        raise self.error(f"expected a value after {after}, got {token.describe()}")

    def comparison(self) -> Condition:
        field_token = self.field()
        op_token = self.tok
        op: str
        value: Any = None
        if op_token.kind == "op":
            self.advance()
            op = _COMPARE[op_token.value]
            value = self.value(repr(op_token.text))
        elif self.at_keyword("is"):
            self.advance()
            negated = self.at_keyword("not")
            if negated:
                self.advance()
            if not self.at_keyword("null"):
                raise self.error(
                    f"expected null after {'is not' if negated else 'is'}, "
                    f"got {self.tok.describe()}"
                )
            self.advance()
            op = "is_not_null" if negated else "is_null"
        else:
            negated = self.at_keyword("not")
            if negated:
                self.advance()
            if self.at_keyword("in"):
                self.advance()
                op = "not_in" if negated else "in"
                value = self.value_list()
            elif self.at_keyword("like"):
                self.advance()
                op = "not_like" if negated else "like"
                if self.tok.kind != "string":
                    raise self.error(
                        f"expected a quoted pattern such as '%login%' after like, "
                        f"got {self.tok.describe()}"
                    )
                value = self.advance().value
            elif self.at_keyword("between"):
                if negated:
                    raise self.error(
                        "not between is not supported; write (field < low or field > high)"
                    )
                self.advance()
                low = self.value("between")
                if not self.at_keyword("and"):
                    raise self.error(
                        f"expected and between the two bounds, got {self.tok.describe()}"
                    )
                self.advance()
                high = self.value("and")
                op, value = "between", (low, high)
            else:
                expected = (
                    "in, like or between after not"
                    if negated
                    else "an operator (= != > >= < <=, in, like, between, is null)"
                )
                raise self.error(
                    f"expected {expected} after {field_token.describe()}, got {self.tok.describe()}"
                )
        try:
            return Comparison(field_token.value, op, value)
        except QueryError as exc:
            raise self.error(str(exc), field_token) from None

    def value_list(self) -> tuple[Any, ...]:
        self.expect_punct("(", "after in")
        values: list[Any] = []
        if self.at_punct(")"):
            self.advance()
            return ()
        while True:
            values.append(self.value("'(' or ','" if not values else "','"))
            if self.at_punct(","):
                self.advance()
                continue
            if self.at_punct(")"):
                self.advance()
                return tuple(values)
            raise self.error(f"expected ',' or ')' in the list, got {self.tok.describe()}")


def parse_where(text: str) -> Condition | None:
    """The Condition ``text`` spells, or None for empty text (every row).

    Raises :class:`~expstore.QueryError` with the column and a caret line on a mistake.
    """
    if not isinstance(text, str):
        raise QueryError(f"a --where filter is text, got {type(text).__name__}")
    if not text.strip():
        return None
    return _Parser(text).parse()
