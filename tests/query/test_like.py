"""LIKE patterns: the SQLite GLOB rewrite and the Python regex agree, case-sensitively."""

from __future__ import annotations

import sqlite3

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from expstore.errors import QueryError
from expstore.query._like import check_pattern, like_to_glob, like_to_regex

PIECES = ["%", "_", "\\%", "\\_", "\\\\", "\\a", "a", "A", "*", "?", "[", "]", "^", "é", "\n"]
TEXT = st.text(alphabet=st.sampled_from(["a", "A", "%", "_", "\\", "*", "?", "[", "]", "é", "\n"]))


@settings(max_examples=300, deadline=None)
@given(pattern=st.lists(st.sampled_from(PIECES), max_size=6).map("".join), text=TEXT)
def test_sqlite_glob_rewrite_matches_exactly_what_the_regex_matches(
    pattern: str, text: str
) -> None:
    with sqlite3.connect(":memory:") as conn:
        (glob,) = conn.execute("SELECT ? GLOB ?", (text, like_to_glob(pattern))).fetchone()
    assert bool(glob) == (like_to_regex(pattern).fullmatch(text) is not None)


@pytest.mark.parametrize(
    ("pattern", "text", "expected"),
    [
        ("a%", "abc", True),
        ("a%", "Abc", False),  # case-sensitive, unlike SQLite's LIKE
        ("a_c", "abc", True),
        ("a_c", "ac", False),
        ("100\\%", "100%", True),
        ("100\\%", "1000", False),
        ("a\\_b", "a_b", True),
        ("a\\_b", "axb", False),
        ("a\\\\b", "a\\b", True),
        ("%", "line\nbreak", True),
        ("[x]", "[x]", True),
        ("[x]", "x", False),
    ],
)
def test_like_semantics(pattern: str, text: str, expected: bool) -> None:
    assert (like_to_regex(pattern).fullmatch(text) is not None) is expected


def test_glob_rewrite_brackets_the_characters_glob_treats_specially() -> None:
    assert like_to_glob("*?[%_\\%\\_]") == "[*][?][[]*?%_]"


def test_pattern_ending_in_a_lone_escape_is_refused() -> None:
    with pytest.raises(QueryError, match=r"ends with the escape character \\; write \\\\"):
        check_pattern("50\\")
