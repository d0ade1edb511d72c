"""One nesting limit (MAX_DEPTH levels of lists and dicts per payload field), enforced when
a row is built and when it is stored, and every read path handles what it accepts."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from expstore import CodecError, DataRow, NumpyConverter, QueryBuilder, ReplayBuffer
from expstore.codec.checks import MAX_DEPTH
from expstore.io import export_rows, import_rows
from tests.helpers import make_row


def nest(levels: int, leaf: Any = 1.5) -> Any:
    value = leaf
    for i in range(levels):
        value = [value] if i % 2 else {"k": value}
    return value


@pytest.fixture
def buf(db_url: str, buffer_name: str) -> Iterator[ReplayBuffer]:
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        yield buffer


def test_the_limit_is_two_hundred_levels() -> None:
    assert MAX_DEPTH == 200
    make_row(state=nest(MAX_DEPTH))
    with pytest.raises(ValidationError, match="nest more than 200 levels") as info:
        make_row(state=nest(MAX_DEPTH + 1))
    assert info.value.errors()[0]["loc"] == ("state",)
    with pytest.raises(ValidationError, match="ext_info"):
        make_row(ext_info={"deep": nest(MAX_DEPTH)})  # the dict itself is one level


def test_every_read_path_handles_the_deepest_rows(buf: ReplayBuffer, tmp_path: Path) -> None:
    row = make_row(state=nest(MAX_DEPTH), messages=[{"content": nest(MAX_DEPTH - 2)}])
    buf.store(row)
    assert buf.get(row.id) == row
    assert list(buf.query()) == [row]
    assert buf.sample(batch_size=2) == [row, row]
    batch = buf.sample(None, None, NumpyConverter({"s": "exp_data.state"}), 1)
    assert json.dumps(batch["s"][0]) == json.dumps(row.exp_data.state)
    condition = QueryBuilder().eq("exp_data.state.k", 1).build()
    assert buf.count(condition) == 0 and not condition.matches(row)
    assert json.dumps(row.to_dict()["exp_data"]["state"]) == json.dumps(row.exp_data.state)
    for name in ("rows.jsonl", "rows.parquet"):
        export_rows(buf, tmp_path / name)
        with ReplayBuffer() as other:
            import_rows(other, tmp_path / name)
            assert list(other.query()) == [row]


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 600, 3000])
def test_a_row_made_deeper_after_it_was_built_is_refused_at_store(
    buf: ReplayBuffer, levels: int
) -> None:
    fine, deep = make_row(step=0), make_row(step=1)
    deep.exp_data.state = nest(levels)  # pydantic does not validate assignments
    with pytest.raises(CodecError, match="nest(ed)? .*deep"):
        buf.store_batch([fine, deep])
    assert len(buf) == 0


def test_a_row_that_contains_itself_is_refused(buf: ReplayBuffer) -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValidationError, match="contain themselves"):
        make_row(state=loop)
    row: DataRow = make_row()
    row.exp_data.state = loop
    with pytest.raises(CodecError):
        buf.store(row)
    assert len(buf) == 0
