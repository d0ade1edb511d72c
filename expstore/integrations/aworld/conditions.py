"""AWorld's storage conditions as expstore conditions, so they run as SQL (with indexes).

AWorld 0.3 filters items with dicts (``aworld/core/storage/condition.py``)::

    {"field": "task_id", "value": "t1", "op": "eq"}
    {"and_": [cond, ...]}    {"or_": [cond, ...]}

built by hand or by a ``ConditionBuilder`` (its ``conditions`` and ``logical_ops`` are read
here directly, folded left to right as AWorld's ``InmemoryConditionBuilder.build`` folds
them, ``nested`` groups included). :func:`compile_condition` turns either into an
:class:`expstore.query.Condition`, asking the storage's layout where each field lives
(``field_path``: a column such as ``exp_meta.task_id``, or a JSON path of the row).

The answers are AWorld's in-memory ``ConditionFilter``'s wherever that filter gives one:

- ``eq None`` is ``is_null``; ``ne`` also matches a missing or null field
  (``None != "x"`` in Python), ``ne None`` is ``is_not_null``;
- ``in``/``not_in`` take a list; ``None`` in the list matches a null field, a null field
  is ``not_in`` a list without ``None``; values of several types are allowed (one
  expstore comparison per type);
- ``like``/``not_like`` are Python's substring test (``value in field``): the value is
  matched literally anywhere in the field, ``%`` and ``_`` included;
- ``and_: []`` matches everything and ``or_: []`` nothing; a dict with both keys is read as
  its ``and_`` only, as AWorld does.

Where AWorld's filter raises (an ordering or ``like`` against a null field, a field of a
non-``Data`` item) the SQL simply does not match. A stored value of another type than the
condition's (a number against a str) never matches ``ne``/``not_in`` here, where Python
finds them unequal; a null does, as in Python. Two deliberate differences: a value's
field is also found in a dict value (AWorld's ``getattr`` finds none there), and a dotted
field (``meta.task_id``) reads a nested field (AWorld looks for an attribute of that name
and finds none). An expstore ``Condition`` is taken as it is, with expstore's own paths.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...errors import QueryError
from ...query import And, Comparison, Condition, Or
from ...query.conditions import value_kind

__all__ = ["FieldPath", "compile_condition", "fold_builder"]

#: Where an item's field lives in the row: ``"task_id"`` -> ``"exp_data.state.task_id"``.
FieldPath = Callable[[str], str]

_COMPARE = {"eq", "ne", "gt", "gte", "lt", "lte"}
_LIKE_SPECIALS = ("\\", "%", "_")


def compile_condition(condition: Any, field_path: FieldPath) -> Condition | None:
    """``condition`` (an AWorld dict, a ``ConditionBuilder``, an expstore ``Condition`` or
    None) as an expstore Condition over rows whose fields ``field_path`` locates."""
    if condition is None or isinstance(condition, Condition):
        return condition
    if isinstance(condition, Mapping):
        if not condition:
            return None  # AWorld: a falsy condition selects everything
        return _compile(condition, field_path)
    if hasattr(condition, "conditions") and hasattr(condition, "logical_ops"):
        folded = fold_builder(condition)
        return None if folded is None else _compile(folded, field_path)
    raise QueryError(
        "an AWorld condition is a dict ({'field', 'value', 'op'}, {'and_': [...]}, "
        "{'or_': [...]}), a ConditionBuilder, an expstore Condition or None; got "
        f"{type(condition).__name__}"
    )


def fold_builder(builder: Any) -> dict[str, Any] | None:
    """A ``ConditionBuilder``'s chain as AWorld's in-memory builder folds it: strictly left
    to right (``a or b and c`` is ``(a or b) and c``), ``nested`` builders first."""
    conditions: list[Any] = list(builder.conditions)
    operators: list[str] = list(builder.logical_ops)
    if not conditions:
        return None
    if len(operators) != len(conditions) - 1:
        raise QueryError(
            f"a ConditionBuilder with {len(conditions)} conditions needs "
            f"{len(conditions) - 1} and_()/or_() calls between them; it has {len(operators)}"
        )
    folded: dict[str, Any] = _unnest(conditions[0])
    for operator, item in zip(operators, conditions[1:], strict=True):
        folded = {operator: [folded, _unnest(item)]}
    return folded


def _unnest(item: Any) -> Any:
    if isinstance(item, Mapping) and "nested" in item:
        nested = item["nested"]
        return fold_builder(nested) if hasattr(nested, "logical_ops") else _unnest(nested)
    return item


def _compile(condition: Mapping[str, Any], field_path: FieldPath) -> Condition:
    if "field" in condition and "op" in condition:
        return _comparison(condition, field_path)
    for key, group in (("and_", And), ("or_", Or)):
        if key in condition:
            items = condition[key]
            if not isinstance(items, Sequence) or isinstance(items, str):
                raise QueryError(f"{key!r} takes a list of conditions; got {items!r}")
            if not items:
                return _everything() if key == "and_" else _nothing()
            parts = [_compile(_mapping(item), field_path) for item in items]
            return parts[0] if len(parts) == 1 else group(tuple(parts))
    # AWorld's ConditionFilter matches nothing for any other dict.
    return _nothing()


def _mapping(item: Any) -> Mapping[str, Any]:
    if not isinstance(item, Mapping):
        raise QueryError(f"a condition in an and_/or_ list is a dict; got {item!r}")
    return item


def _comparison(condition: Mapping[str, Any], field_path: FieldPath) -> Condition:
    name, op = condition["field"], condition["op"]
    if not isinstance(name, str) or not name:
        raise QueryError(f"a condition's field is a non-empty str; got {name!r}")
    path = field_path(name)
    value = condition.get("value")
    if op == "is_null":
        return Comparison(path, "is_null")
    if op == "is_not_null":
        return Comparison(path, "is_not_null")
    if op == "eq":
        return Comparison(path, "is_null") if value is None else Comparison(path, "eq", value)
    if op == "ne":
        if value is None:
            return Comparison(path, "is_not_null")
        return Or((Comparison(path, "ne", value), Comparison(path, "is_null")))
    if op in _COMPARE:
        if value is None:
            return _nothing()  # AWorld raises TypeError comparing None
        return Comparison(path, op, value)
    if op in ("in", "not_in"):
        return _membership(path, op, value)
    if op in ("like", "not_like"):
        if not isinstance(value, str):
            raise QueryError(f"{op} on {name!r} tests whether a text holds {value!r}; give a str")
        return Comparison(path, op, f"%{_literal(value)}%")
    raise QueryError(
        f"unknown AWorld operator {op!r} on {name!r}; expected eq, ne, gt, gte, lt, lte, "
        "in, not_in, like, not_like, is_null or is_not_null"
    )


def _membership(path: str, op: str, values: Any) -> Condition:
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(
        values, (list, tuple, set, frozenset)
    ):
        raise QueryError(f"{op} on {path!r} takes a list of values; got {values!r}")
    by_kind: dict[str, list[Any]] = {}
    with_none = False
    for value in values:
        if value is None:
            with_none = True
            continue
        kind = value_kind(value)
        if kind is None:
            raise QueryError(
                f"{op} on {path!r}: {value!r} ({type(value).__name__}) is not a str, number "
                "or bool, the values a stored field can be compared with"
            )
        by_kind.setdefault(kind, []).append(value)
    if op == "in":
        parts: list[Condition] = [Comparison(path, "in", tuple(v)) for v in by_kind.values()]
        if with_none:
            parts.append(Comparison(path, "is_null"))
        if not parts:
            return _nothing()
        return parts[0] if len(parts) == 1 else Or(tuple(parts))
    # not_in: a value of the list's types that is none of them; a null too unless None
    # is listed (expstore's not_in never matches a null).
    if not by_kind:  # nothing but None, or nothing at all
        return Comparison(path, "is_not_null") if with_none else _everything()
    parts = [Comparison(path, "not_in", tuple(v)) for v in by_kind.values()]
    if not with_none:
        parts.append(Comparison(path, "is_null"))
    return parts[0] if len(parts) == 1 else Or(tuple(parts))


def _literal(text: str) -> str:
    """``text`` as a LIKE pattern that matches it literally."""
    for special in _LIKE_SPECIALS:
        text = text.replace(special, "\\" + special)
    return text


def _everything() -> Condition:
    return Comparison("step", "gte", 0)


def _nothing() -> Condition:
    return Comparison("step", "lt", 0)
