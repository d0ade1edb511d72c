"""SQL LIKE patterns, read once and rewritten for Python and for SQLite.

``%`` matches any run of characters (including none), ``_`` exactly one character, and the
escape character, a backslash, makes the character after it literal: ``50\\%`` matches the
text ``50%``, ``a\\_b`` matches ``a_b``, ``\\\\`` a single backslash. A pattern may not end
with a lone backslash. Matching is case-sensitive and covers the whole string.

Postgres runs the pattern as written (``LIKE ... ESCAPE '\\'``, case-sensitive there).
SQLite's LIKE ignores ASCII case, and ``PRAGMA case_sensitive_like`` is per connection and
deprecated, so on SQLite the pattern is rewritten into an equivalent GLOB pattern, which is
case-sensitive: ``%`` becomes ``*``, ``_`` becomes ``?``, and the literal characters GLOB
treats specially (``*``, ``?``, ``[``) become one-character classes (``[*]``, ``[?]``,
``[[]``). Python uses an equivalent regular expression.
"""

from __future__ import annotations

import re
from typing import Literal

from ..errors import QueryError

__all__ = ["ESCAPE", "check_pattern", "like_to_glob", "like_to_regex"]

#: The LIKE escape character.
ESCAPE = "\\"

Token = tuple[Literal["any", "one", "lit"], str]


def _tokens(pattern: str) -> list[Token]:
    tokens: list[Token] = []
    chars = iter(pattern)
    for char in chars:
        if char == ESCAPE:
            literal = next(chars, None)
            if literal is None:
                raise QueryError(
                    f"LIKE pattern {pattern!r} ends with the escape character \\; "
                    "write \\\\ to match a backslash"
                )
            tokens.append(("lit", literal))
        elif char == "%":
            tokens.append(("any", ""))
        elif char == "_":
            tokens.append(("one", ""))
        else:
            tokens.append(("lit", char))
    return tokens


def check_pattern(pattern: str) -> None:
    """Raise QueryError if ``pattern`` is not a valid LIKE pattern."""
    _tokens(pattern)


def like_to_regex(pattern: str) -> re.Pattern[str]:
    """A compiled regular expression matching exactly what ``pattern`` matches (fullmatch)."""
    parts = []
    for kind, char in _tokens(pattern):
        if kind == "any":
            parts.append(".*")
        elif kind == "one":
            parts.append(".")
        else:
            parts.append(re.escape(char))
    return re.compile("".join(parts), re.DOTALL)


def like_to_glob(pattern: str) -> str:
    """The SQLite GLOB pattern matching exactly what LIKE ``pattern`` matches, case-sensitively."""
    parts = []
    for kind, char in _tokens(pattern):
        if kind == "any":
            parts.append("*")
        elif kind == "one":
            parts.append("?")
        elif char in "*?[":
            parts.append(f"[{char}]")
        else:
            parts.append(char)
    return "".join(parts)
