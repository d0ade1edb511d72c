"""Compile a Condition into a SQLAlchemy Core boolean expression, for SQLite or Postgres.

Values are always bound parameters and field names never reach SQL text: a column field
becomes ``table.c.<column>``; a JSON path's keys and indexes are bound parameters too.

JSON values compare by type: a number matches only numbers, a string only strings, a bool
only booleans, and nothing ever casts, so a value of another type never matches and never
raises (casting a string to a number would fail on Postgres). Every comparison with a
missing path or a null yields NULL, which no WHERE accepts; conditions are only ever
combined with AND and OR, so NULL and false behave alike.

- Postgres: the path is a chain of ``->`` with bound keys (text) and indexes (integer), so
  a key never reads an array and an index never reads an object; as ``jsonb -> 0`` on a
  scalar returns the scalar, each index step also checks that it meets an array. ``eq`` and
  ``in_`` are jsonb equality with the value bound as JSONB (``node = '7'::jsonb``), which is
  type-aware and compares numbers as NUMERIC (so 7 = 7.0, and 0.1 matches a stored 0.1).
  The other operators add ``jsonb_typeof(node) = 'number'`` (or ``'string'``, ``'boolean'``)
  and compare jsonb with jsonb; strings are ordered and LIKE-matched on ``->>`` text, with
  ``COLLATE "C"`` (code point order, as in Python and SQLite) for ordering. Column equality
  keeps the column's collation, so the indexes stay usable.
- SQLite: the path is one bound JSON path string (``$."state"."url"``, ``$."actions"[0]``);
  the test is ``json_extract(data, path) <op> ?`` AND ``json_type(data, path) IN ('integer',
  'real')`` (``'text'`` for strings; ``'true'``/``'false'`` for booleans, which json_extract
  returns as 1/0). The comparison comes first, so the second parse only runs for rows whose
  value already matched.

LIKE is case-sensitive on both: Postgres uses ``LIKE ... ESCAPE '\\'``; SQLite, whose LIKE
ignores ASCII case, gets the pattern rewritten to GLOB (see :mod:`expstore.query._like`).
"""

from __future__ import annotations

import json
import operator
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from typing import cast as as_type

from sqlalchemy import (
    BigInteger,
    Boolean,
    Double,
    Integer,
    String,
    Table,
    Text,
    and_,
    bindparam,
    case,
    cast,
    false,
    func,
    not_,
    or_,
    select,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.elements import BindParameter, ColumnElement

from ..errors import QueryError
from ..model.layout import Kind
from ..model.paths import FieldPath
from ._like import ESCAPE, like_to_glob
from .conditions import And, Changed, Comparison, Condition, Or, as_condition

__all__ = ["DIALECTS", "ChangeFlags", "json_text", "sqlite_json_path", "to_sql"]

#: How ``changed()`` on a tracked path compiles: given the condition and the rows table, the
#: expression reading the path's flags, or None for a path no one tracks (then the compiler
#: probes the neighbour of each row). Given by the storage, which knows the tracked paths
#: (see :mod:`expstore.tracking.changes`).
ChangeFlags = Callable[[Changed, Table], "ColumnElement[bool] | None"]

_PG_TYPES: dict[Kind, str] = {"number": "number", "string": "string", "bool": "boolean"}
_SQLITE_TYPES: dict[Kind, tuple[str, ...]] = {
    "number": ("integer", "real"),
    "string": ("text",),
    "bool": ("true", "false"),
}
_ORDERING = frozenset({"gt", "gte", "lt", "lte", "between"})
_TEXT_OPS = _ORDERING | {"like", "not_like"}


def to_sql(
    condition: Condition | Mapping[str, Any] | None,
    table: Table,
    dialect_name: str,
    flags: ChangeFlags | None = None,
) -> ColumnElement[bool] | None:
    """The WHERE expression for ``condition`` over ``table``'s columns, or None for None.

    ``table`` has the columns of ``expstore.db.schema.rows``; ``dialect_name`` is
    ``"sqlite"`` or ``"postgresql"``; ``flags`` compiles ``changed()`` on tracked paths
    (see :data:`ChangeFlags`).

    >>> from expstore.db.schema import rows
    >>> print(to_sql({"field": "task_id", "value": "t1", "op": "eq"}, rows, "sqlite"))
    expstore_rows.task_id = :param_1
    """
    if dialect_name not in DIALECTS:
        raise QueryError(
            f"cannot compile conditions for the {dialect_name!r} dialect; "
            f"expstore supports {' and '.join(DIALECTS)}"
        )
    built = as_condition(condition)
    if built is None:
        return None
    return _COMPILERS[dialect_name](table, flags).condition(built)


def json_value(field: FieldPath, table: Table, dialect_name: str) -> ColumnElement[Any]:
    """The expression that equality and number comparisons at ``field``'s payload path
    compare (a jsonb node on Postgres, ``json_extract(data, '$.path')`` on SQLite): an index
    on it serves them (see :mod:`expstore.db.path_indexes`)."""
    return _COMPILERS[dialect_name](table).json_value(field)


def json_text(
    field: FieldPath, table: Table, dialect_name: str, *, sqlite_arrow: bool = True
) -> ColumnElement[Any]:
    """The JSON text of the value at ``field``'s path (``'"easy"'``, ``'3'``, ``'true'``,
    ``'null'``), NULL where the path reaches nothing; read by the same path rules as the
    conditions (an index step must meet a list, a key a dict).

    SQLite: ``data -> path`` (3.38 and later); with ``sqlite_arrow=False`` an expression of
    ``json_type`` and ``json_quote(json_extract(...))`` that older versions understand.
    """
    return _COMPILERS[dialect_name](table).json_text(field, sqlite_arrow=sqlite_arrow)


def sqlite_json_path(top: str, path: Sequence[str | int], *, ensure_ascii: bool = True) -> str:
    """The SQLite JSON path for a payload field and its path: ``$."state"."url"``.

    Keys are written as quoted labels, spelled as ``json.dumps`` spells them in the stored
    document: SQLite before 3.45 compares a label with the key's text as stored, escapes and
    all (3.45 and later decode both sides), so a non-ASCII key is tried both escaped and raw.
    Keys holding ``"`` are refused in conditions by
    :func:`~expstore.query.fields.resolve_field`: SQLite before 3.45 ends a label at the first
    ``"``, escaped or not.
    """
    parts = ["$"]
    for segment in (top, *path):
        if isinstance(segment, int):
            parts.append(f"[{segment}]")
        else:
            parts.append(f'."{json.dumps(segment, ensure_ascii=ensure_ascii)[1:-1]}"')
    return "".join(parts)


def _jsonb(value: Any) -> BindParameter[Any]:
    """A value bound as JSONB (``%(param)s::JSONB``), for Postgres' type-aware jsonb comparison."""
    return bindparam(None, value, type_=JSONB())


def _bind(value: Any) -> BindParameter[Any]:
    """A bound parameter typed by the Python value, never by the column it meets.

    (Typing it by the column would make psycopg cast ``2.5`` to ``BIGINT`` against ``step``.)
    """
    if isinstance(value, bool):
        return bindparam(None, value, type_=Boolean())
    if isinstance(value, int):
        return bindparam(None, value, type_=BigInteger())
    if isinstance(value, float):
        return bindparam(None, value, type_=Double())
    return bindparam(None, value, type_=String())


#: How many terms one AND/OR of the SQL holds before the compiler nests it: SQLite parses
#: ``a OR b OR c ...`` as a left-deep tree and refuses one deeper than 1,000.
_WIDE = 64


def _balanced(join: Any, parts: list[Any]) -> Any:
    """``join(*parts)``, as parenthesised groups of at most _WIDE terms when wider (the
    same logic, with an expression depth of about _WIDE per level, log_WIDE(n) levels)."""
    if len(parts) <= _WIDE:
        return join(*parts)
    size = -(-len(parts) // _WIDE)
    chunks = [_balanced(join, parts[i : i + size]) for i in range(0, len(parts), size)]
    return _Joined("AND" if join is and_ else "OR", chunks)


class _Joined(ColumnElement[bool]):
    """``(a) OR (b) OR ...`` kept as written: SQLAlchemy's ``or_`` flattens nested ORs
    back into one long chain, which is what SQLite cannot parse."""

    inherit_cache = False
    type = Boolean()

    def __init__(self, word: str, parts: list[Any]) -> None:
        self.word = word
        self.parts = parts


@compiles(_Joined)
def _render_joined(element: _Joined, compiler: Any, **kw: Any) -> str:
    joined = f" {element.word} ".join(f"({compiler.process(p, **kw)})" for p in element.parts)
    return f"({joined})"


class _Compiler(ABC):
    """Conditions to SQL: what both dialects share here, their differences in subclasses."""

    def __init__(self, table: Table, flags: ChangeFlags | None = None) -> None:
        self.table = table
        self.flags = flags

    def condition(self, condition: Condition) -> ColumnElement[bool]:
        if isinstance(condition, And):
            return as_type(
                "ColumnElement[bool]",
                _balanced(and_, [self.condition(c) for c in condition.conditions]),
            )
        if isinstance(condition, Or):
            return as_type(
                "ColumnElement[bool]",
                _balanced(or_, [self.condition(c) for c in condition.conditions]),
            )
        if isinstance(condition, Changed):
            return self.changed(condition)
        assert isinstance(condition, Comparison)
        return self.comparison(condition)

    def change_key(self, target: FieldPath) -> ColumnElement[Any]:
        """What ``changed(field)`` compares: a column's value; for a payload path the
        digest of an array stored by digest, NULL for an array in the row's blob (its bytes
        are not visible to SQL), else the JSON text of the value."""
        if target.column is not None:
            return self.table.c[target.column.name]
        tensor = FieldPath(target.text, None, target.top, (*target.steps, "__tensor__"))
        digest = FieldPath(target.text, None, target.top, (*tensor.steps, "digest"))
        # The digest first: one look into the document when there is one (the common case).
        return func.coalesce(
            self.json_value_text(digest),
            case((self.json_type(tensor).is_(None), self.json_text(target))),
        )

    def changed(self, c: Changed) -> ColumnElement[bool]:
        """The value at ``c.target`` compared with the previous step of the same trajectory
        (same buffer and task_id, the largest step below this row's; or the next, the
        smallest above), found by a correlated probe of the ``(buffer_id, task_id, step)``
        index; on a tracked path, the flags the storage keeps (see :data:`ChangeFlags`)."""
        table = self.table
        if self.flags is not None:
            tracked = self.flags(c, table)
            if tracked is not None:
                return tracked
        forward = c.towards == "next"
        other = table.alias("expstore_next" if forward else "expstore_previous")
        here = self.change_key(c.target)
        there = type(self)(other).change_key(c.target)  # type: ignore[arg-type]
        step, key = other.c.step, other.c.key
        earlier = (
            select(there)
            .where(
                other.c.buffer_id == table.c.buffer_id,
                other.c.task_id == table.c.task_id,
                step > table.c.step if forward else step < table.c.step,
            )
            .order_by(*((step.asc(), key.asc()) if forward else (step.desc(), key.desc())))
            .limit(1)
            .correlate(table)
            .scalar_subquery()
        )
        same = here == earlier  # NULL (unknown) when either is NULL
        if c.changed:
            return not_(func.coalesce(same, false()))
        return as_type("ColumnElement[bool]", func.coalesce(same, false()))

    def comparison(self, c: Comparison) -> ColumnElement[bool]:
        op, target = c.op, c.target
        if op in ("is_null", "is_not_null"):
            return self.null_test(target, is_null=op == "is_null")
        if op == "in" and not c.value:
            return false()
        if op == "not_in" and not c.value:
            return self.null_test(target, is_null=False)
        if target.column is None:
            return self.json_comparison(c, target)
        operand: ColumnElement[Any] = self.table.c[target.column.name]
        if c.kind == "string" and op in _ORDERING:
            operand = self.in_code_point_order(operand)
        return self.test(op, operand, c.value, _bind)

    def test(
        self,
        op: str,
        operand: ColumnElement[Any],
        value: Any,
        bind: Callable[[Any], BindParameter[Any]],
    ) -> ColumnElement[bool]:
        """``operand op value``, with values bound by ``bind``."""
        if op in ("like", "not_like"):
            return as_type(
                "ColumnElement[bool]", self.like(operand, value, negated=op == "not_like")
            )
        if op in ("in", "not_in"):
            binds = [bind(v) for v in value]
            return operand.in_(binds) if op == "in" else operand.not_in(binds)
        if op == "between":
            return operand.between(bind(value[0]), bind(value[1]))
        compare = {
            "eq": operator.eq,
            "ne": operator.ne,
            "gt": operator.gt,
            "gte": operator.ge,
            "lt": operator.lt,
            "lte": operator.le,
        }[op]
        return compare(operand, bind(value))  # type: ignore[no-any-return]

    def null_test(self, target: FieldPath, is_null: bool) -> ColumnElement[bool]:
        if target.column is not None:
            column = self.table.c[target.column.name]
            return column.is_(None) if is_null else column.is_not(None)
        json_type = self.json_type(target)
        null = _bind("null")
        if is_null:
            return func.coalesce(json_type, null) == null
        return json_type != null

    # What each dialect does its own way -----------------------------------------------------
    @abstractmethod
    def json_comparison(self, c: Comparison, target: FieldPath) -> ColumnElement[bool]:
        """A comparison of the JSON value at a payload path, true only for its own type."""

    @abstractmethod
    def json_type(self, target: FieldPath) -> ColumnElement[Any]:
        """The JSON type name of the value at a payload path; NULL where there is none."""

    @abstractmethod
    def json_text(self, target: FieldPath, *, sqlite_arrow: bool = True) -> ColumnElement[Any]:
        """The JSON text of the value at a payload path; NULL where there is none."""

    @abstractmethod
    def json_value(self, target: FieldPath) -> ColumnElement[Any]:
        """The expression equality and number comparisons at a payload path compare:
        what an index serving them must be built on."""

    @abstractmethod
    def json_value_text(self, target: FieldPath) -> ColumnElement[Any]:
        """The string at a payload path as SQL text (NULL where there is none)."""

    @abstractmethod
    def like(self, operand: ColumnElement[Any], pattern: str, *, negated: bool) -> Any:
        """A case-sensitive LIKE with ``\\`` as the escape character."""

    def in_code_point_order(self, operand: ColumnElement[Any]) -> ColumnElement[Any]:
        """``operand`` ordered by code point, as Python orders strings."""
        return operand


class _PostgresCompiler(_Compiler):
    """Paths are chains of ``->`` with bound keys (text) and indexes (integer); equality is
    jsonb equality with the value bound as JSONB."""

    def in_code_point_order(self, operand: ColumnElement[Any]) -> ColumnElement[Any]:
        return operand.collate("C")

    def like(self, operand: ColumnElement[Any], pattern: str, *, negated: bool) -> Any:
        if negated:
            return operand.not_like(_bind(pattern), escape=ESCAPE)
        return operand.like(_bind(pattern), escape=ESCAPE)

    def step(self, node: ColumnElement[Any], segment: str | int, op: str) -> Any:
        key = bindparam(None, segment, type_=Integer() if isinstance(segment, int) else Text())
        return node.op(op, return_type=Text() if op == "->>" else JSONB())(key)

    def path(
        self, target: FieldPath
    ) -> tuple[ColumnElement[Any], str | int, list[ColumnElement[bool]]]:
        """The node holding the path's last segment, that segment, and the array checks.

        ``jsonb -> 0`` on a scalar returns the scalar itself (Postgres stores a scalar as a
        one-element pseudo-array), so every index step is checked to meet an array.
        """
        *prefix, last = (str(target.top), *target.steps)
        node: ColumnElement[Any] = self.table.c.data
        arrays: list[ColumnElement[bool]] = []
        for segment in prefix:
            if isinstance(segment, int):
                arrays.append(func.jsonb_typeof(node) == _bind("array"))
            node = self.step(node, segment, "->")
        if isinstance(last, int):
            arrays.append(func.jsonb_typeof(node) == _bind("array"))
        return node, last, arrays

    def json_type(self, target: FieldPath) -> ColumnElement[Any]:
        """``jsonb_typeof(node)``, or NULL when an index step did not meet an array."""
        parent, last, arrays = self.path(target)
        node = self.step(parent, last, "->")
        if not arrays:
            return func.jsonb_typeof(node)
        return case((and_(*arrays), func.jsonb_typeof(node)))

    def json_text(self, target: FieldPath, *, sqlite_arrow: bool = True) -> ColumnElement[Any]:
        parent, last, arrays = self.path(target)
        text = cast(self.step(parent, last, "->"), Text)
        return case((and_(*arrays), text)) if arrays else text

    def json_value(self, target: FieldPath) -> ColumnElement[Any]:
        parent, last, _ = self.path(target)
        return self.step(parent, last, "->")  # type: ignore[no-any-return]

    def json_value_text(self, target: FieldPath) -> ColumnElement[Any]:
        parent, last, _ = self.path(target)
        return self.step(parent, last, "->>")  # type: ignore[no-any-return]

    def json_comparison(self, c: Comparison, target: FieldPath) -> ColumnElement[bool]:
        assert c.kind is not None
        parent, last, arrays = self.path(target)
        node = self.step(parent, last, "->")
        checks = list(arrays)
        if c.kind == "string" and c.op in _TEXT_OPS:
            text = self.step(parent, last, "->>")
            operand = text.collate("C") if c.op in _ORDERING else text
            compared = self.test(c.op, operand, c.value, _bind)
        else:
            compared = self.test(c.op, node, c.value, _jsonb)
        if c.op not in ("eq", "in"):  # jsonb equality already tells types apart
            checks.append(func.jsonb_typeof(node) == _bind(_PG_TYPES[c.kind]))
        return and_(*checks, compared)


class _SqliteCompiler(_Compiler):
    """A path is one bound JSON path string; values are read with ``json_extract`` and
    told apart by ``json_type``; LIKE becomes a case-sensitive GLOB."""

    def like(self, operand: ColumnElement[Any], pattern: str, *, negated: bool) -> Any:
        glob = operand.op("GLOB", is_comparison=True)(_bind(like_to_glob(pattern)))
        return not_(glob) if negated else glob

    def call(self, name: str, paths: list[BindParameter[Any]]) -> ColumnElement[Any]:
        """``name(data, path)``, or the first non-null of it over several spellings."""
        data = self.table.c.data
        calls = [getattr(func, name)(data, path) for path in paths]
        return calls[0] if len(calls) == 1 else func.coalesce(*calls)

    def paths(self, target: FieldPath) -> list[BindParameter[Any]]:
        """The path, once; twice (escaped and raw) when a key is not ASCII. Paths are
        rendered into the SQL as literals (by SQLAlchemy, escaped) when the statement runs:
        SQLite uses an index on ``json_extract(data, '$.path')`` (see
        :mod:`expstore.db.path_indexes`) only for the same literal path, never for a
        bound one."""
        escaped = sqlite_json_path(str(target.top), target.steps)
        raw = sqlite_json_path(str(target.top), target.steps, ensure_ascii=False)
        found = [escaped] if raw == escaped else [escaped, raw]
        return [bindparam(None, path, type_=String(), literal_execute=True) for path in found]

    def json_type(self, target: FieldPath) -> ColumnElement[Any]:
        return self.call("json_type", self.paths(target))

    def json_text(self, target: FieldPath, *, sqlite_arrow: bool = True) -> ColumnElement[Any]:
        """``data -> path`` (3.38 and later); with ``sqlite_arrow=False`` an expression of
        ``json_type`` and ``json_quote(json_extract(...))`` that older versions understand."""
        data = self.table.c.data
        texts: list[ColumnElement[Any]]
        if sqlite_arrow:
            texts = [data.op("->", return_type=Text())(path) for path in self.paths(target)]
        else:
            # json_extract gives true/false as 1/0, so booleans are spelled from their type;
            # json_quote leaves an object or array that json_extract returned as it is.
            texts = [
                case(
                    (
                        func.json_type(data, path).in_(["true", "false"]),
                        func.json_type(data, path),
                    ),
                    (
                        func.json_type(data, path).is_not(None),
                        func.json_quote(func.json_extract(data, path)),
                    ),
                )
                for path in self.paths(target)
            ]
        return texts[0] if len(texts) == 1 else func.coalesce(*texts)

    def json_value(self, target: FieldPath) -> ColumnElement[Any]:
        return self.call("json_extract", self.paths(target))

    def json_value_text(self, target: FieldPath) -> ColumnElement[Any]:
        return self.call("json_extract", self.paths(target))

    def json_comparison(self, c: Comparison, target: FieldPath) -> ColumnElement[bool]:
        assert c.kind is not None
        paths = self.paths(target)
        compared = self.test(c.op, self.call("json_extract", paths), c.value, _bind)
        json_type = self.call("json_type", paths)
        names = _SQLITE_TYPES[c.kind]
        if len(names) == 1:
            is_kind = json_type == _bind(names[0])
        else:
            is_kind = json_type.in_([_bind(name) for name in names])
        # The comparison first: SQLite stops at the first false term, so the type is only
        # looked up (a second parse of the document) for rows whose value already matched.
        return and_(compared, is_kind)


#: The compiler of each dialect to_sql() compiles for.
_COMPILERS: dict[str, type[_Compiler]] = {
    "sqlite": _SqliteCompiler,
    "postgresql": _PostgresCompiler,
}
#: The SQLAlchemy dialect names to_sql() compiles for.
DIALECTS = tuple(_COMPILERS)
