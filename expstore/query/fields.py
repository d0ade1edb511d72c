"""Fields in conditions: a field path (see :mod:`expstore.model.paths`) that SQL can compare.

Conditions read fields with the one path grammar of :func:`expstore.model.paths.parse_path`. One
more rule holds for them: a dict key holding a ``"`` cannot be compared on, since SQLite
before 3.45 ends a JSON path label at the first ``"``, escaped or not (converters and
fetches read such keys in Python).
"""

from __future__ import annotations

from ..errors import QueryError
from ..model.layout import Kind
from ..model.paths import FieldPath, parse_path

__all__ = ["FieldPath", "Kind", "resolve_field"]


def resolve_field(field: object) -> FieldPath:
    """The column or JSON path ``field`` names; QueryError listing the valid ones otherwise."""
    path = parse_path(field)  # type: ignore[arg-type]
    for step in path.steps:
        if type(step) is str and '"' in step:
            raise QueryError(
                f"field {field!r}: the key {step!r} holds a double quote, which SQLite's JSON "
                'paths cannot address; store the value under a key without "'
            )
    return path
