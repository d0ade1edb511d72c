"""SQL against Python: SQLite, Postgres and ``matches()`` select the same rows.

One fixed, seeded random set of rows is stored once per backend (a buffer of its own);
Hypothesis then draws conditions (every operator, nesting to depth 4, JSON paths that are
present, missing, null or of another type, strings holding ``%``, ``_``, quotes, ``;``,
``--``, backslashes and non-ASCII text) and checks that the ids each backend returns equal
the ids ``matches()`` accepts. Without a Postgres server (and without EXPSTORE_REQUIRE_PG=1)
the check runs SQLite against Python only.
"""

from __future__ import annotations

import math
import random
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from expstore import DataRow, Experience, ExpMeta, ReplayBuffer
from expstore.model.layout import COLUMNS
from expstore.model.paths import parse_path
from expstore.query import And, Comparison, Condition, Or

TRICKY_STRINGS = [
    "",
    "a",
    "A",
    "abc",
    "ABC",
    "aBc",
    "100%",
    "50_50",
    "a%b",
    "a_b",
    "it's",
    'say "hi"',
    "x'; DROP TABLE expstore_rows; --",
    "--",
    ";",
    "back\\slash",
    "é",
    "É",
    "日本語",
    "😀",
    "tab\there",
    "line\nbreak",
    "[x]",
    "*?",
    "https://a.example/p?q=1",
    "Https://A.example",
    "1",
    "true",
    "null",
]
NUMBERS: list[int | float] = [
    0,
    1,
    -1,
    2,
    3,
    7,
    100,
    0.1,
    0.5,
    -0.0,
    1.5,
    2.5,
    1e-7,
    1e20,
    0.30000000000000004,
    2**53,
    -(2**53),
    1 / 3,
]
PATTERNS = [
    "%",
    "_",
    "a%",
    "A%",
    "%b%",
    "a\\%b",
    "a\\_b",
    "a_b",
    "100\\%",
    "%\\\\%",
    "https://a%",
    "%'%",
    "%;%",
    "é%",
    "_%_",
    "[x]",
    "*?",
    "",
]

JSON_FIELDS = [
    "exp_data.state",
    "exp_data.state.url",
    "exp_data.state.n",
    "exp_data.state.flag",
    "exp_data.state.clé",
    "exp_data.state.odd key'; --",
    "exp_data.state.nested.a",
    "exp_data.state.nested.b.0",
    "exp_data.state.tags.0",
    "exp_data.state.tags.1",
    "exp_data.state.url.deeper",
    "exp_data.actions.0",
    "exp_data.actions.0.name",
    "exp_data.actions.1.score",
    "exp_data.messages.0.content",
    "exp_data.next_state",
    "exp_data.ext_info.v",
    "exp_data.ext_info.policy_version",
    "exp_data.ext_info.nan",
    "exp_data.ext_info.missing",
]
COLUMN_NAMES = [c.path for c in COLUMNS] + [
    "id",
    "task_id",
    "agent_id",
    "step",
    "reward_t",
    "pre_agent",
    "done",
]
FIELDS = COLUMN_NAMES + JSON_FIELDS


class Page(BaseModel):
    url: str
    n: int
    tags: tuple[str, ...]


def _scalar(rnd: random.Random) -> Any:
    kind = rnd.choice(["string", "string", "number", "number", "bool", "null"])
    if kind == "string":
        return rnd.choice(TRICKY_STRINGS)
    if kind == "number":
        return rnd.choice(NUMBERS)
    if kind == "bool":
        return rnd.choice([True, False])
    return None


def _value(rnd: random.Random, depth: int = 0) -> Any:
    roll = rnd.random()
    if depth < 2 and roll < 0.1:
        return [_value(rnd, depth + 1) for _ in range(rnd.randint(0, 3))]
    if depth < 2 and roll < 0.18:
        return {k: _value(rnd, depth + 1) for k in rnd.sample(["a", "b", "url"], rnd.randint(0, 2))}
    return _scalar(rnd)


def _maybe(rnd: random.Random, keys: list[str]) -> dict[str, Any]:
    return {key: _value(rnd) for key in keys if rnd.random() < 0.7}


def make_rows(n: int = 90, seed: int = 20240601) -> list[DataRow]:
    rnd = random.Random(seed)
    rows = []
    for i in range(n):
        state: Any = _maybe(rnd, ["url", "n", "flag", "clé", "odd key'; --", "tags"])
        if rnd.random() < 0.5:
            state["nested"] = {"a": _scalar(rnd), "b": [_scalar(rnd), _scalar(rnd)]}
        actions = [_maybe(rnd, ["name", "score"]) for _ in range(rnd.randint(0, 2))]
        ext_info = _maybe(rnd, ["v", "policy_version"])
        next_state = _value(rnd)
        if i % 15 == 0:  # a pydantic model: stored and matched as its dump (tuples as lists)
            state = Page(url=rnd.choice(TRICKY_STRINGS), n=rnd.randint(0, 3), tags=("a", "B"))
        if i % 15 == 1:  # a bare string state
            state = rnd.choice(TRICKY_STRINGS)
        if i % 15 == 2:  # placeholders the codec writes: never numbers, never null
            ext_info["nan"] = float("nan")
            ext_info["v"] = np.arange(3)
        if i % 15 == 3:  # a user dict with a reserved key is stored escaped
            ext_info["nan"] = {"__float__": "nan"}
        reward = rnd.choice([None, *[float(x) for x in NUMBERS]])
        rows.append(
            DataRow(
                id=f"r{i:03d}",
                exp_meta=ExpMeta(
                    task_id=rnd.choice(["t1", "t2", "T1", "t%", "t_1", "it's"]),
                    task_name=rnd.choice(["", "web", "Web", "web_nav"]),
                    agent_id=rnd.choice(["a1", "a2", "A1", "é"]),
                    step=rnd.randint(0, 5),
                    execute_time=rnd.choice([0.0, 1.5, 1e9, 1700000000.25]),
                    pre_agent=rnd.choice([None, "a1", "a2", ""]),
                ),
                exp_data=Experience(
                    state=state,
                    actions=actions,
                    reward_t=reward if reward is None or math.isfinite(reward) else None,
                    adv_t=rnd.choice([None, 0.5, -1.0]),
                    v_t=rnd.choice([None, 0.25]),
                    messages=[{"role": "user", "content": rnd.choice(TRICKY_STRINGS)}]
                    if rnd.random() < 0.5
                    else None,
                    done=rnd.random() < 0.3,
                    next_state=next_state,
                    ext_info=ext_info,
                ),
            )
        )
    return rows


ROWS = make_rows()

# -- conditions -------------------------------------------------------------------------------

_TEXT = st.text(
    alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"),
    max_size=5,
)
_STRINGS = st.one_of(st.sampled_from(TRICKY_STRINGS), _TEXT)
_NUMBERS = st.one_of(
    st.sampled_from(NUMBERS),
    st.integers(-10, 10),
    st.integers(-(2**53), 2**53),
    st.floats(allow_nan=False, allow_infinity=False),
)
_PATTERN_CHARS = st.sampled_from(
    ["%", "_", "\\%", "\\_", "\\\\", "a", "A", "b", "é", "'", "*", "[", "1"]
)
_PATTERNS = st.one_of(st.sampled_from(PATTERNS), st.lists(_PATTERN_CHARS, max_size=5).map("".join))
_VALUES = {"string": _STRINGS, "number": _NUMBERS, "bool": st.booleans()}


@st.composite
def comparisons(draw: st.DrawFn) -> Comparison:
    field = draw(st.sampled_from(FIELDS))
    column = parse_path(field).column
    kind = column.kind if column else draw(st.sampled_from(["string", "number", "bool"]))
    ops = ["eq", "ne", "in", "not_in", "is_null", "is_not_null"]
    if kind != "bool":
        ops += ["gt", "gte", "lt", "lte", "between"]
    if kind == "string":
        ops += ["like", "not_like"]
    op = draw(st.sampled_from(ops))
    values = _VALUES[kind]
    if op in ("is_null", "is_not_null"):
        return Comparison(field, op)
    if op in ("in", "not_in"):
        return Comparison(field, op, draw(st.lists(values, max_size=4)))
    if op == "between":
        return Comparison(field, op, (draw(values), draw(values)))
    if op in ("like", "not_like"):
        return Comparison(field, op, draw(_PATTERNS))
    return Comparison(field, op, draw(values))


def conditions(depth: int) -> st.SearchStrategy[Condition]:
    if depth == 0:
        return comparisons()
    children = st.lists(conditions(depth - 1), min_size=1, max_size=3).map(tuple)
    return st.one_of(
        comparisons(),
        children.map(And),
        children.map(Or),
    )


# -- backends ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def buffers(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, ReplayBuffer]]:
    name = f"qdiff_{uuid.uuid4().hex[:12]}"
    urls = {"sqlite": f"sqlite:///{tmp_path_factory.mktemp('qdiff') / 'rows.db'}"}
    try:
        urls["postgresql"] = request.getfixturevalue("pg_database")
    except pytest.skip.Exception:
        pass  # no server and not required: SQLite against Python only
    opened = {backend: ReplayBuffer(url, name=name) for backend, url in urls.items()}
    for buffer in opened.values():
        buffer.store_batch(ROWS)
    yield opened
    for buffer in opened.values():
        buffer.clear()
        buffer.close()


def python_ids(condition: Condition) -> set[str]:
    return {row.id for row in ROWS if condition.matches(row)}


def test_the_row_set_is_stored_whole(buffers: dict[str, ReplayBuffer]) -> None:
    for buffer in buffers.values():
        assert buffer.count() == len(ROWS)


@pytest.mark.parametrize(
    "condition",
    [
        Comparison("exp_data.state.url", "like", "https://a%"),
        Comparison("exp_data.state.n", "gte", 1),
        Comparison("exp_data.state.tags.1", "eq", "B"),
        Comparison("exp_data.ext_info.v", "ne", 0.1),
        Comparison("exp_data.state.clé", "is_not_null"),
        Comparison("exp_data.state.odd key'; --", "not_in", []),
        Comparison("task_id", "like", "t\\%"),
        Comparison("exp_data.actions.1.score", "is_null"),
    ],
    ids=str,
)
def test_fixed_conditions_select_some_but_not_all_rows_everywhere(
    buffers: dict[str, ReplayBuffer], condition: Condition
) -> None:
    expected = python_ids(condition)
    assert 0 < len(expected) < len(ROWS)  # the row set exercises the condition
    for buffer in buffers.values():
        assert {row.id for row in buffer.query(condition)} == expected


@settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(condition=conditions(4))
def test_sqlite_postgres_and_python_select_the_same_rows(
    buffers: dict[str, ReplayBuffer], condition: Condition
) -> None:
    expected = python_ids(condition)
    for backend, buffer in buffers.items():
        got = {row.id for row in buffer.query(condition)}
        assert got == expected, f"{backend}: {condition}"
    assert Condition.from_dict(condition.to_dict()) == condition
