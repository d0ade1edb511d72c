"""The ``--where`` language: a small, safe text form of query conditions.

:func:`parse_where` turns text into a :class:`~expstore.query.Condition` with a hand-written
tokenizer and recursive-descent parser; nothing is ever evaluated. The grammar::

    condition  := conjunction ( OR conjunction )*
    conjunction:= primary ( AND primary )*            -- AND binds tighter than OR
    primary    := "(" condition ")" | comparison
    comparison := field ( "=" | "!=" | "<>" | ">" | ">=" | "<" | "<=" ) value
                | field [NOT] IN "(" [ value ( "," value )* ] ")"
                | field [NOT] LIKE string
                | field [NOT] BETWEEN value AND value
                | field IS [NOT] NULL
    value      := string | number | TRUE | FALSE
    field      := name ( "." name | "." digits )*  |  "double-quoted field"

Keywords are case-insensitive; strings take single quotes with ``''`` for a quote inside;
numbers are ints or floats (``3``, ``-0.5``, ``1e-3``). Fields are those of
:mod:`expstore.query` (``task_id``, ``exp_meta.step``, ``exp_data.state.url``...). This is
what ``str(condition)`` prints, so ``parse_where(str(c)) == c``.

>>> print(parse_where("task_id = 't1' and (agent_id in ('a', 'b') or step >= 3)"))
task_id = 't1' AND (agent_id IN ('a', 'b') OR step >= 3)

Errors are :class:`~expstore.QueryError` naming the column, with the text and a caret::

    column 11: expected a value after '=', got 'and'
      task_id = and step > 1
                ^
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import QueryError
from .conditions import MAX_CONDITION_DEPTH, And, Comparison, Condition, Or

__all__ = ["parse_where"]

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
                "(!=, not in, not like, is not null)"
            )
        return self.comparison()

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
