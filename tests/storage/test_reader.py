"""Keyset pages of rows (``ReplayBuffer.page``, ``keys_after``) on both backends: every
row once, in order, both ways, under a condition, with other buffers' rows interleaved;
a cursor from elsewhere is refused."""

from __future__ import annotations

import pytest

from expstore import InvalidArgumentError, QueryBuilder, ReplayBuffer
from tests.helpers import make_row


@pytest.fixture
def two(db_url: str, buffer_name: str):  # noqa: ANN201
    with ReplayBuffer(db_url, name=buffer_name) as mine:
        with ReplayBuffer(db_url, name=buffer_name + "_other") as other:
            for i in range(25):  # the buffers' keys interleave
                mine.store(make_row(f"t{i % 3}", step=i, reward=float(i % 4)))
                other.store(make_row("o", step=i))
            yield mine, other


def walk(buffer: ReplayBuffer, **kwargs) -> list[int]:  # noqa: ANN003
    steps: list[int] = []
    cursor = None
    while True:
        page = buffer.page(after=cursor, limit=4, **kwargs)
        steps += [r.exp_meta.step for r in page.rows]
        assert len(page.keys) == len(page.rows)
        if page.next is None:
            return steps
        cursor = page.next


def test_pages_hold_every_row_once_in_order(two) -> None:  # noqa: ANN001
    mine, _ = two
    assert walk(mine) == list(range(25))
    assert walk(mine, order_by="-key") == list(range(24, -1, -1))
    rewarded = QueryBuilder().gt("reward_t", 1.5).build()
    assert walk(mine, query_condition=rewarded) == [i for i in range(25) if i % 4 > 1.5]
    by_task = walk(mine, order_by="task_id")
    assert sorted(by_task) == list(range(25)) and by_task[:3] == [0, 3, 6]


def test_keys_after_pages_without_reading_rows(two) -> None:  # noqa: ANN001
    mine, _ = two
    keys, cursor = mine.sql.keys_after(None, after=None, limit=10, order_by="key")
    rows = mine.page(limit=10)
    assert keys == rows.keys and cursor == rows.next
    more, _ = mine.sql.keys_after(None, after=cursor, limit=100, order_by="key")
    assert len(keys) + len(more) == 25 and keys[-1] < more[0]


def test_a_cursor_from_elsewhere_is_refused(two) -> None:  # noqa: ANN001
    mine, _ = two
    by_key = mine.page(limit=2).next
    with pytest.raises(InvalidArgumentError, match="page cursor"):
        mine.page(after=by_key, order_by="step")  # a key cursor for a step order
    for bad in ("garbage", "", "WyJhIl0", "W10"):
        with pytest.raises(InvalidArgumentError, match="page cursor"):
            mine.page(after=bad or "x")
    with pytest.raises(InvalidArgumentError, match="limit"):
        mine.page(limit=0)
    with pytest.raises(InvalidArgumentError, match="order_by"):
        mine.page(order_by="reward_t")


def test_a_cursor_of_the_wrong_type_for_the_order_is_refused(two) -> None:  # noqa: ANN001
    import base64
    import json

    mine, _ = two

    def cursor(position: list) -> str:  # noqa: ANN001
        return base64.urlsafe_b64encode(json.dumps(position).encode()).decode().rstrip("=")

    for order, position in [
        ("step", ["a", 1]),
        ("task_id", [1, 1]),
        ("done", [5, 1]),
        ("step", [True, 1]),
        ("key", [10**30]),
        ("step", [10**30, 1]),
    ]:
        with pytest.raises(InvalidArgumentError, match="page cursor"):
            mine.page(after=cursor(position), order_by=order)
    assert mine.page(after=cursor([3, 1]), order_by="step").rows  # a right one works
