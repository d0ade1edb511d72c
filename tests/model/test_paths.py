"""One path grammar: queries, converters, field fetches and key indexes read a path alike."""

from __future__ import annotations

from typing import Any

import pytest

from expstore import NumpyConverter, QueryBuilder, QueryError, ReplayBuffer
from expstore.model.paths import MISSING, parse_path, read_path
from tests.helpers import make_row


@pytest.mark.parametrize(
    ("text", "canonical", "steps"),
    [
        ("exp_data.actions.1", "exp_data.actions.1", (1,)),
        ("exp_data.actions.\u0661", "exp_data.actions.\u0661", ("\u0661",)),  # Arabic-Indic 1
        ("exp_data.state.01", "exp_data.state.01", ("01",)),
        ("exp_data.state.-1", "exp_data.state.-1", ("-1",)),
        ("state.url", "exp_data.state.url", ("url",)),
        ("actions.0.name", "exp_data.actions.0.name", (0, "name")),
    ],
)
def test_only_ascii_digits_without_a_leading_zero_are_list_indexes(
    text: str, canonical: str, steps: tuple[Any, ...]
) -> None:
    path = parse_path(text)
    assert (path.canonical, path.steps) == (canonical, steps)


@pytest.mark.parametrize("text", ["step", "exp_meta.step", "reward_t", "exp_data.reward_t", "id"])
def test_columns_by_bare_or_full_name(text: str) -> None:
    assert parse_path(text).column is not None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("exp_meta.step.0", "is a column holding a single number"),
        ("exp_data", "needs a field after 'exp_data'"),
        ("colour", "unknown field 'colour'"),
        ("exp_data.state..x", "empty path segment"),
        ("exp_data.actions.99999999999", "list index 99999999999 is too large"),
    ],
)
def test_bad_paths_are_refused_alike_everywhere(text: str, message: str) -> None:
    with pytest.raises(QueryError, match=message):
        parse_path(text)
    with pytest.raises(QueryError, match=message):
        QueryBuilder().eq(text, 1).build()
    with pytest.raises(QueryError, match=message):
        NumpyConverter({"x": text})


def _values(buffer: ReplayBuffer, path: str) -> dict[str, list[Any]]:
    """What every reader of a path finds in the buffer's rows, in insertion order."""
    rows = list(buffer.query())
    keys = buffer.storage.key_index()["key"]
    ids, (fetched,) = buffer.storage.fetch_columns(keys, [path])
    index = buffer.storage.key_index(columns=(path,))[path].tolist()
    batch = NumpyConverter({"v": path}, strict=False, mask=True).to_dataset_row(rows)
    pairs = zip(batch["v"].tolist(), batch["v_mask"].tolist(), strict=True)
    converted = [v if m else None for v, m in pairs]
    return {
        "python": [None if (v := read_path(r, path)) is MISSING else v for r in rows],
        "fetch": [None if v is MISSING else v for v in fetched],
        "key_index": index,
        "converter": converted,
    }


CASES = [
    # (state, actions, path, the value every reader finds in the first row)
    ({"u": "a"}, [{"n": 1}, {"n": 2}], "exp_data.actions.1.n", 2),
    ({"\u0661": 5}, [10, 20], "exp_data.actions.\u0661", None),  # a key: lists have none
    ({"\u0661": 5}, [10, 20], "exp_data.state.\u0661", 5),
    ({"0": "key"}, [10, 20], "exp_data.state.0", None),  # an index: dicts have none
    ({"01": "key"}, [10, 20], "exp_data.state.01", "key"),
    ({"url": "https://x"}, [], "state.url", "https://x"),
]


@pytest.mark.parametrize(("state", "actions", "path", "expected"), CASES)
def test_every_reader_of_a_path_finds_the_same_value(
    db_url: str, buffer_name: str, state: Any, actions: Any, path: str, expected: Any
) -> None:
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        buffer.store_batch(
            [make_row(step=0, state=state, actions=actions), make_row(step=1, state={"z": 0})]
        )
        found = _values(buffer, path)
        assert found == {reader: [expected, None] for reader in found}
        condition = QueryBuilder().is_not_null(path).build()
        assert buffer.count(condition) == (expected is not None)
        if expected is not None:
            matching = QueryBuilder().eq(path, expected).build()
            assert [r.exp_meta.step for r in buffer.query(matching)] == [0]
